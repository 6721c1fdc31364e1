"""Shared fixtures: models load once per test session; workers are started per test and stopped after."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from realtime_gw.models.runtime import END_OF_INPUT, StageWorker
from realtime_gw.models.types import TtsRequest

StartWorker = Callable[..., Awaitable[StageWorker]]


@pytest.fixture(scope="session")
def piper() -> Any:
    from realtime_gw.models.tts_piper import PiperTtsBackend

    backend = PiperTtsBackend()
    backend.warmup()
    return backend


@pytest.fixture(scope="session")
def asr() -> Any:
    from realtime_gw.models.asr_pocketsphinx import PocketsphinxAsrBackend

    backend = PocketsphinxAsrBackend(slots=2)
    backend.warmup()
    return backend


@pytest.fixture(scope="session")
def vad() -> Any:
    from realtime_gw.models.vad_silero import SileroVadBackend

    backend = SileroVadBackend()
    backend.warmup()
    return backend


SPEECH_TEXT = "The weather today is sunny and warm. Please turn on the kitchen lights."


@pytest.fixture(scope="session")
def speech_text() -> str:
    return SPEECH_TEXT


@pytest.fixture(scope="session")
def speech_24k(piper: Any) -> bytes:
    """Piper speech of ``SPEECH_TEXT`` as 24 kHz PCM16, made by driving the backend directly."""
    state = piper.open(TtsRequest())
    pcm = b""
    inputs: list[Any] = [SPEECH_TEXT, END_OF_INPUT]
    while True:
        result = piper.step([(state, inputs)])[0]
        inputs = []
        pcm += b"".join(f.pcm for f in result.outputs)
        if result.done:
            break
    piper.release(state)
    return pcm


@pytest.fixture
async def start_worker() -> AsyncIterator[StartWorker]:
    """``await start_worker(backend, **StageWorker kwargs)``; every worker is stopped at teardown."""
    workers: list[StageWorker] = []

    async def _start(backend: Any, **kwargs: Any) -> StageWorker:
        worker = StageWorker(backend, **kwargs)
        await worker.start(warmup=False)  # backends are warmed once by their session fixtures
        workers.append(worker)
        return worker

    yield _start
    for worker in workers:
        await worker.stop()
