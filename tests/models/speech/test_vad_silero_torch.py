"""The torch Silero VAD against the onnxruntime one (the wheel's ONNX file, the reference): the same
per-window probabilities for streams batched together that join and leave at different steps, on real
speech and on noise; slot state resets per stream; and it serves through a real StageWorker."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from realtime_gw.models.runtime import NoFreeSlot
from realtime_gw.models.speech.vad_silero_torch import TorchSileroVadBackend
from realtime_gw.protocols.audio import resample
from realtime_gw.records.voice import VadRequest
from realtime_gw.testing.audio import synthesize
from tests.models.speech.vad_streams import Scheduled, drive_alone, run_schedule, run_vad

TOLERANCE = 1e-4


def uneven_chunks(pcm: bytes, rng: np.random.Generator, pieces: int) -> list[bytes]:
    """``pcm`` cut at random sample boundaries (so windows straddle pushes), some pieces empty."""
    cuts = np.sort(rng.integers(0, len(pcm) // 2, size=pieces - 1)) * 2
    return [pcm[a:b] for a, b in zip([0, *cuts], [*cuts, len(pcm)], strict=True)]


def noise(rng: np.random.Generator, rate: int, seconds: float, level: float) -> bytes:
    return (rng.standard_normal(int(rate * seconds)) * level).clip(-32768, 32767).astype("<i2").tobytes()


@pytest.fixture(scope="module")
def streams_audio(speech_24k: bytes) -> list[bytes]:
    """16 kHz PCM16 of six streams: Piper speech at several gains and from 24 and 8 kHz sources, noise,
    speech over noise. The backends get 16 kHz, so they resample nothing: soxr's streaming output moves by
    a sample's last bit or two from run to run, which would be compared here instead of the networks."""
    rng = np.random.default_rng(3)
    other = synthesize("Could you set an alarm for seven in the morning?", 16000)
    speech = resample(speech_24k, 24000, 16000)
    quieter = (np.frombuffer(speech, "<i2") * 0.3).astype("<i2").tobytes()
    over_noise = np.frombuffer(other, "<i2") + np.frombuffer(
        noise(rng, 16000, len(other) / 32000, 300), "<i2"
    )
    return [
        speech,
        (np.frombuffer(speech, "<i2") * 1.8).clip(-32768, 32767).astype("<i2").tobytes(),
        noise(rng, 16000, 2.5, 3000),
        resample(resample(speech_24k, 24000, 8000), 8000, 16000),
        quieter + other,
        over_noise.clip(-32768, 32767).astype("<i2").tobytes() + noise(rng, 16000, 0.7, 20000),
    ]


def schedule(streams_audio: list[bytes], seed: int) -> list[Scheduled]:
    rng = np.random.default_rng(seed)
    starts = [0, 0, 2, 5, 9, 14]  # staggered: streams join while others are mid-utterance
    return [
        Scheduled(16000, uneven_chunks(pcm, rng, int(rng.integers(8, 40))), start)
        for pcm, start in zip(streams_audio, starts, strict=True)
    ]


@pytest.mark.parametrize(
    ("slots", "max_batch", "pad"),
    [
        (8, 8, False),  # every stream its own slot, one launch per round
        (4, 5, True),  # four slots for six streams (later ones wait and reuse a freed slot); rounds padded
        (4, 2, False),  # rounds wider than max_batch run in pieces
    ],
)
def test_batched_streams_match_onnxruntime(
    vad: Any, streams_audio: list[bytes], slots: int, max_batch: int, pad: bool
) -> None:
    """Each stream alone through onnxruntime vs all of them batched through torch, joining and leaving
    at different steps: the same probability for every window."""
    reference = schedule(streams_audio, seed=1)
    for stream in reference:
        run_schedule(vad, [stream])
    batched = schedule(streams_audio, seed=2)  # other cuts: a window's probability must not depend on them
    backend = TorchSileroVadBackend("cpu", slots=slots, max_batch=max_batch, pad_to_buckets=pad)
    run_schedule(backend, batched)
    assert backend.free_slots == slots
    if slots < len(batched):
        assert len({s for st in batched for s in st.slots_held}) == slots  # slots were reused
    for i, (ref, ours) in enumerate(zip(reference, batched, strict=True)):
        assert len(ref.probs) == len(ours.probs) > 40, i
        np.testing.assert_allclose(ours.probs, ref.probs, atol=TOLERANCE, rtol=0, err_msg=f"stream {i}")
    speechy, noisy = np.array(batched[0].probs), np.array(batched[2].probs)
    assert np.mean(speechy > 0.5) > 0.5 and max(noisy) < 0.5  # the streams really are speech and noise


def test_a_slot_starts_from_zero_state_for_its_next_stream(vad: Any, speech_24k: bytes) -> None:
    speech = resample(speech_24k, 24000, 16000)
    backend = TorchSileroVadBackend("cpu", slots=1, max_batch=1)
    first = backend.open(VadRequest(sample_rate=16000))
    backend.step([(first, [speech[: len(speech) // 2]])])  # mid-utterance: (h, c) far from zero
    assert float(backend.h[first.slot].abs().max()) > 0.01
    backend.release(first)  # as a cancel would, with input still buffered
    chunks = [speech[i : i + 3000] for i in range(0, len(speech), 3000)]
    ours = drive_alone(backend, chunks)
    np.testing.assert_allclose(ours, drive_alone(vad, chunks), atol=TOLERANCE, rtol=0)


def test_full_backend_refuses_until_a_slot_is_released() -> None:
    backend = TorchSileroVadBackend("cpu", slots=2, max_batch=2)
    states = [backend.open(VadRequest(sample_rate=16000)) for _ in range(2)]
    assert sorted(s.slot for s in states) == [0, 1]
    with pytest.raises(NoFreeSlot):
        backend.open(VadRequest(sample_rate=16000))
    backend.release(states[1])
    assert backend.open(VadRequest(sample_rate=16000)).slot == 1
    backend.release(states[0])
    with pytest.raises(ValueError, match="sample_rate"):
        backend.open(VadRequest(sample_rate=0))
    assert backend.free_slots == 1  # a refused open takes no slot


def test_graphs_need_bucket_padding() -> None:
    with pytest.raises(ValueError, match="pad_to_buckets"):
        TorchSileroVadBackend("cpu", cuda_graphs=True, pad_to_buckets=False)


async def test_serves_through_a_worker_like_onnxruntime(
    vad: Any, start_worker: Any, speech_24k: bytes
) -> None:
    backend = TorchSileroVadBackend("cpu", slots=4, max_batch=4)
    backend.warmup()
    ours, reference = await start_worker(backend, max_batch=4, max_active=4), await start_worker(vad)
    speech_16k, silence = resample(speech_24k, 24000, 16000), bytes(16000 * 2)
    speech, quiet, expected = await asyncio.gather(
        run_vad(ours, speech_16k, 16000), run_vad(ours, silence, 16000), run_vad(reference, speech_16k, 16000)
    )
    assert max(quiet) < 0.1
    assert max(speech) > 0.9 and np.mean(np.array(speech) > 0.5) > 0.5
    np.testing.assert_allclose(speech, expected, atol=TOLERANCE, rtol=0)
    assert ours.active_count == 0 and backend.free_slots == 4


def test_vad_device_selects_the_torch_backend() -> None:
    from realtime_gw.config import GatewayConfig
    from realtime_gw.models.registry import build_vad
    from realtime_gw.models.speech.vad_silero import SileroVadBackend

    default = build_vad(GatewayConfig(policy="none"))
    assert isinstance(default.backend, SileroVadBackend) and default.device == "cpu"
    worker = build_vad(GatewayConfig(policy="none", vad_device="cpu", vad_max_batch=16, worker_max_active=40))
    backend = worker.backend
    assert isinstance(backend, TorchSileroVadBackend) and worker.device == "cpu"
    assert (backend.slots, backend.max_batch, worker.max_batch, worker.max_active) == (40, 16, 16, 40)
    assert not backend.use_graphs  # graphs on CUDA only
