"""Semantic end of turn: pipecat's Smart Turn v3 ONNX model (BSD-2), run with onnxruntime.

The model file ships inside the ``pipecat-ai`` wheel; only the file is used (the package is found
without importing it: ``import pipecat`` configures loguru and logs a banner). The contract is that of
``pipecat.audio.turn.smart_turn.local_smart_turn_v3.LocalSmartTurnAnalyzerV3``: the last 8 s of the
turn at 16 kHz (zero-padded at the start when shorter), Whisper log-mel features (80 x 800, the
waveform normalised to zero mean and unit variance first), ``input_features [B, 80, 800]`` in,
the probability that the turn is complete ``[B, 1]`` out. The batch axis is dynamic, so every turn
waiting in a step is scored in one call.

One-shot: a ``TurnRequest`` is answered by one ``TurnScore`` in the step that opens it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from realtime_gw.config import GatewayConfig
from realtime_gw.models.contract import BackendInfo, warmup_seconds
from realtime_gw.models.families import StagePlan
from realtime_gw.models.runtime import StepResult
from realtime_gw.protocols.audio import resample
from realtime_gw.records.voice import TurnRequest, TurnScore

log = logging.getLogger(__name__)

TURN_RATE = 16000
WINDOW_SAMPLES = 8 * TURN_RATE
"""The model reads the last 8 s."""
N_FFT = 400
HOP = 160
N_MELS = 80
MODEL_FILE = "smart-turn-v3.2-cpu.onnx"
TURN_MAX_BATCH = 16
"""Pauses scored in one call (~50 ms alone, ~40 ms a turn batched on this CPU)."""


def smart_turn_onnx_path() -> Path:
    """The Smart Turn v3 ONNX file inside the installed ``pipecat`` package (found without importing it)."""
    from importlib.util import find_spec

    spec = find_spec("pipecat")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the pipecat-ai package is not installed (it ships the Smart Turn model)")
    path = (
        Path(next(iter(spec.submodule_search_locations)))
        / "audio"
        / "turn"
        / "smart_turn"
        / "data"
        / MODEL_FILE
    )
    if not path.is_file():
        raise RuntimeError(f"{MODEL_FILE} not found at {path}")
    return path


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    return np.where(
        f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) * 27.0 / np.log(6.4), 3.0 * f / 200.0
    )


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp((m - 15.0) * np.log(6.4) / 27.0), 200.0 * m / 3.0)


def _mel_filters() -> np.ndarray:
    """Slaney-normalised triangular filters, ``[N_FFT // 2 + 1, N_MELS]`` (Whisper's, as transformers
    builds them)."""
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(TURN_RATE / 2), N_MELS + 2))
    bins = np.linspace(0, TURN_RATE // 2, N_FFT // 2 + 1)
    slopes = edges[None, :] - bins[:, None]
    down = -slopes[:, :-2] / np.diff(edges)[:-1]
    up = slopes[:, 2:] / np.diff(edges)[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    return filters * (2.0 / (edges[2:] - edges[:-2]))[None, :]


_FILTERS = _mel_filters()
_HANN = np.hanning(N_FFT + 1)[:-1]  # periodic, as torch.hann_window


def log_mel(audio: np.ndarray) -> np.ndarray:
    """Whisper log-mel features of ``[B, WINDOW_SAMPLES]`` float audio at 16 kHz: ``[B, 80, 800]`` float32."""
    x = audio.astype(np.float32)
    x = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-7)
    padded = np.pad(x.astype(np.float64), ((0, 0), (N_FFT // 2, N_FFT // 2)), mode="reflect")
    frames = sliding_window_view(padded, N_FFT, axis=1)[:, ::HOP]  # [B, 801, 400]
    power = np.abs(np.fft.rfft(frames * _HANN, axis=-1)) ** 2  # [B, 801, 201]
    mel = np.log10(np.maximum(1e-10, power @ _FILTERS)).transpose(0, 2, 1)[:, :, :-1]  # [B, 80, 800]
    mel = np.maximum(mel, mel.max(axis=(1, 2), keepdims=True) - 8.0)
    return ((mel + 4.0) / 4.0).astype(np.float32)


def last_window(pcm16: bytes, sample_rate: int) -> np.ndarray:
    """The turn's last 8 s at 16 kHz as float, zero-padded at the start."""
    if len(pcm16) % 2:
        raise ValueError(f"PCM16 data must have an even number of bytes, got {len(pcm16)}")
    # Only the last 8 s (plus a little filter run-in) are resampled.
    keep = 2 * (WINDOW_SAMPLES * sample_rate // TURN_RATE + sample_rate // 10)
    pcm = resample(pcm16[-keep:], sample_rate, TURN_RATE)
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float32)[-WINDOW_SAMPLES:] / 32768.0
    return np.pad(x, (WINDOW_SAMPLES - x.size, 0))


@dataclass(eq=False)
class TurnState:
    audio: np.ndarray


class SmartTurnBackend:
    name = "turn-smart"
    warmup_report: dict[str, Any] = {}

    def __init__(self, model_path: str | Path | None = None, intra_op_threads: int = 1) -> None:
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        path = str(model_path or smart_turn_onnx_path())
        self._session = onnxruntime.InferenceSession(
            path, sess_options=opts, providers=["CPUExecutionProvider"]
        )

    def describe(self) -> BackendInfo:
        return BackendInfo(name=self.name, native_rate=TURN_RATE, warmup_report=self.warmup_report)

    def open(self, request: TurnRequest) -> TurnState:
        if request.sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {request.sample_rate}")
        return TurnState(last_window(request.pcm, request.sample_rate))

    def has_work(self, state: TurnState) -> bool:
        return True  # answered in the step that opens it

    def release(self, state: TurnState) -> None:
        pass

    def step(self, work: list[tuple[TurnState, list[Any]]]) -> list[StepResult]:
        probs = self.score(np.stack([state.audio for state, _ in work]))
        return [StepResult(outputs=[TurnScore(float(p))], done=True) for p in probs]

    def score(self, audio: np.ndarray) -> np.ndarray:
        """Probabilities that each turn in ``[B, WINDOW_SAMPLES]`` is complete."""
        (out,) = self._session.run(None, {"input_features": log_mel(audio)})
        return np.asarray(out, dtype=np.float32).reshape(-1)

    def warmup(self) -> None:
        start = time.perf_counter()
        rng = np.random.default_rng(0)
        pcm = (rng.standard_normal(TURN_RATE) * 1000).astype("<i2").tobytes()
        state = self.open(TurnRequest(pcm, TURN_RATE))
        try:
            [result] = self.step([(state, [])])
        finally:
            self.release(state)
        if not result.outputs or not 0.0 <= result.outputs[0].probability <= 1.0:
            raise RuntimeError(f"{self.name}: warm-up produced no probability")
        self.warmup_report = {"seconds": warmup_seconds(start), "probability": result.outputs[0].probability}


def from_config(config: GatewayConfig) -> StagePlan:
    """In-thread like Silero: onnxruntime releases the GIL; one batched call (~50 ms) per step."""
    return StagePlan(
        backend=SmartTurnBackend(), max_batch=TURN_MAX_BATCH, max_active=config.worker_max_active
    )
