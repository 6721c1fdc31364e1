"""Silero VAD backend: the ONNX model shipped in the ``silero-vad`` wheel, run with onnxruntime.

Only the ``.onnx`` file is used; the package's Python module is not imported (it imports torch).
The model contract mirrors ``silero_vad.utils_vad.OnnxWrapper`` at 16 kHz: each call takes
``[B, 64 + 512]`` float32 (the last 64 samples of the previous window as context, then a 512-sample
window), the LSTM state ``[2, B, 128]`` and ``sr``; it returns ``[B, 1]`` probabilities and the new
state. Rows are independent, so every stream's next window goes into one batched call.

Streams are long-lived (one per session, fed as the client's audio arrives) and finish only after
``END_OF_INPUT``. Every stream is resampled to 16 kHz, so the wheel's 8 kHz branch is never used.

``SileroVadStreams`` is what every Silero backend shares (resampling, the window FIFO, rounds of windows,
results); a backend supplies only the network call for those rounds: ``SileroVadBackend`` here
(onnxruntime, CPU), ``vad_silero_torch.TorchSileroVadBackend`` (torch, CUDA or CPU).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import Counter

from realtime_gw.models.contract import BackendInfo, warmup_seconds
from realtime_gw.models.runtime import END_OF_INPUT, StepResult
from realtime_gw.protocols.audio import StreamingResampler
from realtime_gw.records.voice import VadProbs, VadRequest

log = logging.getLogger(__name__)

VAD_RATE = 16000
WINDOW = 512
"""Samples per window at 16 kHz (32 ms)."""
CONTEXT = 64
WINDOW_MS = 1000.0 * WINDOW / VAD_RATE
MAX_WINDOWS_PER_STEP = 32
"""Windows (~1 s of audio) one stream is scored per step: a client that sends minutes of audio at
once is worked off over several steps (``has_work``) instead of one long step that every other
session's VAD waits behind."""

VAD_ROUNDS = Counter(
    "realtime_gw_vad_rounds_total",
    "VAD network calls (a round: the next window of every stream that has one, in one batch)",
    ["worker"],
)
VAD_WINDOWS = Counter("realtime_gw_vad_windows_total", "32 ms windows the VAD scored", ["worker"])


def silero_data_path(name: str) -> Path:
    """A model file inside the installed ``silero_vad`` package's ``data`` folder (found without
    importing the package)."""
    # importlib.resources.files("silero_vad") would import the package (and torch, and set torch's
    # thread count); find_spec on a top-level name only locates it.
    from importlib.util import find_spec

    spec = find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the silero-vad package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / name
    if not path.is_file():
        raise RuntimeError(f"{name} not found at {path}")
    return path


def silero_onnx_path() -> Path:
    return silero_data_path("silero_vad.onnx")


@dataclass(eq=False)
class VadState:
    request: VadRequest
    resampler: StreamingResampler
    fifo: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    """16 kHz float samples not yet scored."""
    context: np.ndarray = field(default_factory=lambda: np.zeros(CONTEXT, dtype=np.float32))
    lstm: np.ndarray = field(default_factory=lambda: np.zeros((2, 128), dtype=np.float32))
    """(h, c) of the decoder's LSTM, for backends that keep it on the host (onnxruntime)."""
    slot: int = -1
    """Row of the backend's state tensors, for backends that keep (h, c) on a device (torch)."""
    windows_done: int = 0
    ended: bool = False


Round = tuple[list[VadState], np.ndarray]
"""One round of windows: the states that take part, and their network inputs ``[n, 64 + 512]``."""


class SileroVadStreams:
    """The stage-worker backend every Silero VAD shares; subclasses implement ``run_rounds``."""

    name = "vad-silero"
    slots: int | None = None
    """Streams it holds at once (the torch backend's state rows); None: no fixed pool."""
    warmup_report: dict[str, Any] = {}

    def describe(self) -> BackendInfo:
        return BackendInfo(
            name=self.name, slots=self.slots, native_rate=VAD_RATE, warmup_report=self.warmup_report
        )

    def open(self, request: VadRequest) -> VadState:
        if request.sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {request.sample_rate}")
        return VadState(request=request, resampler=StreamingResampler(request.sample_rate, VAD_RATE))

    def has_work(self, state: VadState) -> bool:
        return state.fifo.size >= WINDOW  # a backlog past MAX_WINDOWS_PER_STEP

    def release(self, state: VadState) -> None:
        state.fifo = np.zeros(0, dtype=np.float32)

    def _feed(self, state: VadState, inputs: list[Any]) -> None:
        chunks = [state.fifo]
        for item in inputs:
            if item is END_OF_INPUT:
                state.ended = True
                chunks.append(_to_float(state.resampler.flush()))
            elif isinstance(item, (bytes, bytearray, memoryview)):
                if state.ended:
                    raise ValueError("audio pushed after END_OF_INPUT")
                chunks.append(_to_float(state.resampler.push(bytes(item))))
            else:
                raise TypeError(f"VAD input must be PCM16 bytes, got {type(item).__name__}")
        fifo = np.concatenate(chunks) if len(chunks) > 1 else state.fifo
        if state.ended and fifo.size % WINDOW:
            # Score the trailing partial window too (zero-padded, like silero's audio_forward).
            fifo = np.concatenate([fifo, np.zeros(WINDOW - fifo.size % WINDOW, dtype=np.float32)])
        state.fifo = fifo

    def step(self, work: list[tuple[VadState, list[Any]]]) -> list[StepResult]:
        errors: dict[int, str] = {}
        for i, (state, inputs) in enumerate(work):
            try:
                self._feed(state, inputs)
            except Exception as e:  # bad input fails this stream only
                errors[i] = f"{self.name}: {e}"
        live = [(i, s) for i, (s, _) in enumerate(work) if i not in errors]
        probs = self.score([s for _, s in live])
        results = []
        for i, (state, _) in enumerate(work):
            if i in errors:
                results.append(StepResult(done=True, error=errors[i]))
                continue
            p = probs.get(id(state), [])
            outputs = []
            if p:
                start = (state.windows_done - len(p)) * WINDOW_MS
                outputs.append(VadProbs(start_ms=start, window_ms=WINDOW_MS, probs=p))
            results.append(StepResult(outputs=outputs, done=state.ended and state.fifo.size < WINDOW))
        return results

    def score(self, states: list[VadState], max_rounds: int = MAX_WINDOWS_PER_STEP) -> dict[int, list[float]]:
        """Scores up to ``max_rounds`` full windows of every state. Returns probs keyed by ``id(state)``."""
        rounds = take_rounds(states, max_rounds)
        if rounds:  # windows per round: how well the worker's steps batch the streams
            VAD_ROUNDS.labels(self.name).inc(len(rounds))
            VAD_WINDOWS.labels(self.name).inc(sum(len(ready) for ready, _ in rounds))
        out: dict[int, list[float]] = {id(s): [] for s in states}
        for (ready, _), probs in zip(rounds, self.run_rounds(rounds), strict=True):
            for s, p in zip(ready, probs.tolist(), strict=True):
                out[id(s)].append(p)
        return out

    def run_rounds(self, rounds: list[Round]) -> list[np.ndarray]:
        """The network over ``rounds`` in order (round r + 1 continues round r's LSTM states): one
        ``[n]`` array of speech probabilities per round."""
        raise NotImplementedError

    def warmup(self) -> None:
        start = time.perf_counter()
        state = self.open(VadRequest(sample_rate=VAD_RATE))
        try:
            result = self.step([(state, [bytes(2 * WINDOW * 2), END_OF_INPUT])])[0]
        finally:
            self.release(state)
        if not result.outputs or len(result.outputs[0].probs) != 2:
            raise RuntimeError(f"{self.name}: warm-up produced no probabilities")
        self.warmup_report = {"seconds": warmup_seconds(start), "windows": 2}


def take_rounds(states: list[VadState], max_rounds: int) -> list[Round]:
    """Takes up to ``max_rounds`` full windows off each state's FIFO. Round r holds the r-th pending
    window of each state that still has one, so streams with more buffered audio just take part in more
    rounds; a row's input is the state's 64-sample context, then the window. The states' FIFOs, contexts
    and window counts advance here."""
    rounds: list[Round] = []
    for _ in range(max_rounds):
        ready = [s for s in states if s.fifo.size >= WINDOW]
        if not ready:
            break
        x = np.empty((len(ready), CONTEXT + WINDOW), dtype=np.float32)
        for row, s in enumerate(ready):
            x[row, :CONTEXT] = s.context
            x[row, CONTEXT:] = s.fifo[:WINDOW]
            s.context = x[row, -CONTEXT:].copy()
            s.fifo = s.fifo[WINDOW:]
            s.windows_done += 1
        rounds.append((ready, x))
    return rounds


class SileroVadBackend(SileroVadStreams):
    """The ONNX model on onnxruntime's CPU provider: one batched call per round."""

    def __init__(self, model_path: str | Path | None = None, intra_op_threads: int = 1) -> None:
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        # The model is tiny; one thread avoids contention with the other workers' threads.
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        path = str(model_path or silero_onnx_path())
        self._session = onnxruntime.InferenceSession(
            path, sess_options=opts, providers=["CPUExecutionProvider"]
        )
        self._sr = np.array(VAD_RATE, dtype=np.int64)

    def run_rounds(self, rounds: list[Round]) -> list[np.ndarray]:
        out = []
        for ready, x in rounds:
            lstm = np.stack([s.lstm for s in ready], axis=1)
            prob, new_state = self._session.run(None, {"input": x, "state": lstm, "sr": self._sr})
            for row, s in enumerate(ready):
                s.lstm = np.ascontiguousarray(new_state[:, row, :])
            out.append(prob[:, 0])
        return out


def _to_float(pcm16: bytes) -> np.ndarray:
    return np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0
