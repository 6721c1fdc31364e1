"""Codec-LM TTS (tiny config, CPU, float32): static-KV talker, streaming Mimi decoder, backend via StageWorker."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from realtime_gw.models.runtime import NoFreeSlot, WorkerFault
from realtime_gw.models.speech.codec.engine import CodecEngine, LoadedModels, load_models
from realtime_gw.models.speech.codec.mimi_stream import StreamingMimiDecoder
from realtime_gw.models.speech.codec.spec import save_codec_tts
from realtime_gw.models.speech.codec.talker import TalkerRuntime
from realtime_gw.models.speech.tts_codec import CodecTtsBackend
from realtime_gw.records.voice import FRAME_SAMPLES, TtsFrame, TtsRequest

K = 16


@pytest.fixture(scope="module")
def models() -> LoadedModels:
    return load_models("tiny", None, "cpu", torch.float32)


def _backend(models: LoadedModels, slots: int = 3, **kw: Any) -> CodecTtsBackend:
    return CodecTtsBackend(slots=slots, models=models, temperature=0.0, **kw)


def _full_decode(models: LoadedModels, codes: np.ndarray) -> np.ndarray:
    """Non-streaming reference: ``MimiModel.decode`` of all frames at once. codes ``(T, K)``."""
    with torch.no_grad():
        audio = models.mimi.decode(torch.as_tensor(codes, dtype=torch.long).T[None]).audio_values
    return audio[0, 0].numpy()


def _pcm(frames: list[TtsFrame]) -> np.ndarray:
    return np.frombuffer(b"".join(f.pcm for f in frames), dtype="<i2")


# -- talker ---------------------------------------------------------------------------------------------
def test_talker_static_kv_matches_qwen3_forward(models: LoadedModels) -> None:
    """Per-slot positions: two streams starting at different steps (and an idle slot between them)
    give, step by step, the hidden states of transformers' full ``Qwen3Model`` forward."""
    talker = models.talker
    rt = TalkerRuntime(talker, 3, temperature=0)
    hidden = rt.hidden
    g = torch.Generator().manual_seed(1)
    seqs = {0: torch.randn(9, hidden, generator=g), 2: torch.randn(9, hidden, generator=g)}
    starts = {0: 0, 2: 3}
    rt.reset(torch.arange(3))
    got: dict[int, list[torch.Tensor]] = {0: [], 2: []}
    with torch.no_grad():
        for step in range(12):
            x = torch.zeros(3, hidden)
            active = torch.zeros(3, dtype=torch.bool)
            for slot, start in starts.items():
                if 0 <= step - start < 9:
                    x[slot], active[slot] = seqs[slot][step - start], True
            h = rt.talker_hidden(3, 64, x, active)
            rt.advance(3, active)
            for slot in got:
                if active[slot]:
                    got[slot].append(h[slot])
        for slot, seq in seqs.items():
            ref = talker.model(inputs_embeds=seq[None]).last_hidden_state[0]
            assert torch.allclose(torch.stack(got[slot]), ref, atol=1e-5), slot

        # code predictor: greedy codes equal those from a full forward over the same inputs
        h = torch.randn(2, hidden, generator=g)
        code0 = torch.tensor([3, 7])
        codes, emb_sum = rt.predict_codes(h, code0)
        seq = [h, talker.model.embed_tokens(code0)]
        seq += [talker.predictor_embeds[i](codes[:, i + 1]) for i in range(K - 2)]
        full = talker.predictor(inputs_embeds=torch.stack(seq, dim=1)).last_hidden_state
        ref_codes = [code0] + [talker.predictor_heads[i](full[:, i + 1]).argmax(-1) for i in range(K - 1)]
        assert torch.equal(codes, torch.stack(ref_codes, dim=1))
        ref_sum = seq[1] + sum(talker.predictor_embeds[i](codes[:, i + 1]) for i in range(K - 1))
        assert torch.allclose(emb_sum, ref_sum, atol=1e-6)


# -- codec decoder --------------------------------------------------------------------------------------
def test_mimi_streaming_equals_full_decode(models: LoadedModels) -> None:
    """12 frames one at a time (24 positions: the 5-position sliding window's ring wraps many times)."""
    dec = StreamingMimiDecoder(models.mimi, 2, K)
    codes = np.random.default_rng(0).integers(0, models.spec.codebook_size, (12, K))
    on = torch.tensor([True])
    with torch.no_grad():
        out = np.concatenate([dec.step(1, torch.as_tensor(c)[None], on)[0].numpy() for c in codes])
    ref = _full_decode(models, codes)
    assert out.shape == ref.shape == (12 * FRAME_SAMPLES,)
    assert np.abs(out - ref).max() <= 1e-4


def test_mimi_streams_join_and_leave_without_crosstalk(models: LoadedModels) -> None:
    """Streams join and leave a batch at different steps, one reuses a freed slot; inactive rows get
    junk codes. Each stream's audio equals its solo full decode."""
    rng = np.random.default_rng(1)
    n_cb = models.spec.codebook_size
    dec = StreamingMimiDecoder(models.mimi, 3, K)
    # name: (slot, first step, frames)
    plan = {"a": (0, 0, 10), "b": (1, 2, 5), "c": (2, 4, 7), "d": (1, 8, 6)}
    codes = {n: rng.integers(0, n_cb, (f, K)) for n, (_, _, f) in plan.items()}
    audio: dict[str, list[np.ndarray]] = {n: [] for n in plan}
    with torch.no_grad():
        for step in range(14):
            batch = torch.as_tensor(rng.integers(0, n_cb, (3, K)))  # junk for inactive rows
            active = torch.zeros(3, dtype=torch.bool)
            running = {}
            for n, (slot, start, frames) in plan.items():
                if step == start:
                    dec.reset(torch.tensor([slot]))
                if start <= step < start + frames:
                    batch[slot] = torch.as_tensor(codes[n][step - start])
                    active[slot] = True
                    running[n] = slot
            out = dec.step(3, batch, active).numpy()
            for n, slot in running.items():
                audio[n].append(out[slot].copy())
    for n in plan:
        assert np.abs(np.concatenate(audio[n]) - _full_decode(models, codes[n])).max() <= 1e-4, n


def test_engine_frames_are_the_decode_of_their_codes(models: LoadedModels) -> None:
    """Talker -> decoder coupling: the PCM a slot gets is the (PCM16-rounded) decode of its codes."""
    eng = CodecEngine(models, 3, temperature=0.9)
    a, b = eng.alloc(), eng.alloc()
    got: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {a: ([], []), b: ([], [])}
    for step in range(6):
        slots = [a] if step < 2 else [a, b]
        codes, pcm = eng.step(slots, [5 + step] * len(slots))
        for j, s in enumerate(slots):
            got[s][0].append(codes[j])
            got[s][1].append(pcm[j])
    assert eng.frames[a] == 6 and eng.frames[b] == 4
    for codes_list, pcm_list in got.values():
        ref = np.clip(np.rint(_full_decode(models, np.stack(codes_list)) * 32768), -32768, 32767)
        assert np.abs(np.concatenate(pcm_list).astype(np.int32) - ref).max() <= 1
    eng.free(b)
    assert eng.alloc() == b  # lowest free slot first
    with pytest.raises(NoFreeSlot, match="no free slot"):
        eng.alloc(), eng.alloc()


# -- backend through a real StageWorker ------------------------------------------------------------------
async def test_streams_words_first_frame_early(models: LoadedModels, start_worker: Any) -> None:
    backend = _backend(models)
    w = await start_worker(backend, max_batch=3, max_active=3)
    s = w.submit(TtsRequest(voice="alloy"))
    s.push("Hello there")  # "there" may still grow: only "Hello" is released
    it = s.__aiter__()
    first = await asyncio.wait_for(it.__anext__(), 10)
    assert first.text == "Hello" and len(first.pcm) == 2 * FRAME_SAMPLES and not first.final
    s.push(" world.")
    s.close_input()
    frames = [first] + [f async for f in it]
    n_tokens = len(b"Hello there world.")  # byte tokenizer: one frame per byte, then the tail
    assert len(frames) == n_tokens + backend.tail_frames
    assert all(len(f.pcm) == 2 * FRAME_SAMPLES for f in frames)
    assert frames[-1].final and not any(f.final for f in frames[:-1])
    assert [f.text for f in frames if f.text] == ["Hello", "there", "world."]
    assert backend.engine.free_slots == 3
    assert backend.info["random_init"] is True and "noise" in backend.info["note"]


async def test_batched_streams_equal_solo_streams(models: LoadedModels, start_worker: Any) -> None:
    """Greedy decoding: a stream's audio is the same alone or sharing steps with others."""
    backend = _backend(models)
    w = await start_worker(backend, max_batch=3, max_active=3)
    texts = ["One two three.", "Short.", "A somewhat longer line of text here."]

    async def say(text: str) -> np.ndarray:
        s = w.submit(TtsRequest())
        s.push(text)
        s.close_input()
        return _pcm(await s.collect())

    solo = [await say(t) for t in texts]
    together = await asyncio.gather(*(say(t) for t in texts))
    for a, b in zip(solo, together, strict=True):
        assert len(a) == len(b) and np.abs(a.astype(np.int32) - b).max() <= 2


async def test_cancel_frees_slot(models: LoadedModels, start_worker: Any) -> None:
    backend = _backend(models, slots=2)
    w = await start_worker(backend, max_batch=2, max_active=2)
    long = [w.submit(TtsRequest()) for _ in range(2)]
    for s in long:
        s.push("word " * 100)
    for s in long:
        await asyncio.wait_for(s.__aiter__().__anext__(), 10)
    assert backend.engine.free_slots == 0
    long[0].cancel()
    for _ in range(200):
        if backend.engine.free_slots == 1 and w.active_count == 1:
            break
        await asyncio.sleep(0.01)
    assert backend.engine.free_slots == 1
    s = w.submit(TtsRequest())
    s.push("Next.")
    s.close_input()
    frames = await s.collect()
    assert frames[-1].final and len(frames) == len(b"Next.") + backend.tail_frames
    long[1].cancel()


async def test_full_worker_refuses(models: LoadedModels, start_worker: Any) -> None:
    backend = _backend(models, slots=1)
    # admission at the worker (the registry's setting: max_active = slots) refuses at submit
    w = await start_worker(backend, max_batch=1, max_active=1)
    s = w.submit(TtsRequest())
    with pytest.raises(NoFreeSlot, match="no free slot"):
        w.submit(TtsRequest())
    s.cancel()
    # a worker set to admit more than the backend's slots admits only as many (the backend's describe())
    w2 = await start_worker(_backend(models, slots=1), max_batch=2, max_active=2)
    assert w2.max_active == 1
    first = w2.submit(TtsRequest())
    with pytest.raises(NoFreeSlot, match="no free slot"):
        w2.submit(TtsRequest())
    first.cancel()


async def test_empty_and_bad_input(models: LoadedModels, start_worker: Any) -> None:
    w = await start_worker(_backend(models), max_batch=3, max_active=3)
    empty = w.submit(TtsRequest())
    empty.close_input()
    [final] = await empty.collect()
    assert final.final and final.pcm == b""
    bad, good = w.submit(TtsRequest()), w.submit(TtsRequest())
    bad.push(b"bytes")  # type: ignore[arg-type]
    good.push("Fine.")
    good.close_input()
    with pytest.raises(WorkerFault, match="must be str"):
        await bad.collect()
    assert (await good.collect())[-1].final
    with pytest.raises(WorkerFault, match="speed"):
        await w.submit(TtsRequest(speed=9.0)).collect()


# -- weights from a local directory ----------------------------------------------------------------------
async def test_weights_from_local_dir_and_eos(
    models: LoadedModels, tmp_path: Path, start_worker: Any
) -> None:
    save_codec_tts(tmp_path, models.spec, models.talker, models.mimi)
    backend = CodecTtsBackend(path=str(tmp_path), slots=1, temperature=0.0)
    assert backend.info["random_init"] is False and backend.allow_eos and "note" not in backend.info
    loaded = backend.engine.talker.talker.state_dict()
    for k, v in models.talker.state_dict().items():
        assert torch.equal(loaded[k], v), k
    codes = np.random.default_rng(2).integers(0, models.spec.codebook_size, (3, K))
    with torch.no_grad():
        mimi2 = backend.engine.decoder.mimi
        same = mimi2.decode(torch.as_tensor(codes).T[None]).audio_values
    assert np.abs(same[0, 0].numpy() - _full_decode(models, codes)).max() <= 1e-5

    # EOS (trained weights) ends the utterance with an empty final frame; only allowed once text is spoken
    step, seen = backend.engine.step, []

    def eos_when_allowed(slots: Any, tokens: Any, eos_ok: Any) -> Any:
        codes, pcm = step(slots, tokens, eos_ok)
        seen.append(list(eos_ok))
        codes[:, 0] = np.where(eos_ok, backend.spec.eos_id, codes[:, 0])
        return codes, pcm

    backend.engine.step = eos_when_allowed  # type: ignore[method-assign]
    w = await start_worker(backend, max_batch=1, max_active=1)
    s = w.submit(TtsRequest())
    s.push("Hi yo")
    s.close_input()
    frames = await s.collect()
    assert len(frames) == len(b"Hi yo") + 1 and frames[-1] == TtsFrame(pcm=b"", text="", final=True)
    assert [f.text for f in frames if f.text] == ["Hi", "yo"]
    assert seen == [[False]] * 5 + [[True]]


def test_registry_builds_codec_worker() -> None:
    from realtime_gw.config import load_config
    from realtime_gw.models.registry import build_tts

    config = load_config(env={}, overrides={"tts": "codec", "tts_config": "tiny", "tts_max_batch": 2})
    worker = build_tts(config)
    assert worker.name == "tts-codec" and worker.max_active == 2 and worker.max_batch == 2
    assert worker.backend.engine.slots == 2
