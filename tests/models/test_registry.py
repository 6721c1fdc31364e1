"""The registry's wiring: GIL-holding CPU backends in child processes unless opted out; cost bounds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from realtime_gw.config import GatewayConfig
from realtime_gw.models.process_backend import ProcessBackend
from realtime_gw.models.registry import Workers, build_tts, build_workers
from realtime_gw.models.speech.asr_base import utterance_bound
from realtime_gw.records.voice import AsrRequest, TtsRequest


def test_pocketsphinx_and_piper_run_in_child_processes_by_default() -> None:
    workers = build_workers(GatewayConfig(policy="none"))
    assert isinstance(workers.asr.backend, ProcessBackend) and workers.asr.hosted
    assert isinstance(workers.tts.backend, ProcessBackend) and workers.tts.name == "tts-piper"
    assert not workers.vad.hosted  # Silero stays on its thread
    assert workers.asr.backend.pid is None  # nothing is spawned before the worker starts


def test_in_process_opt_out_and_tone_stay_on_threads() -> None:
    config = GatewayConfig(policy="none", tts="tone", cpu_backends_in_process=True, tts_max_text_chars=123)
    tts = build_tts(config)
    assert not tts.hosted and tts.backend.max_text_chars == 123
    workers = build_workers(config)
    assert not workers.asr.hosted


def test_a_commit_longer_than_the_bound_is_refused_with_the_reason() -> None:
    admit = utterance_bound(60.0)
    one_minute = AsrRequest(pcm=b"\0\0" * 16000 * 60, sample_rate=16000)
    assert admit(one_minute) is None
    refusal = admit(AsrRequest(pcm=b"\0\0" * 24000 * 61, sample_rate=24000))
    assert refusal is not None and "61.0 s" in refusal and "asr_max_utterance_s" in refusal
    assert admit(TtsRequest()) is None  # other requests are not its business


@pytest.mark.parametrize("rate", [0, -8000])
def test_bad_rates_are_left_to_the_backend(rate: int) -> None:
    assert utterance_bound(1.0)(AsrRequest(pcm=b"\0\0" * 100, sample_rate=rate)) is None


class _Warming:
    """A worker look-alike that records which warm-ups overlap."""

    def __init__(self, device: str, log: list[tuple[str, str]]) -> None:
        self.device = device
        self.log = log
        self.name = f"{device}-{len(log)}"

    async def start(self, warmup: bool = True) -> None:
        self.log.append(("start", self.device))
        await asyncio.sleep(0.05)
        self.log.append(("end", self.device))


async def test_cuda_stages_warm_up_one_at_a_time_cpu_stages_alongside() -> None:
    log: list[tuple[str, str]] = []
    stages: list[Any] = [_Warming(d, log) for d in ("cuda", "cuda:0", "cpu", "cpu")]
    workers = Workers(tts=stages[0], asr=stages[1], vad=stages[2], all=stages)
    await workers.start()
    running, cuda_at_once, cpu_overlapped_cuda = set(), 0, False
    for i, (what, device) in enumerate(log):
        if what == "start":
            running.add((device, i))
            cuda_now = sum(d.startswith("cuda") for d, _ in running)
            cuda_at_once = max(cuda_at_once, cuda_now)
            cpu_overlapped_cuda |= cuda_now > 0 and any(d == "cpu" for d, _ in running)
        else:
            running.discard(next(r for r in running if r[0] == device))
    assert cuda_at_once == 1 and cpu_overlapped_cuda


def test_a_bad_voice_clone_stops_start_up_with_a_config_error(tmp_path: Any) -> None:
    from pathlib import Path

    from realtime_gw.config import ConfigError

    base = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_tts_tiny_base"
    missing = tmp_path / "nobody.wav"
    config = GatewayConfig(tts="qwen3", tts_path=str(base), tts_voice_clone=[f"anna={missing}"], warmup=False)
    with pytest.raises(ConfigError, match=r"--tts qwen3: .*nobody\.wav"):
        build_tts(config)
    with pytest.raises(ConfigError, match=r"expected NAME=VALUE"):
        build_tts(GatewayConfig(tts="qwen3", tts_path=str(base), tts_voice_clone=["anna"], warmup=False))
