"""Kyutai streaming ASR backend (GPU; ``--asr kyutai``): transcript text while the user speaks.

A stream (``AsrStreamRequest``) receives PCM16 chunks at its sample rate as they arrive, then
``END_OF_INPUT`` at commit. Audio is resampled to 24 kHz (soxr, state kept across chunks) and cut into
80 ms frames; every step advances every stream that has a frame by one frame, all streams in one batched
encoder + LM step on fixed slots (``kyutai/engine.py``). Outputs are ``AsrResult(text, final=False)``
whenever the transcript grows (all the text so far), then one ``AsrResult(text, final=True)``.

The text lags the audio by the model's delay, so at ``END_OF_INPUT`` the stream is flushed as the
reference's feature extractor pads it: the last partial frame filled with silence, then silence up to
``audio_delay_seconds + 1`` s after the audio (``audio_silence_prefix_seconds`` of silence also precede
it). A stream takes exactly the reference ``generate``'s steps: ``frames(prefix + audio + flush) - 1``
(its first token, at position 0, needs no audio), so it yields the same tokens (tests compare them);
``flush_s`` shortens the tail for a sooner transcript. The flush is silence after the speech: a stream
told that its audio already ends in silence (``TrailingSilence``: server VAD waited that long for the
turn's end) runs that much less of it: with the reference's flush set explicitly, audio that ends in digital
silence gives the reference's tokens for the audio before that silence. With ``flush_s`` unset, such a
stream runs at most what Kyutai's own voice service (Unmute) runs after it detects a pause: the delay in
whole frames plus one (0.64 s for the 1b model's 0.5 s), not the reference's extra second, which pads a
file's end; its tokens are then the reference's first ones.
A one-shot ``AsrRequest`` (the whole utterance as ``pcm``) runs the same way, its audio pushed at open.

Catch-up. Once its input has ended, a stream's remaining frames (queued audio, then the flush's silence)
need no client audio, so it need not wait one full-batch step per frame (at 256 streams 7 flush frames x
~18 ms). After the main batched step, up to ``catchup_steps`` sub-steps advance the ending streams alone,
one frame each, at the batch bucket of their count: batch buckets cover slots ``[0, B)``, so the ``n``
ending streams are first packed into slots ``[0, n)``, once per worker step (``engine.exchange`` swaps
whole slot rows with the talking streams or free slots there; nothing of either stream changes but its row). Why whole-frame
sub-steps and not the flush encoded in one call: the LM is autoregressive on its own text tokens
(position ``p`` reads the token predicted at ``p - 1``), so each flush frame costs one sequential LM step
whatever the encoder does; the causal Mimi encoder could take the silence frames in one call, but only
through a second, multi-frame encoder path (other shapes, other float reductions, other graphs) to save
the encoder's share of a small-batch step. The sub-steps run the very per-frame program (the same CUDA
graph per (batch, length) bucket), so the tokens are those without catch-up (the CPU tests compare them,
and with ``generate``'s; on a GPU a row's rounding may depend on its batch bucket's kernels, as it already
does when streams join or leave: the benchmark's ``direct`` rows count equal tokens there). Bounds: at most ``catchup_steps`` sub-steps per
worker step, and none started once the step (main + sub-steps so far + one more, timed by the last one)
would pass ``catchup_budget_s``, so the main cadence stays inside the 80 ms frame. When many streams end
at once the sub-steps are as large as main steps and cost what back-to-back main steps would; the win is
the usual case, a few ending among many talking. A stream with ``R`` frames left at ``END_OF_INPUT``
ends after ``ceil(R / (1 + catchup_steps))`` worker steps instead of ``R`` (when the budget allows).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from realtime_gw.config import GatewayConfig
from realtime_gw.models.families import StagePlan
from realtime_gw.models.kernels import bucket_for
from realtime_gw.models.runtime import END_OF_INPUT, StepResult
from realtime_gw.models.speech.asr_base import AsrBackendBase, noise_clip, utterance_bound
from realtime_gw.models.speech.kyutai.checkpoint import KyutaiCheckpoint, load
from realtime_gw.models.speech.kyutai.config import FRAME_SAMPLES, SAMPLE_RATE
from realtime_gw.models.speech.kyutai.engine import KyutaiAsrEngine
from realtime_gw.protocols.audio import Reframer, StreamingResampler
from realtime_gw.records.voice import AsrRequest, AsrResult, AsrStreamRequest, TrailingSilence

log = logging.getLogger(__name__)

_SILENCE = bytes(2 * FRAME_SAMPLES)


@dataclass(eq=False)
class KyutaiAsrState:
    slot: int
    resampler: StreamingResampler
    reframer: Reframer = field(default_factory=lambda: Reframer(FRAME_SAMPLES))
    frames: deque[bytes] = field(default_factory=deque)
    """Whole 24 kHz frames waiting for a step."""
    samples: int = 0
    """24 kHz samples received, silence prefix included."""
    tokens: list[int] = field(default_factory=list)
    """Every token of the stream, position 0's included (the reference ``generate``'s output)."""
    text_ids: list[int] = field(default_factory=list)
    """The tokens that are text (no padding or start id): decoded only when one arrives."""
    text: str = ""
    steps: int = 0
    silent_samples: int = 0
    """24 kHz samples of silence the audio ends with (``TrailingSilence``): counted toward the flush."""
    total_steps: int | None = None
    """Known at END_OF_INPUT: the steps the reference takes for this audio."""
    sent: str = ""
    """Transcript already sent as partials."""
    done: bool = False
    released: bool = False


class KyutaiAsrBackend(AsrBackendBase):
    name = "asr-kyutai"
    native_rate = SAMPLE_RATE

    def __init__(
        self,
        config: str = "tiny",
        path: str | None = None,
        device: str = "cpu",
        slots: int = 8,
        *,
        dtype: torch.dtype | None = None,
        cuda_graphs: bool | None = None,
        checkpoint: KyutaiCheckpoint | None = None,
        flush_s: float | None = None,
        catchup_steps: int = 0,
        catchup_budget_s: float | None = 0.05,
    ) -> None:
        """``checkpoint``: already loaded weights (tests and benchmarks share one load); else load here.
        ``flush_s``: silence after the speech at ``END_OF_INPUT`` (``TrailingSilence`` counts toward it);
        None = the reference's ``audio_delay_seconds + 1``, or after a heard silence no more than
        ``StreamTiming.pause_flush_samples``. Shorter (down to the delay) gives the transcript sooner; the
        tokens are then the reference's first ones (the LM is causal), the last words may be cut.
        ``catchup_steps`` / ``catchup_budget_s``: ending streams' catch-up (module docstring): its sub-steps
        per worker step (0 = off), and the worker step's time after which no sub-step starts (None = no
        time bound)."""
        if slots < 1:
            raise ValueError("slots must be >= 1")
        self.slots = slots
        if catchup_steps < 0 or (catchup_budget_s is not None and catchup_budget_s < 0):
            raise ValueError(
                f"catch-up needs steps >= 0, budget >= 0; got {catchup_steps}, {catchup_budget_s}"
            )
        self.catchup_steps = catchup_steps
        self.catchup_budget_s = catchup_budget_s
        self._substep_s = 0.0
        """Duration of the last catch-up sub-step: the estimate of the next one."""
        self.substeps = 0
        """Catch-up sub-steps run so far (benchmarks report them)."""
        self._holders: dict[int, KyutaiAsrState] = {}
        """The open stream in each slot (catch-up swaps streams between slots)."""
        dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
        ck = checkpoint or load(config, path, device, dtype)
        self.checkpoint = ck
        self.tokenizer = ck.tokenizer
        self.timing = ck.timing
        self.set_flush(flush_s)
        cfg = ck.model.config
        # ids that are never text: the text start and padding ids, and ids the tokenizer does not have
        self._skip = {int(cfg.bos_token_id), int(cfg.pad_token_id)}
        self._text_ids = min(int(cfg.vocab_size), int(getattr(ck.tokenizer, "vocab_size", cfg.vocab_size)))
        self.engine = KyutaiAsrEngine(ck.model, slots, cuda_graphs=cuda_graphs)
        self.info: dict[str, Any] = {
            "model": ck.description,
            "random_init": ck.random_init,
            "device": str(self.engine.device),
            "lm_dtype": str(self.engine.lm.dtype).removeprefix("torch."),
            "codec_dtype": "float32",
            "slots": slots,
            "tokenizer": ck.tokenizer.name,
            "frame_rate_hz": 12.5,
            "codebooks": self.engine.num_codebooks,
            "lm_window_frames": self.engine.lm.window,
            "audio_delay_s": self.timing.audio_delay_s,
            "flush_s": self.flush_samples / SAMPLE_RATE,
            "pause_flush_s": None if self.pause_flush_samples is None else self.pause_flush_samples / SAMPLE_RATE,
            "cuda_graphs": self.engine.use_graphs,
            "catchup": {"steps": catchup_steps, "budget_s": catchup_budget_s},
        }
        if ck.random_init:
            self.info["note"] = "random-init weights: real architecture and cost, but transcripts are noise"
            log.warning("%s: %s", self.name, self.info["note"])
        log.info("%s: %s", self.name, self.info)

    @property
    def free_slots(self) -> int:
        return self.engine.free_slots

    # -- Backend protocol ------------------------------------------------------------------------------
    def open(self, request: AsrRequest | AsrStreamRequest) -> KyutaiAsrState:
        """``AsrStreamRequest`` (audio pushed later) or ``AsrRequest`` (the whole utterance now)."""
        self.check_request(request)  # before taking the slot
        resampler = StreamingResampler(int(request.sample_rate), SAMPLE_RATE)
        pcm = request.pcm if isinstance(request, AsrRequest) else None
        state = KyutaiAsrState(slot=self.engine.alloc(), resampler=resampler)  # NoFreeSlot when full
        self._holders[state.slot] = state
        if self.timing.prefix_samples:
            self._add_audio(state, bytes(2 * self.timing.prefix_samples))
        if pcm is not None:  # a one-shot request: its audio, then the end
            self._ingest(state, [pcm, END_OF_INPUT])
        return state

    def has_work(self, state: KyutaiAsrState) -> bool:
        return not state.done and (bool(state.frames) or self._flushing(state))

    def step(self, work: list[tuple[KyutaiAsrState, list[Any]]]) -> list[StepResult]:
        start = time.perf_counter()
        results: dict[int, StepResult] = {}
        run: list[tuple[int, KyutaiAsrState]] = []
        for i, (state, inputs) in enumerate(work):
            try:
                self._ingest(state, inputs)
            except Exception as e:  # bad input fails this stream only
                state.done = True
                results[i] = self._failed(e)
                continue
            if state.done:
                results[i] = StepResult(done=True)
            elif state.total_steps == 0:  # no audio at all: nothing to transcribe
                state.done = True
                results[i] = StepResult(outputs=[AsrResult("", final=True)], done=True)
            elif state.total_steps is not None and state.steps >= state.total_steps and not state.frames:
                # A silence longer than the flush: the stream had already stepped past where it ends.
                state.done = True
                results[i] = StepResult(outputs=[AsrResult(state.text, final=True)], done=True)
            elif state.frames or self._flushing(state):
                run.append((i, state))
            else:
                results[i] = StepResult()  # waiting for audio
        self._run_frames(run, results)
        if self.catchup_steps:
            self._catch_up([(i, s) for i, s in run if self._flushing(s)], results, start)
        return [results[i] for i in range(len(work))]

    def release(self, state: KyutaiAsrState) -> None:
        if not state.released:
            state.released = True
            self._holders.pop(state.slot, None)
            self.engine.free(state.slot)

    def _warm_up(self) -> dict[str, Any]:
        """Capture every CUDA graph bucket, then one real stream: a second of low noise, end to end."""
        self.engine.capture_all()
        state = self.open(AsrRequest(pcm=noise_clip(SAMPLE_RATE), sample_rate=SAMPLE_RATE))
        steps = 0
        try:
            while not self.step([(state, [])])[0].done:
                steps += 1
        finally:
            self.release(state)
        return {"cuda_graphs": self.engine.use_graphs, "steps": steps + 1}

    # -- internals -------------------------------------------------------------------------------------
    def _run_frames(self, run: list[tuple[int, KyutaiAsrState]], results: dict[int, StepResult]) -> None:
        """One batched frame for each listed stream (its next queued frame, else flush silence); each
        stream's outputs are appended to what this worker step already gave it."""
        if not run:
            return
        frames = [s.frames.popleft() if s.frames else _SILENCE for _, s in run]
        pcm = np.frombuffer(b"".join(frames), dtype="<i2").reshape(len(run), FRAME_SAMPLES)
        tokens, _codes = self.engine.step([s.slot for _, s in run], pcm)
        for (i, state), tok in zip(run, tokens.tolist(), strict=True):
            r = self._advance(state, int(tok))
            if (before := results.get(i)) is not None:
                r = StepResult(outputs=before.outputs + r.outputs, done=r.done)
            results[i] = r

    def _catch_up(
        self, ending: list[tuple[int, KyutaiAsrState]], results: dict[int, StepResult], start: float
    ) -> None:
        """Sub-steps for this step's ending streams, packed into the lowest slots (module docstring)."""
        for k in range(self.catchup_steps):
            ending = [(i, s) for i, s in ending if not s.done]
            if not ending:
                return
            budget = self.catchup_budget_s
            if budget is not None and time.perf_counter() - start + self._substep_s > budget:
                self._substep_s *= 0.5  # a stale estimate (one slow sub-step) must not stop catch-up for good
                return
            if k == 0:  # once: streams finishing later shrink the bucket less than a swap costs
                self._pack([s for _, s in ending])
            t = time.perf_counter()
            self._run_frames(ending, results)
            self._substep_s = time.perf_counter() - t
            self.substeps += 1

    def _pack(self, ending: list[KyutaiAsrState]) -> None:
        """Move the ``n`` ending streams into slots ``[0, n)`` when that shrinks their batch bucket: each one
        above swaps with a slot below that holds no ending stream (free, or a talking stream's)."""
        n, buckets = len(ending), self.engine.batch_buckets
        if bucket_for(buckets, max(s.slot for s in ending) + 1) <= bucket_for(buckets, n):
            return
        ids = {id(s) for s in ending}
        above = [s.slot for s in ending if s.slot >= n]
        below = [t for t in range(n) if id(self._holders.get(t)) not in ids]
        pairs = list(zip(above, below, strict=True))  # as many ending streams above n as other slots below
        self.engine.exchange(pairs)
        for a, b in pairs:
            held_a, held_b = self._holders.pop(a, None), self._holders.pop(b, None)
            for slot, state in ((b, held_a), (a, held_b)):
                if state is not None:
                    state.slot = slot
                    self._holders[slot] = state

    def _add_audio(self, state: KyutaiAsrState, pcm24k: bytes) -> None:
        state.samples += len(pcm24k) // 2
        state.frames.extend(state.reframer.push(pcm24k))

    def _ingest(self, state: KyutaiAsrState, inputs: list[Any]) -> None:
        for item in inputs:
            if state.total_steps is not None:
                break  # nothing follows END_OF_INPUT
            if item is END_OF_INPUT:
                self._add_audio(state, state.resampler.flush())
                audio = state.samples - self.timing.prefix_samples
                rest = state.reframer.flush()
                if rest:  # the partial last frame, filled with silence (the flush's first samples)
                    state.frames.append(rest + bytes(2 * FRAME_SAMPLES - len(rest)))
                frames = (state.samples + self._flush(state.silent_samples)) // FRAME_SAMPLES
                state.total_steps = max(frames - 1, 0) if audio > 0 else 0
            elif isinstance(item, TrailingSilence):
                state.silent_samples = max(round(item.seconds * SAMPLE_RATE), 0)
            elif isinstance(item, (bytes, bytearray, memoryview)):
                if len(item) % 2:
                    raise ValueError(f"PCM16 chunks must have an even number of bytes, got {len(item)}")
                self._add_audio(state, state.resampler.push(bytes(item)))
            else:
                raise TypeError(f"expected PCM16 bytes, TrailingSilence or END_OF_INPUT, got {type(item).__name__}")

    def set_flush(self, flush_s: float | None) -> None:
        """``flush_s`` as the constructor takes it (benchmarks change it between runs)."""
        if flush_s is not None and flush_s < 0:
            raise ValueError(f"flush_s must be >= 0, got {flush_s}")
        self.flush_samples = self.timing.flush_samples if flush_s is None else round(flush_s * SAMPLE_RATE)
        # unset flush_s: a turn whose end was heard in silence runs no more flush than this
        self.pause_flush_samples = self.timing.pause_flush_samples if flush_s is None else None

    def _flush(self, silent: int) -> int:
        """Silence to run after audio that ends in ``silent`` samples of it (``TrailingSilence``)."""
        flush = max(self.flush_samples - silent, 0)
        if silent and self.pause_flush_samples is not None:
            flush = min(flush, self.pause_flush_samples)
        return flush

    def _flushing(self, state: KyutaiAsrState) -> bool:
        return state.total_steps is not None and state.steps < state.total_steps

    def _is_text(self, token: int) -> bool:
        return token not in self._skip and 0 <= token < self._text_ids

    def _add_token(self, state: KyutaiAsrState, token: int) -> None:
        state.tokens.append(token)
        if self._is_text(token):  # most frames carry padding: no decode then
            state.text_ids.append(token)
            state.text = self.tokenizer.decode(state.text_ids).strip()

    def _advance(self, state: KyutaiAsrState, token: int) -> StepResult:
        if not state.tokens:
            self._add_token(state, self.engine.bos_token)  # position 0's token (same for every stream)
        self._add_token(state, token)
        state.steps += 1
        text = state.text
        if state.total_steps is not None and state.steps >= state.total_steps:
            state.done = True
            return StepResult(outputs=[AsrResult(text, final=True)], done=True)
        # a partial only when the text grew; an incomplete character (U+FFFD at the end) waits
        stable = text.rstrip("\ufffd")
        if stable != state.sent and stable.startswith(state.sent):
            state.sent = stable
            return StepResult(outputs=[AsrResult(stable, final=False)])
        return StepResult()


def build_kyutai_asr(config: GatewayConfig) -> KyutaiAsrBackend:
    """The backend the gateway config asks for (``asr_config``, ``asr_path``, ``asr_device``, ``asr_max_batch``,
    ``asr_flush_s``, ``asr_catchup_*``)."""
    budget_ms = config.asr_catchup_budget_ms
    return KyutaiAsrBackend(
        config=config.asr_config,
        path=config.asr_path,
        device=config.asr_device,
        slots=config.asr_max_batch,
        flush_s=config.asr_flush_s,
        catchup_steps=config.asr_catchup_steps,
        catchup_budget_s=budget_ms / 1e3 if budget_ms > 0 else None,
    )


def from_config(config: GatewayConfig) -> StagePlan:
    """A GPU stage (in-thread, CUDA graphs): every stream holds a slot and all advance each step, so
    slots = batch = admission limit, as for the codec TTS."""
    return StagePlan(
        backend=build_kyutai_asr(config),
        device=config.asr_device,
        max_batch=config.asr_max_batch,
        max_active=config.asr_max_batch,
        admit=utterance_bound(config.asr_max_utterance_s),
    )
