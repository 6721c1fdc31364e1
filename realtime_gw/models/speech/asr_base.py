"""What every ASR backend shares (pocketsphinx, Kyutai): request checks, per-stream failure, the
warm-up's clip and report, and the description; each backend keeps its own decoding.

A backend serves two requests: ``AsrStreamRequest`` (PCM16 pushed as it comes, then ``END_OF_INPUT``;
partial ``AsrResult(final=False)`` along the way) and ``AsrRequest`` (the whole utterance up front).
Either ends with one ``AsrResult(final=True)``. Its decoders are a fixed pool of ``slots``: a full
backend refuses ``open`` with ``NoFreeSlot``. No model library is imported here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from realtime_gw.models.contract import BackendInfo, StepResult, warmup_seconds
from realtime_gw.records.voice import AsrRequest, AsrStreamRequest

log = logging.getLogger(__name__)


def check_pcm(pcm: bytes | bytearray | memoryview) -> None:
    if len(pcm) % 2:
        raise ValueError(f"PCM16 data must have an even number of bytes, got {len(pcm)}")


def noise_clip(rate: int, seconds: float = 1.0) -> bytes:
    """Low noise (PCM16 at ``rate``): what a warm-up decodes, so every part of the model runs once."""
    rng = np.random.default_rng(0)
    return (rng.standard_normal(int(rate * seconds)) * 100).astype("<i2").tobytes()


class AsrBackendBase:
    """The checks and the description every ASR backend shares; subclasses implement the Backend
    protocol's ``open``/``step``/``release``/``has_work`` and ``_warm_up``."""

    name = "asr"
    native_rate = 16000
    """The rate the model listens at (audio of other rates is resampled to it)."""
    slots = 1
    word_times = False
    """Whether a stream that asks (``AsrStreamRequest.word_times``) gets each word's times."""
    warmup_report: dict[str, Any] = {}

    @property
    def free_slots(self) -> int:
        raise NotImplementedError

    def check_request(self, request: AsrRequest | AsrStreamRequest) -> None:
        """ValueError for a request no decoder could take (checked before a slot is taken)."""
        if not isinstance(request, (AsrRequest, AsrStreamRequest)):
            raise TypeError(f"ASR needs an AsrRequest or AsrStreamRequest, got {type(request).__name__}")
        if request.sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {request.sample_rate}")
        if isinstance(request, AsrRequest):
            check_pcm(request.pcm)

    def _failed(self, e: Exception) -> StepResult:
        """One stream's failure, as that stream's result (its batch mates go on)."""
        log.warning("%s: stream failed: %s", self.name, e)
        return StepResult(done=True, error=f"{self.name}: {e}")

    def _warm_up(self) -> dict[str, Any]:
        """One real decode (every slot, or one stream end to end); returns what the report adds."""
        raise NotImplementedError

    def warmup(self) -> None:
        start = time.perf_counter()
        extra = self._warm_up()
        self.warmup_report = {"seconds": warmup_seconds(start), "slots": self.slots, **extra}

    def describe(self) -> BackendInfo:
        return BackendInfo(
            name=self.name,
            slots=self.slots,
            native_rate=self.native_rate,
            word_times=self.word_times,
            warmup_report=self.warmup_report,
        )


def utterance_bound(max_seconds: float) -> Callable[[Any], str | None]:
    """An ASR worker's ``admit``: a committed utterance longer than ``max_seconds`` is refused at submit
    (its decode would hold a core for about as long), with the reason the client sees."""

    def admit(request: Any) -> str | None:
        if not isinstance(request, AsrRequest) or request.sample_rate <= 0:
            return None  # a stream's audio is decoded as it arrives; bad rates are the backend's to refuse
        seconds = len(request.pcm) / 2 / request.sample_rate
        if seconds <= max_seconds:
            return None
        return (
            f"utterance of {seconds:.1f} s is longer than the {max_seconds:g} s the gateway transcribes "
            "(asr_max_utterance_s); commit the audio in shorter turns"
        )

    return admit
