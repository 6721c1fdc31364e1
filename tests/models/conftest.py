"""Shared fixtures: models load once per test session; workers are started per test and stopped after."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from realtime_gw.models.runtime import END_OF_INPUT, StageWorker
from realtime_gw.records.voice import TtsRequest

StartWorker = Callable[..., Awaitable[StageWorker]]


@pytest.fixture(scope="session")
def _piper_and_speech() -> tuple[Any, bytes]:
    import onnxruntime

    from realtime_gw.models.speech.tts_piper import PiperTtsBackend

    # Piper samples noise (VITS noise_scale / noise_w), so every rendition differs. A fixed seed set
    # before the session is built makes the sequence of renditions reproducible run to run.
    onnxruntime.set_seed(0)
    backend = PiperTtsBackend()
    backend.warmup()
    # Rendered first thing, so the clip does not depend on which other tests ran before.
    return backend, synthesize(backend, SPEECH_TEXT)


@pytest.fixture(scope="session")
def piper(_piper_and_speech: tuple[Any, bytes]) -> Any:
    return _piper_and_speech[0]


def synthesize(backend: Any, text: str, **request: Any) -> bytes:
    """Drive a TTS backend directly (no worker) and return the utterance as 24 kHz PCM16."""
    state = backend.open(TtsRequest(**request))
    pcm = b""
    inputs: list[Any] = [text, END_OF_INPUT]
    while True:
        result = backend.step([(state, inputs)])[0]
        inputs = []
        pcm += b"".join(f.pcm for f in result.outputs)
        if result.done:
            break
    backend.release(state)
    return pcm


@pytest.fixture(scope="session")
def asr() -> Any:
    from realtime_gw.models.speech.asr_pocketsphinx import PocketsphinxAsrBackend

    backend = PocketsphinxAsrBackend(slots=2)
    backend.warmup()
    return backend


@pytest.fixture(scope="session")
def vad() -> Any:
    from realtime_gw.models.speech.vad_silero import SileroVadBackend

    backend = SileroVadBackend()
    backend.warmup()
    return backend


SPEECH_TEXT = "The weather today is sunny and warm. Please turn on the kitchen lights."


@pytest.fixture(scope="session")
def speech_text() -> str:
    return SPEECH_TEXT


@pytest.fixture(scope="session")
def speech_24k(_piper_and_speech: tuple[Any, bytes]) -> bytes:
    """Piper speech of ``SPEECH_TEXT`` as 24 kHz PCM16 (one fixed, seeded rendition)."""
    return _piper_and_speech[1]


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
