"""The Silero VAD family's builder: onnxruntime's CPU build (``vad_silero``) by default, the torch build
(``vad_silero_torch``) on ``vad_device``. Both speak the same stream contract (``SileroVadStreams``)."""

from __future__ import annotations

from realtime_gw.config import GatewayConfig
from realtime_gw.models.families import StagePlan
from realtime_gw.models.speech.vad_silero import SileroVadBackend, SileroVadStreams

MAX_STEP_MS = 100.0
"""Longest ``vad_step_ms``: a speech onset (barge-in) or a turn's end may wait a whole step to be heard."""


def from_config(config: GatewayConfig) -> StagePlan:
    """onnxruntime's CPU build by default, in-thread: it releases the GIL while it runs, one batched call
    per 32 ms window costs ~1 ms, and a process hop on every window of every session would cost more.
    With ``vad_device`` the torch build (``vad_silero_torch``), in-thread like the other torch stages: a
    slot (h, c row) per open stream up to the worker's admission limit, a round batching up to
    ``vad_max_batch`` streams (one graph bucket each on CUDA). Either steps on a clock of ``vad_step_ms``
    (``models/lockstep.py``), every stream's windows completed since the last step in one call."""
    if not 0 <= config.vad_step_ms <= MAX_STEP_MS:  # a window waits up to a step: barge-in waits with it
        raise ValueError(f"--vad-step-ms must be 0 to {MAX_STEP_MS:g}, got {config.vad_step_ms:g}")
    if config.vad_device:
        from realtime_gw.models.speech.vad_silero_torch import TorchSileroVadBackend  # torch: only here

        silero: SileroVadStreams = TorchSileroVadBackend(
            config.vad_device, slots=config.worker_max_active, max_batch=config.vad_max_batch
        )
        device = config.vad_device
    else:
        silero, device = SileroVadBackend(), "cpu"
    return StagePlan(
        backend=silero,
        device=device,
        max_batch=config.vad_max_batch,
        max_active=config.worker_max_active,
        lockstep_ms=config.vad_step_ms or None,
        lockstep_stop_when_idle=True,
    )
