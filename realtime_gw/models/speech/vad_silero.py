"""Silero VAD backend: the ONNX model shipped in the ``silero-vad`` wheel, run with onnxruntime.

Only the ``.onnx`` file is used; the package's Python module is not imported (it imports torch).
The model contract mirrors ``silero_vad.utils_vad.OnnxWrapper`` at 16 kHz: each call takes
``[B, 64 + 512]`` float32 (the last 64 samples of the previous window as context, then a 512-sample
window), the LSTM state ``[2, B, 128]`` and ``sr``; it returns ``[B, 1]`` probabilities and the new
state. Rows are independent, so every stream's next window goes into one batched call.

Streams are long-lived (one per session, fed as the client's audio arrives) and finish only after
``END_OF_INPUT``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

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


def silero_onnx_path() -> Path:
    """The ONNX file inside the installed ``silero_vad`` package (found without importing it)."""
    # importlib.resources.files("silero_vad") would import the package (and torch); find_spec on a
    # top-level name only locates it.
    from importlib.util import find_spec

    spec = find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the silero-vad package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"
    if not path.is_file():
        raise RuntimeError(f"silero_vad.onnx not found at {path}")
    return path


@dataclass(eq=False)
class VadState:
    request: VadRequest
    resampler: StreamingResampler
    fifo: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    """16 kHz float samples not yet scored."""
    context: np.ndarray = field(default_factory=lambda: np.zeros(CONTEXT, dtype=np.float32))
    lstm: np.ndarray = field(default_factory=lambda: np.zeros((2, 128), dtype=np.float32))
    windows_done: int = 0
    ended: bool = False


class SileroVadBackend:
    name = "vad-silero"

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
        """Scores up to ``max_rounds`` full windows of every state: one batched ONNX call per round.

        Round r takes the r-th pending window of each state that still has one, so streams with
        more buffered audio just take part in more rounds. Returns probs keyed by ``id(state)``.
        """
        out: dict[int, list[float]] = {id(s): [] for s in states}
        for _ in range(max_rounds):
            ready = [s for s in states if s.fifo.size >= WINDOW]
            if not ready:
                return out
            x = np.empty((len(ready), CONTEXT + WINDOW), dtype=np.float32)
            for row, s in enumerate(ready):
                x[row, :CONTEXT] = s.context
                x[row, CONTEXT:] = s.fifo[:WINDOW]
            lstm = np.stack([s.lstm for s in ready], axis=1)
            prob, new_state = self._session.run(None, {"input": x, "state": lstm, "sr": self._sr})
            for row, s in enumerate(ready):
                s.context = x[row, -CONTEXT:].copy()
                s.lstm = np.ascontiguousarray(new_state[:, row, :])
                s.fifo = s.fifo[WINDOW:]
                s.windows_done += 1
                out[id(s)].append(float(prob[row, 0]))
        return out

    def warmup(self) -> None:
        state = self.open(VadRequest(sample_rate=VAD_RATE))
        result = self.step([(state, [bytes(2 * WINDOW * 2), END_OF_INPUT])])[0]
        if not result.outputs or len(result.outputs[0].probs) != 2:
            raise RuntimeError(f"{self.name}: warm-up produced no probabilities")
        self.release(state)


def _to_float(pcm16: bytes) -> np.ndarray:
    return np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0
