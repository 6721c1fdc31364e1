"""Silero VAD through a real StageWorker: speech vs silence, batching equivalence, timing."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from realtime_gw.models.speech.vad_silero import MAX_WINDOWS_PER_STEP, WINDOW_MS, silero_onnx_path
from realtime_gw.protocols.audio import resample
from realtime_gw.records.voice import VadRequest
from tests.models.speech.vad_streams import drain, drive_alone, run_vad


async def test_speech_high_silence_low(vad: Any, start_worker: Any, speech_24k: bytes) -> None:
    w = await start_worker(vad, max_batch=16)
    rng = np.random.default_rng(0)
    silence = bytes(24000 * 2)
    hiss = (rng.standard_normal(24000) * 30).astype("<i2").tobytes()
    speech, quiet, noise = await asyncio.gather(
        run_vad(w, speech_24k, 24000), run_vad(w, silence, 24000), run_vad(w, hiss, 24000)
    )
    assert abs(len(speech) - len(speech_24k) / 2 / 24000 * 1000 / WINDOW_MS) <= 1  # every window scored
    assert max(quiet) < 0.1 and max(noise) < 0.2
    assert max(speech) > 0.9 and np.mean(np.array(speech) > 0.5) > 0.5
    assert w.active_count == 0


async def test_other_rates(vad: Any, start_worker: Any, speech_24k: bytes) -> None:
    w = await start_worker(vad)
    for rate in (8000, 16000, 48000):
        probs = await run_vad(w, resample(speech_24k, 24000, rate), rate)
        assert np.mean(np.array(probs) > 0.5) > 0.5, rate


def test_batched_equals_per_stream(vad: Any, speech_24k: bytes) -> None:
    rng = np.random.default_rng(1)
    base = np.frombuffer(resample(speech_24k, 24000, 16000), dtype="<i2")
    # Five different streams, each cut into uneven chunks (so windows straddle pushes).
    streams = []
    for k in range(5):
        x = np.roll(base, k * 3001).astype(np.float32) * (0.3 + 0.15 * k)
        x = (x + rng.standard_normal(x.size) * 50).clip(-32768, 32767).astype("<i2").tobytes()
        cuts = np.sort(rng.integers(0, len(x) // 2, size=40)) * 2
        streams.append([x[a:b] for a, b in zip([0, *cuts], [*cuts, len(x)], strict=True)])
    alone = [drive_alone(vad, chunks) for chunks in streams]
    states = [vad.open(VadRequest(sample_rate=16000)) for _ in streams]
    batched: list[list[float]] = [[] for _ in streams]
    for i in range(41):  # step all streams together; each pushes its i-th chunk
        results = vad.step([(s, [chunks[i]]) for s, chunks in zip(states, streams, strict=True)])
        for acc, r in zip(batched, results, strict=True):
            acc += [p for out in r.outputs for p in out.probs]
    for acc, rest in zip(batched, drain(vad, states), strict=True):
        acc += rest
    for s in states:
        vad.release(s)
    for a, b in zip(alone, batched, strict=True):
        assert len(a) == len(b) > 100
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_matches_silero_reference_wrapper(vad: Any, speech_24k: bytes) -> None:
    """Same numbers as silero-vad's own OnnxWrapper (which needs torch) on the same model file."""
    torch = pytest.importorskip("torch")
    from silero_vad.utils_vad import OnnxWrapper

    pcm = resample(speech_24k, 24000, 16000)
    x = torch.from_numpy(np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0)
    ref = OnnxWrapper(str(silero_onnx_path()), force_onnx_cpu=True).audio_forward(x, 16000)[0].numpy()
    ours = drive_alone_closed(vad, pcm)
    np.testing.assert_allclose(ours, ref, atol=1e-5)


def drive_alone_closed(vad: Any, pcm: bytes) -> list[float]:
    from realtime_gw.models.runtime import END_OF_INPUT

    state = vad.open(VadRequest(sample_rate=16000))
    [r] = vad.step([(state, [pcm, END_OF_INPUT])])
    probs = [p for out in r.outputs for p in out.probs]
    while not r.done:  # a long clip is scored over several steps
        [r] = vad.step([(state, [])])
        probs += [p for out in r.outputs for p in out.probs]
    vad.release(state)
    return probs


async def test_long_lived_until_end_of_input(vad: Any, start_worker: Any) -> None:
    w = await start_worker(vad)
    s = w.submit(VadRequest(sample_rate=16000))
    it = aiter(s)

    async def next_output() -> Any:
        return await asyncio.wait_for(anext(it), 2.0)

    s.push(bytes(2 * (512 * 3 + 100)))  # three windows and a bit
    first = await next_output()
    assert first.start_ms == 0 and len(first.probs) == 3
    s.push(bytes(2 * 412))  # completes the fourth window
    second = await next_output()
    assert second.start_ms == 3 * WINDOW_MS and len(second.probs) == 1
    assert w.active_count == 1  # still open: VAD streams live as long as the session
    s.push(bytes(20))
    s.close_input()
    last = await next_output()  # the zero-padded partial window, then the stream ends
    assert len(last.probs) == 1 and last.start_ms == 4 * WINDOW_MS
    with pytest.raises(StopAsyncIteration):
        await next_output()
    assert w.active_count == 0


def test_a_long_push_is_scored_over_several_bounded_steps(vad: Any, speech_24k: bytes) -> None:
    """Minutes of audio in one append must not make one long step every session's VAD waits behind:
    a stream is scored at most MAX_WINDOWS_PER_STEP windows per step, the rest on later steps, with the
    same probabilities as without the bound."""
    pcm = resample(speech_24k, 24000, 16000) * 4
    state = vad.open(VadRequest(sample_rate=16000))
    [first] = vad.step([(state, [pcm])])
    assert len(first.outputs[0].probs) == MAX_WINDOWS_PER_STEP and not first.done
    assert vad.has_work(state)
    rest = drain(vad, [state])[0]
    vad.release(state)
    reference = vad.open(VadRequest(sample_rate=16000))
    unbounded = vad.score([reference], max_rounds=10**6)  # nothing fed yet: feed, then score all
    assert unbounded[id(reference)] == []
    vad._feed(reference, [pcm])
    expected = vad.score([reference], max_rounds=10**6)[id(reference)]
    vad.release(reference)
    assert len(expected) == len(pcm) // 2 // 512 > 2 * MAX_WINDOWS_PER_STEP
    np.testing.assert_allclose(first.outputs[0].probs + rest, expected, atol=1e-6)
