"""Kyutai streaming ASR (tiny config, CPU, float32, random init) against transformers' reference model:
the streaming Mimi encoder gives ``MimiModel.encode``'s codes, the slot-batched LM gives ``generate``'s
greedy tokens (past both sliding windows), streams sharing steps don't disturb each other, and the
backend runs through a real ``StageWorker`` (partials, final, cancel, full)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from realtime_gw.models.runtime import END_OF_INPUT, NoFreeSlot
from realtime_gw.models.speech.asr_kyutai import KyutaiAsrBackend
from realtime_gw.models.speech.kyutai.checkpoint import KyutaiCheckpoint, load, random_checkpoint
from realtime_gw.models.speech.kyutai.config import FRAME_SAMPLES, StreamTiming
from realtime_gw.models.speech.kyutai.engine import KyutaiAsrEngine
from realtime_gw.models.tokenizers import HfTokenizer
from realtime_gw.records.voice import AsrRequest, AsrResult, AsrStreamRequest, TrailingSilence
from tests.models.speech.kyutai_streams import reference_tokens, speechlike

FRAMES = 14
"""Longer than both tiny windows (LM: 6 positions; encoder transformer: 5 positions = 2.5 frames)."""


@pytest.fixture(scope="module")
def ck() -> KyutaiCheckpoint:
    return random_checkpoint("tiny", "cpu", torch.float32)


def _frames(pcm: np.ndarray) -> np.ndarray:
    return pcm.reshape(-1, FRAME_SAMPLES)


# -- the engine ----------------------------------------------------------------------------------------
def test_streaming_codes_and_tokens_equal_the_reference(ck: KyutaiCheckpoint) -> None:
    pcm = speechlike(1, FRAMES)
    eng = KyutaiAsrEngine(ck.model, 3)
    slot = eng.alloc()
    assert slot == 0
    eng.alloc()  # an idle slot below the stream's: inactive rows in the batch
    slot = eng.alloc()
    padded = np.concatenate([pcm, np.zeros(ck.timing.flush_samples, np.int16)])
    steps = len(padded) // FRAME_SAMPLES - 1
    tokens, codes = [eng.bos_token], []
    for frame in _frames(padded[: steps * FRAME_SAMPLES]):
        tok, c = eng.step([slot], frame[None])
        tokens.append(int(tok[0]))
        codes.append(c[0])
    with torch.no_grad():
        audio = torch.from_numpy(padded.astype(np.float32) / 32768)[None, None]
        ref_codes = ck.model.codec_model.encode(audio).audio_codes[0].T.numpy()
    np.testing.assert_array_equal(np.stack(codes), ref_codes[:steps])
    assert len(set(map(tuple, codes))) > steps // 2, "codes vary frame to frame"
    assert tokens == reference_tokens(ck, pcm)


def test_lm_length_buckets_equal_the_reference() -> None:
    """A window longer than the first length bucket (64): steps read only the columns written so far,
    crossing 64 -> 128, and still give ``generate``'s tokens."""
    import dataclasses

    from realtime_gw.models.speech.kyutai.checkpoint import random_model
    from realtime_gw.models.speech.kyutai.config import named_config

    named = named_config("tiny")
    named = dataclasses.replace(named, model={**named.model, "sliding_window": 130})
    ck = KyutaiCheckpoint(random_model(named, "cpu", torch.float32), None, named.timing, "", True)  # type: ignore[arg-type]
    eng = KyutaiAsrEngine(ck.model, 2)
    assert eng.len_buckets == [64, 128, 130]
    slot = eng.alloc()
    pcm = speechlike(8, 55)  # + the flush: 68 positions
    padded = np.concatenate([pcm, np.zeros(ck.timing.flush_samples, np.int16)])
    steps = len(padded) // FRAME_SAMPLES - 1
    tokens = [eng.bos_token] + [
        int(eng.step([slot], f[None])[0][0]) for f in _frames(padded[: steps * FRAME_SAMPLES])
    ]
    assert tokens == reference_tokens(ck, pcm)


def test_streams_joining_and_leaving_mid_utterance_do_not_disturb_each_other(ck: KyutaiCheckpoint) -> None:
    clips = {name: _frames(speechlike(seed, 10)) for seed, name in enumerate("abc", start=2)}
    solo = {}
    for name, frames in clips.items():
        eng = KyutaiAsrEngine(ck.model, 1)
        s = eng.alloc()
        solo[name] = [int(eng.step([s], f[None])[0][0]) for f in frames]
    eng = KyutaiAsrEngine(ck.model, 3)
    got: dict[str, list[int]] = {n: [] for n in clips}
    slots = {"a": eng.alloc()}
    for t in range(16):
        if t == 3:
            slots["b"] = eng.alloc()  # joins while a is mid-utterance
        if t == 6:
            eng.free(slots.pop("a"))  # a leaves mid-utterance (cancel); c takes its slot
            got["a"] = got["a"][:6]
            slots["c"] = eng.alloc()
        live = [(n, s) for n, s in slots.items() if len(got[n]) < len(clips[n])]
        if not live:
            break
        pcm = np.stack([clips[n][len(got[n])] for n, _ in live])
        toks, _ = eng.step([s for _, s in live], pcm)
        for (n, _), tok in zip(live, toks.tolist(), strict=True):
            got[n].append(tok)
    assert got["a"] == solo["a"][:6]
    assert got["b"] == solo["b"] and got["c"] == solo["c"]


def test_save_pretrained_directory_loads_the_same_model(ck: KyutaiCheckpoint, tmp_path: Path) -> None:
    """A transformers-saved model (the published layout) loads into the backend: same weights, same tokens."""
    from transformers import KyutaiSpeechToTextConfig, KyutaiSpeechToTextForConditionalGeneration

    from realtime_gw.models.speech.kyutai.checkpoint import randomize_codec
    from realtime_gw.models.speech.kyutai.config import named_config

    torch.manual_seed(7)
    hf = KyutaiSpeechToTextForConditionalGeneration(KyutaiSpeechToTextConfig(**named_config("tiny").model))
    randomize_codec(hf.codec_model)
    hf.save_pretrained(tmp_path)
    loaded = load("tiny", str(tmp_path), "cpu", torch.float32)
    assert not loaded.random_init and str(tmp_path) in loaded.description
    saved = hf.state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in loaded.model.state_dict().items())
    pcm = speechlike(5, 6)
    ref = KyutaiCheckpoint(hf.eval(), loaded.tokenizer, loaded.timing, "", False)
    tokens = _run(KyutaiAsrBackend(checkpoint=loaded, slots=1), pcm)[1]
    assert tokens == reference_tokens(ref, pcm)

    _save_word_tokenizer(tmp_path)  # a tokenizer next to the weights decodes the text
    backend = KyutaiAsrBackend(checkpoint=load("tiny", str(tmp_path), "cpu", torch.float32), slots=1)
    assert isinstance(backend.tokenizer, HfTokenizer)
    outputs, tokens = _run(backend, pcm)
    words = [f"w{t}" for t in tokens if 4 <= t < 259]  # 0 (the config's pad id) and 259 (start) are no text
    assert words and outputs[-1].text == " ".join(words)

    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(Exception, match="model.safetensors|weights|does not appear"):
        load("tiny", str(tmp_path), "cpu", torch.float32)


def _save_word_tokenizer(path: Path) -> None:
    """A SentencePiece-like word tokenizer over the tiny vocabulary: id i >= 4 is the word "wi"."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"\u2581w{i}": i for i in range(4, 259)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.decoder = decoders.Metaspace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(path)


# -- the backend ---------------------------------------------------------------------------------------
def _run(
    backend: KyutaiAsrBackend, pcm: np.ndarray, rate: int = 24000, chunk: int = 700, tail: tuple[Any, ...] = ()
) -> tuple[list[Any], list[int]]:
    """Drive a stream directly (no worker): PCM in odd-sized chunks, ``tail``, then END_OF_INPUT."""
    state = backend.open(AsrStreamRequest(sample_rate=rate))
    data = pcm.astype("<i2").tobytes()
    chunks = [data[i : i + 2 * chunk] for i in range(0, len(data), 2 * chunk)] + [*tail, END_OF_INPUT]
    outputs: list[Any] = []
    while True:
        result = backend.step([(state, chunks[:1])])[0]
        chunks = chunks[1:]
        outputs += result.outputs
        if result.done:
            break
    backend.release(state)
    return outputs, state.tokens


def test_stream_gives_partials_then_the_reference_transcript(ck: KyutaiCheckpoint) -> None:
    backend = KyutaiAsrBackend(checkpoint=ck, slots=2)
    cfg = ck.model.config
    pcm = speechlike(3, 9)
    outputs, tokens = _run(backend, pcm)
    assert tokens == reference_tokens(ck, pcm)
    *partials, final = outputs
    assert all(isinstance(r, AsrResult) for r in outputs)
    assert final.final and not any(r.final for r in partials)
    ids = [t for t in tokens if t not in (cfg.bos_token_id, cfg.pad_token_id)]
    assert final.text == backend.tokenizer.decode(ids).strip()
    assert len(partials) >= 2, "text arrives while the audio streams"
    for a, b in zip(partials, partials[1:], strict=False):
        assert b.text.startswith(a.text) and len(b.text) > len(a.text)
    assert final.text.startswith(partials[-1].text)
    assert backend.free_slots == 2


def test_resampled_one_shot_and_empty_requests(ck: KyutaiCheckpoint) -> None:
    backend = KyutaiAsrBackend(checkpoint=ck, slots=1)
    pcm16k = speechlike(4, 6)[: 6 * FRAME_SAMPLES * 2 // 3]  # 0.48 s at 16 kHz
    outputs, tokens = _run(backend, pcm16k, rate=16000)
    expected = (6 * FRAME_SAMPLES + ck.timing.flush_samples) // FRAME_SAMPLES  # reference's token count
    assert len(tokens) == expected and outputs[-1].final
    state = backend.open(AsrRequest(pcm=pcm16k.tobytes(), sample_rate=16000))  # one-shot: audio at open
    results = []
    while not results or not results[-1].done:
        results.append(backend.step([(state, [])])[0])
    backend.release(state)
    assert results[-1].outputs[-1].text == outputs[-1].text
    empty = backend.open(AsrStreamRequest(sample_rate=24000))
    [result] = backend.step([(empty, [END_OF_INPUT])])
    assert result.done and result.outputs == [AsrResult("", final=True)]
    backend.release(empty)
    with pytest.raises(ValueError, match="positive"):
        backend.open(AsrStreamRequest(sample_rate=0))
    assert backend.free_slots == 1


def test_shorter_flush_gives_the_reference_tokens_sooner(ck: KyutaiCheckpoint) -> None:
    pcm = speechlike(9, 8)
    ref = reference_tokens(ck, pcm)
    backend = KyutaiAsrBackend(checkpoint=ck, slots=1, flush_s=ck.timing.audio_delay_s)
    outputs, tokens = _run(backend, pcm)
    assert len(tokens) == (8 * FRAME_SAMPLES + backend.flush_samples) // FRAME_SAMPLES < len(ref)
    assert tokens == ref[: len(tokens)] and outputs[-1].final
    with pytest.raises(ValueError, match="flush_s"):
        KyutaiAsrBackend(checkpoint=ck, slots=1, flush_s=-1)


def test_trailing_silence_counts_toward_the_flush(ck: KyutaiCheckpoint) -> None:
    """A turn that ends in 0.5 s of silence, said so (``TrailingSilence``), runs the flush less that much:
    with the reference's flush, the reference's tokens for the audio before the silence, in fewer steps
    than the whole audio takes. A silence longer than the flush runs none of it: the transcript comes in
    the step that takes the end."""
    pcm = speechlike(9, 8)
    quiet = np.zeros(FRAME_SAMPLES * 25 // 4, np.int16)  # 0.5 s
    ref = reference_tokens(ck, pcm)
    reference_flush = ck.timing.flush_samples / 24000

    def run(told: float) -> tuple[list[Any], list[int]]:
        backend = KyutaiAsrBackend(checkpoint=ck, slots=1, flush_s=reference_flush)
        return _run(backend, np.concatenate([pcm, quiet]), tail=(TrailingSilence(told),) if told else ())

    told = run(0.5)
    assert told[1] == ref and told[0][-1].final
    assert len(run(0.0)[1]) == len(ref) + len(quiet) // FRAME_SAMPLES
    long_quiet = np.zeros(FRAME_SAMPLES * (ck.timing.flush_samples // FRAME_SAMPLES + 2), np.int16)  # whole frames
    audio = np.concatenate([pcm, long_quiet])
    backend = KyutaiAsrBackend(checkpoint=ck, slots=1)
    state = backend.open(AsrStreamRequest(sample_rate=24000))
    data = audio.tobytes()
    for i in range(0, len(data), 2 * FRAME_SAMPLES):  # a frame per step: the stream keeps up
        assert not backend.step([(state, [data[i : i + 2 * FRAME_SAMPLES]])])[0].done
    [last] = backend.step([(state, [TrailingSilence(len(long_quiet) / 24000), END_OF_INPUT])])
    assert last.done and last.outputs[-1].final, "no flush left to run: the transcript at once"
    assert state.tokens == reference_tokens(ck, audio)[: len(state.tokens)]
    backend.release(state)


def test_a_heard_pause_runs_unmutes_flush_by_default(ck: KyutaiCheckpoint) -> None:
    """``flush_s`` unset: after a heard silence the flush is at most the delay in whole frames plus one, as
    Kyutai's Unmute runs after a pause (8 frames for the 1b model's 0.5 s delay), not the reference's
    delay + 1 s; the tokens are the reference's first ones."""
    assert StreamTiming(audio_delay_s=0.5).pause_flush_samples == 8 * FRAME_SAMPLES
    backend = KyutaiAsrBackend(checkpoint=ck, slots=1)
    assert backend.pause_flush_samples == 3 * FRAME_SAMPLES  # tiny: 0.16 s delay -> 2 frames, plus one
    audio = np.concatenate([speechlike(9, 8), np.zeros(12000, np.int16)])
    outputs, tokens = _run(backend, audio, tail=(TrailingSilence(0.5),))
    assert len(tokens) == (len(audio) + 3 * FRAME_SAMPLES) // FRAME_SAMPLES
    assert tokens == reference_tokens(ck, audio)[: len(tokens)] and outputs[-1].final
    untold = _run(KyutaiAsrBackend(checkpoint=ck, slots=1), audio)[1]  # no heard end: the reference's flush
    assert len(untold) == (len(audio) + ck.timing.flush_samples) // FRAME_SAMPLES


def test_full_backend_refuses_and_release_frees(ck: KyutaiCheckpoint) -> None:
    backend = KyutaiAsrBackend(checkpoint=ck, slots=2)
    a, b = backend.open(AsrStreamRequest(24000)), backend.open(AsrStreamRequest(24000))
    with pytest.raises(NoFreeSlot, match="no free slot"):
        backend.open(AsrStreamRequest(24000))
    backend.release(a)
    backend.release(a)  # a second release is a no-op
    c = backend.open(AsrStreamRequest(24000))
    assert c.slot == a.slot
    for s in (b, c):
        backend.release(s)
    assert backend.free_slots == 2


async def test_worker_streams_and_cancel_frees_the_slot(ck: KyutaiCheckpoint, start_worker: Any) -> None:
    backend = KyutaiAsrBackend(checkpoint=ck, slots=2)
    w = await start_worker(backend, max_batch=2, max_active=2)
    pcm = speechlike(6, 8)
    alone = _run(KyutaiAsrBackend(checkpoint=ck, slots=1), pcm)[0][-1]
    talking, cancelled = w.submit(AsrStreamRequest(24000)), w.submit(AsrStreamRequest(24000))
    with pytest.raises(NoFreeSlot):
        w.submit(AsrStreamRequest(24000))
    data = pcm.tobytes()
    for i in range(0, len(data), 3840):
        talking.push(data[i : i + 3840])
        cancelled.push(data[i : i + 3840])
    cancelled.cancel()
    talking.close_input()
    results = await asyncio.wait_for(talking.collect(), 30)
    assert results[-1] == alone
    for _ in range(200):
        if backend.free_slots == 2 and w.active_count == 0:
            break
        await asyncio.sleep(0.01)
    assert backend.free_slots == 2
