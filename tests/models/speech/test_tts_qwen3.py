"""Qwen3-TTS (tiny checkpoint in the published layout, CPU, float32) against the reference package's outputs.

``tests/fixtures/qwen3_tts_tiny`` and ``qwen3_tts_tiny_ref.npz`` come from
``tests/fixtures/make_qwen3_tts.py`` (the ``qwen-tts`` 0.1.1 reference, random weights)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from realtime_gw.models.runtime import NoFreeSlot
from realtime_gw.models.speech.qwen3.checkpoint import Qwen3TtsCheckpoint, load_checkpoint
from realtime_gw.models.speech.qwen3.decoder import StreamingQwen3Decoder
from realtime_gw.models.speech.qwen3.engine import Qwen3Engine, build_prompt
from realtime_gw.models.speech.qwen3.talker import Sampling
from realtime_gw.models.speech.tts_qwen3 import Qwen3TtsBackend
from realtime_gw.records.voice import FRAME_SAMPLES, TtsRequest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CKPT = FIXTURES / "qwen3_tts_tiny"


@pytest.fixture(scope="module")
def ck() -> Qwen3TtsCheckpoint:
    return load_checkpoint(CKPT, "cpu", torch.float32)


@pytest.fixture(scope="module")
def ref() -> Any:
    return np.load(FIXTURES / "qwen3_tts_tiny_ref.npz")


# -- talker + code predictor ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("case", "speaker", "language", "do_sample", "seed"),
    [
        ("greedy_ryan_english", "ryan", "english", False, 0),
        ("topk_vivian_auto", "vivian", "auto", True, 1234),
        ("topk_dylan_chinese", "dylan", "chinese", True, 7),  # dialect speaker: the dialect's language id
    ],
)
def test_codes_equal_reference(
    ck: Qwen3TtsCheckpoint, ref: Any, case: str, speaker: str, language: str, do_sample: bool, seed: int
) -> None:
    """Same prompt ids, speaker, language and ``torch.manual_seed``: the reference's ``generate`` (streaming
    mode, top-k 50, T 0.9, repetition penalty 1.05, or greedy) and our engine give the same 16 codes per
    frame, and stop on the same codec EOS."""
    ids = [int(x) for x in ref["text_ids"]]
    role, text = ids[:3], ids[3:-5]
    sampling = Sampling.from_generation(ck.generation, do_sample=do_sample, sub_do_sample=do_sample)
    eng = Qwen3Engine(ck, 2, max_positions=64, sampling=sampling, cuda_graphs=False)
    slot = eng.alloc_prompt(build_prompt(ck, role, speaker, language))
    want = ref[f"codes_{case}"]
    eos = ck.talker_config["codec_eos_token_id"]
    torch.manual_seed(seed)
    got, ended = [], False
    for k in range(24):  # the reference ran max_new_tokens=24
        tok = text[k] if k < len(text) else ck.config["tts_eos_token_id" if k == len(text) else "tts_pad_token_id"]
        codes, _ = eng.step([slot], [tok], [k >= 2])
        if codes[0, 0] == eos:
            ended = True
            break
        got.append(codes[0])
    if not ended:  # the reference keeps no codes for its last codebook-0 sample (no predictor step ran)
        got = got[: len(want)]
    assert np.array_equal(np.stack(got), want)
    assert ended == (len(want) < 23)


# -- codec decoder ----------------------------------------------------------------------------------------
def test_streaming_decoder_equals_reference_full_decode(ck: Qwen3TtsCheckpoint, ref: Any) -> None:
    """Utterances of 1, 7 and 100 frames decoded one frame per step, in slots that streams join and leave
    mid-stream (a slot reused after a stream left), equal the reference decoder's full-utterance waveform."""
    dec = StreamingQwen3Decoder(ck.decoder, 3)
    codes = {n: torch.as_tensor(ref[f"decode_codes_{n}"]) for n in (1, 7, 100)}
    # (utterance, slot, first step): 7 joins at step 10 in slot 1 and leaves; 1 then reuses slot 1
    plan = [(100, 0, 0), (7, 1, 10), (1, 1, 40), (7, 2, 95)]
    audio: dict[int, list[np.ndarray]] = {i: [] for i in range(len(plan))}
    with torch.no_grad():
        for step in range(110):
            batch = torch.zeros(3, 16, dtype=torch.long)
            active = torch.zeros(3, dtype=torch.bool)
            running = {}
            for i, (n, slot, start) in enumerate(plan):
                if start <= step < start + n:
                    if step == start:
                        dec.reset(torch.tensor([slot]))
                    batch[slot], active[slot] = codes[n][step - start], True
                    running[i] = slot
            if not running:
                continue
            out = dec.step(3, batch, active).numpy()
            for i, slot in running.items():
                audio[i].append(out[slot].copy())
    for i, (n, _, _) in enumerate(plan):
        diff = np.abs(np.concatenate(audio[i]) - ref[f"decode_wav_{n}"]).max()
        assert diff <= 1e-4, (n, diff)


# -- the backend ------------------------------------------------------------------------------------------
def _backend(ck: Qwen3TtsCheckpoint, slots: int = 2, **kw: Any) -> Qwen3TtsBackend:
    return Qwen3TtsBackend(
        checkpoint=ck, slots=slots, max_positions=96, cuda_graphs=False, max_frames_per_token=2, **kw
    )


def test_voices_and_languages(ck: Qwen3TtsCheckpoint) -> None:
    b = _backend(ck)
    assert b.voices == ("dylan", "ryan", "vivian") and b.default_voice == "vivian"
    assert b.resolve_voice("Ryan") == "ryan" and b.resolve_voice("ash") == "ryan"
    assert b.resolve_voice("alloy") == "vivian" and b.resolve_voice("nova") == "vivian"  # sohee: absent
    assert b.resolve_voice("default") == "vivian"
    with pytest.raises(ValueError, match="unknown voice"):
        b.resolve_voice("nobody")
    with pytest.raises(ValueError, match="unknown language"):
        _backend(ck, language="klingon")
    assert b.role_ids == [int(x) for x in np.load(FIXTURES / "qwen3_tts_tiny_ref.npz")["text_ids"][:3]]


async def test_streams_text_while_speaking(ck: Qwen3TtsCheckpoint, start_worker: Any) -> None:
    backend = _backend(ck, sampling=Sampling(do_sample=False, sub_do_sample=False))
    w = await start_worker(backend, max_batch=2, max_active=2)
    s = w.submit(TtsRequest(voice="ryan"))
    s.push("Hello there")  # only "Hello" is released until whitespace follows "there"
    it = s.__aiter__()
    first = await asyncio.wait_for(it.__anext__(), 10)
    assert first.text == "Hello" and len(first.pcm) == 2 * FRAME_SAMPLES and not first.final
    s.push(" world.")
    s.close_input()
    frames = [first] + [f async for f in it]
    assert frames[-1].final and not any(f.final for f in frames[:-1])
    assert all(len(f.pcm) == 2 * FRAME_SAMPLES for f in frames[:-1])
    assert [f.text for f in frames if f.text] == ["Hello", "there", "world."]
    assert backend.engine.free_slots == 2
    # a full backend refuses at open
    held = [backend.open(TtsRequest()) for _ in range(2)]
    with pytest.raises(NoFreeSlot):
        backend.open(TtsRequest())
    for st in held:
        backend.release(st)


async def test_batched_equals_solo(ck: Qwen3TtsCheckpoint, start_worker: Any) -> None:
    backend = _backend(ck, slots=3, sampling=Sampling(do_sample=False, sub_do_sample=False))
    w = await start_worker(backend, max_batch=3, max_active=3)

    async def say(text: str, voice: str) -> bytes:
        s = w.submit(TtsRequest(voice=voice))
        s.push(text)
        s.close_input()
        return b"".join(f.pcm for f in await s.collect())

    jobs = [("One two three.", "ryan"), ("Short.", "dylan"), ("A longer line.", "vivian")]
    solo = [await say(t, v) for t, v in jobs]
    together = await asyncio.gather(*(say(t, v) for t, v in jobs))
    for a, b in zip(solo, together, strict=True):
        x, y = np.frombuffer(a, "<i2").astype(np.int32), np.frombuffer(b, "<i2").astype(np.int32)
        assert len(x) == len(y) and len(x) > 0 and np.abs(x - y).max() <= 2


def test_registry_builds_qwen3_worker() -> None:
    from realtime_gw.config import load_config
    from realtime_gw.models.registry import build_tts

    config = load_config(env={}, overrides={"tts": "qwen3", "tts_path": str(CKPT), "tts_max_batch": 2})
    worker = build_tts(config)
    assert worker.name == "tts-qwen3" and worker.max_active == 2 and worker.max_batch == 2
    assert worker.backend.engine.slots == 2 and worker.backend.info["random_init"] is False
