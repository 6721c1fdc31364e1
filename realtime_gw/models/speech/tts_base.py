"""What every TTS backend here shares: voice names, the speed check, text input, sentence streaming.

A TTS stream receives text pieces over time (``Stream.push(str)``) and ``END_OF_INPUT`` at the end;
audio leaves as 24 kHz PCM16 ``TtsFrame`` deltas of exactly ``FRAME_SAMPLES`` samples, and only the
final frame (``final=True``) may be shorter, or empty.

- ``TtsBackendBase``: the checks every backend makes the same way (voice, speed, input items) and the
  offline ``synthesize`` loop; the codec LM (``tts_codec``) builds on it directly.
- ``SentenceTtsBackend``: one sentence per stream per step (iteration-level batching: a long answer
  cannot starve a short one); Piper and the tone backend implement only ``_synthesize``.

No model library is imported here, so a backend can reuse this without loading another's weights.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from realtime_gw.models.contract import BackendInfo, warmup_seconds
from realtime_gw.models.runtime import END_OF_INPUT, StepResult
from realtime_gw.models.speech.streaming.frame_engine import FrameEngine
from realtime_gw.protocols.audio import SPEED_ERROR, Reframer, StreamingResampler, speed_in_range
from realtime_gw.protocols.text import MAX_SENTENCE_CHARS as MAX_SENTENCE_CHARS
from realtime_gw.protocols.text import SentenceBuffer as SentenceBuffer
from realtime_gw.protocols.text import TextTooLong as TextTooLong
from realtime_gw.records.voice import FRAME_SAMPLES, OUTPUT_RATE, TtsFrame, TtsRequest

log = logging.getLogger(__name__)

S = TypeVar("S")

OPENAI_VOICES = frozenset(
    {
        "alloy",
        "ash",
        "ballad",
        "cedar",
        "coral",
        "echo",
        "fable",
        "marin",
        "nova",
        "onyx",
        "sage",
        "shimmer",
        "verse",
    }
)
"""OpenAI voice names; clients send them, so they map onto the backend's default voice."""


class TextSink(Protocol):
    """Where a stream's text goes: ``SentenceBuffer`` here, the codec's word-level ``TextFeed``."""

    def feed(self, text: str) -> None: ...

    def end(self) -> None: ...


def check_speed(speed: float) -> float:
    """The request's speed as a float; ValueError outside the OpenAI range (NaN included)."""
    value = float(speed)
    if not speed_in_range(value):
        raise ValueError(f"{SPEED_ERROR}, got {speed}")
    return value


def feed_inputs(text: TextSink, inputs: list[Any]) -> None:
    """Hand a step's input items to the stream's text: strings, then ``END_OF_INPUT``; nothing else."""
    for item in inputs:
        if item is END_OF_INPUT:
            text.end()
        elif isinstance(item, str):
            text.feed(item)
        else:
            raise TypeError(f"TTS input must be str, got {type(item).__name__}")


class FrameAssembler:
    """One utterance's audio path: native-rate PCM16 -> 24 kHz -> exact frames, with sentence marks.

    One streaming resampler per utterance (not per sentence) keeps the waveform continuous across
    sentence boundaries, so there is no click where two sentences meet. Sentence texts are attached
    by output sample position, so a sentence's text rides on the frame where its audio really starts,
    even when that audio first leaves the reframer in a later step.
    """

    def __init__(self, native_rate: int) -> None:
        self.native_rate = native_rate
        self._resampler = StreamingResampler(native_rate, OUTPUT_RATE)
        self._reframer = Reframer(FRAME_SAMPLES)
        self._in_samples = 0
        self._frames_out = 0
        self._marks: deque[tuple[int, str]] = deque()

    def add(self, text: str, pcm16: bytes) -> list[TtsFrame]:
        """Queue one sentence's audio (may be empty) and return the frames now complete."""
        self._marks.append((self._in_samples * OUTPUT_RATE // self.native_rate, text))
        self._in_samples += len(pcm16) // 2
        return self._frames(self._reframer.push(self._resampler.push(pcm16)))

    def finish(self) -> list[TtsFrame]:
        """Drain resampler and reframer; the last frame is ``final`` (short, maybe empty)."""
        frames = self._frames(self._reframer.push(self._resampler.flush()))
        tail = self._reframer.flush()
        texts = [t for _, t in self._marks]
        self._marks.clear()
        frames.append(TtsFrame(pcm=tail, text=" ".join(texts), final=True))
        return frames

    def _frames(self, pcms: list[bytes]) -> list[TtsFrame]:
        out = []
        for pcm in pcms:
            self._frames_out += 1
            end = self._frames_out * FRAME_SAMPLES
            texts = []
            while self._marks and self._marks[0][0] < end:
                texts.append(self._marks.popleft()[1])
            out.append(TtsFrame(pcm=pcm, text=" ".join(texts)))
        return out


@dataclass(eq=False)
class TtsState:
    request: TtsRequest
    voice: str
    length_scale: float
    text: SentenceBuffer = field(default_factory=SentenceBuffer)
    audio: FrameAssembler | None = None
    extra: Any = None
    """Backend-specific per-stream data (e.g. the tone backend's oscillator phase)."""


class TtsBackendBase(Generic[S]):
    """The checks and loops every TTS backend shares; subclasses implement the Backend protocol."""

    name = "tts"
    native_rate = OUTPUT_RATE
    voices: tuple[str, ...] = ("default",)
    default_voice = "default"
    """What "default" and OpenAI's voice names map to."""
    voice_kinds: tuple[str, ...] = ()
    """Custom voices it makes at run time (``custom_voices``); none unless it says so."""
    max_text_chars: int | None = None
    """Text one stream may receive in all; more fails that stream (``TextTooLong``). The registry sets
    it from ``tts_max_text_chars``."""
    slots: int | None = None
    """Streams it holds at once (the frame backends' device slots); None: no fixed pool."""
    warmup_report: dict[str, Any] = {}

    def describe(self) -> BackendInfo:
        return BackendInfo(
            name=self.name,
            slots=self.slots,
            voices=tuple(self.voices),
            default_voice=self.default_voice,
            voice_kinds=self.voice_kinds,
            native_rate=self.native_rate,
            output_rate=OUTPUT_RATE,
            frame_samples=FRAME_SAMPLES,
            warmup_report=self.warmup_report,
        )

    # -- Backend protocol (subclasses) -----------------------------------------------------------------
    def open(self, request: TtsRequest) -> S:
        raise NotImplementedError

    def step(self, work: list[tuple[S, list[Any]]]) -> list[StepResult]:
        raise NotImplementedError

    def release(self, state: S) -> None:
        raise NotImplementedError

    # -- shared checks ---------------------------------------------------------------------------------
    def resolve_voice(self, voice: str) -> str:
        if voice in self.voices:
            return voice
        if voice == "default" or voice in OPENAI_VOICES:
            return self.default_voice
        available = sorted({*self.voices, "default", *OPENAI_VOICES})
        raise ValueError(f"unknown voice {voice!r}; available voices: {', '.join(available)}")

    def check_request(self, request: TtsRequest) -> tuple[str, float]:
        """``(voice, speed)`` of a request, or ValueError; speed first, as clients see it today."""
        if not isinstance(request, TtsRequest):  # a custom voice record (``custom_voices``)
            raise ValueError(f"this TTS model makes no custom voices (got {type(request).__name__})")
        speed = check_speed(request.speed)
        return self.resolve_voice(request.voice), speed

    def _failed(self, e: Exception) -> StepResult:
        """One stream's failure, as that stream's result (its batch mates go on)."""
        log.warning("%s: stream failed: %s", self.name, e)
        return StepResult(done=True, error=f"{self.name}: {e}")

    # -- offline use -----------------------------------------------------------------------------------
    def synthesize(self, text: str, request: TtsRequest | None = None) -> bytes:
        """A whole utterance at once (offline use: tests, tools, warm-up), through the same streaming
        path the worker drives: 24 kHz PCM16."""
        state = self.open(request or TtsRequest())
        inputs: list[Any] = [text, END_OF_INPUT]
        pcm = bytearray()
        try:
            while True:
                (result,) = self.step([(state, inputs)])
                inputs = []
                pcm += b"".join(f.pcm for f in result.outputs)
                if result.done or result.error is not None:
                    break
        finally:
            self.release(state)
        return bytes(pcm)


class SentenceTtsBackend(TtsBackendBase[TtsState]):
    """Sentence-at-a-time backends (Piper, tone); subclasses implement ``_synthesize``."""

    def __init__(self, voice: str) -> None:
        if voice not in self.voices:
            raise ValueError(f"unknown voice {voice!r}; available voices: {', '.join(self.voices)}")
        self.default_voice = voice

    # -- subclass hook ---------------------------------------------------------------------------------
    def _synthesize(self, state: TtsState, sentence: str) -> bytes:
        """One sentence -> PCM16 at ``native_rate`` (may be empty)."""
        raise NotImplementedError

    # -- Backend protocol ------------------------------------------------------------------------------
    def open(self, request: TtsRequest) -> TtsState:
        voice, speed = self.check_request(request)
        state = TtsState(request=request, voice=voice, length_scale=1.0 / speed)
        state.text = SentenceBuffer(max_text_chars=self.max_text_chars)
        state.audio = FrameAssembler(self.native_rate)
        return state

    def has_work(self, state: TtsState) -> bool:
        return state.text.ready

    def release(self, state: TtsState) -> None:
        state.audio = None  # drop filter state and buffered audio; nothing device-side to free

    def step(self, work: list[tuple[TtsState, list[Any]]]) -> list[StepResult]:
        # Per-stream isolation: bad input or a synthesis error fails that stream, not its batch mates.
        results = []
        for state, inputs in work:
            try:
                results.append(self._advance(state, inputs))
            except Exception as e:
                results.append(self._failed(e))
        return results

    def _advance(self, state: TtsState, inputs: list[Any]) -> StepResult:
        assert state.audio is not None, "step on a released state"
        feed_inputs(state.text, inputs)
        frames: list[TtsFrame] = []
        if state.text.sentences:  # one sentence per stream per step
            sentence = state.text.sentences.popleft()
            frames += state.audio.add(sentence, self._synthesize(state, sentence))
        if state.text.ended and not state.text.sentences:
            frames += state.audio.finish()
            return StepResult(outputs=frames, done=True)
        return StepResult(outputs=frames)

    def warmup(self) -> None:
        start = time.perf_counter()
        state = self.open(TtsRequest())
        try:
            state.text.feed("Warming up.")
            state.text.end()
            result = self._advance(state, [])
        finally:
            self.release(state)
        samples = sum(len(f.pcm) // 2 for f in result.outputs)
        if not result.done or not samples:
            raise RuntimeError(f"{self.name}: warm-up produced no audio")
        self.warmup_report = {"seconds": warmup_seconds(start), "audio_ms": samples * 1000 // OUTPUT_RATE}


class FrameTtsLoop:
    """The frame-per-step loop of the codec-LM backends (Mimi LM, Qwen3-TTS): every live stream with a
    token to say (or its tail) advances one 80 ms frame per step, all in one ``engine.step``. A backend
    says only which token a stream feeds next (``_next_token``) and turns codes into frames (``_emit``).

    With a pipelined engine (``engine.pipelined``: a frame's decoder runs behind the next frame's talker)
    a frame's codes wait on the stream's state (``state.flight``) until its PCM is decoded, one step
    later, and ``_emit`` then sees both; a stream with a frame in flight has work until it is out. A
    stream's first frame is waited for in its own step (first audio after one talker step and one
    decoder step; that step loses the overlap)."""

    engine: FrameEngine
    name: str

    def _next_token(self, state: Any) -> tuple[int, bool]:
        """(token to feed, whether EOS may end the utterance this frame); pops the token it feeds."""
        raise NotImplementedError

    def _emit(self, state: Any, codes: Any, pcm: Any, spoken: int) -> StepResult:
        """One frame out: its codes, PCM16 and how many text tokens had been fed when it was made."""
        raise NotImplementedError

    def has_work(self, state: Any) -> bool:
        if state.flight is not None:
            return True
        return not state.done and (bool(state.text.tokens) or state.text.ended)

    def release(self, state: Any) -> None:
        if not state.released:
            state.released = True
            state.flight = None
            self.engine.free(state.slot)

    def step(self, work: list[tuple[Any, list[Any]]]) -> list[StepResult]:
        results: list[StepResult | None] = [None] * len(work)
        go: list[int] = []
        for i, (state, inputs) in enumerate(work):
            try:
                feed_inputs(state.text, inputs)
            except Exception as e:  # bad input fails this stream only
                results[i] = self._failed(e)  # type: ignore[attr-defined]
                continue
            text = state.text
            if state.done:
                results[i] = StepResult(done=True)
            elif state.flight is not None and self.engine.frames[state.slot] >= self.engine.max_positions:
                pass  # its last possible frame is in flight: that frame ends it
            elif text.ended and text.queued == 0 and state.flight is None:  # nothing to say: empty final
                state.done = True
                results[i] = StepResult(outputs=[TtsFrame(pcm=b"", final=True)], done=True)
            elif text.tokens or text.ended:
                go.append(i)
            elif state.flight is None:
                results[i] = StepResult()  # waiting for a complete word
        states = [work[i][0] for i in go]
        fed = [self._next_token(st) for st in states]
        slots, tokens, eos_ok = [st.slot for st in states], [t for t, _ in fed], [ok for _, ok in fed]
        if not self.engine.pipelined:
            if go:
                codes, pcm = self.engine.step(slots, tokens, eos_ok)
                for j, i in enumerate(go):
                    results[i] = self._emit(states[j], codes[j], pcm[j], states[j].spoken)
            return [r if r is not None else StepResult() for r in results]
        landed = [
            (i, st.flight) for i, (st, _) in enumerate(work) if st.flight is not None and results[i] is None
        ]
        starting = [j for j, st in enumerate(states) if st.frames == 0 and st.flight is None]
        if go:
            codes = self.engine.launch(slots, tokens, eos_ok)  # the frames in flight land in its course
        for j, st in enumerate(states):
            st.flight = (codes[j], st.spoken)
        if starting or (landed and not go):  # launch itself lands the frames in flight before it
            self.engine.flush()
        # a stream's first audio waits for one talker step and its decoding, not for the next step
        landed += [(go[j], states[j].flight) for j in starting]
        for i, flight in landed:
            state = work[i][0]
            pcm = self.engine.take(state.slot)
            if state.flight is flight:  # not relaunched this step (or its first frame, taken at once)
                state.flight = None
            frame_codes, spoken = flight
            results[i] = self._emit(state, frame_codes, pcm, spoken)
            if results[i].done:  # type: ignore[union-attr]
                state.flight = None  # the frame launched after its last one is dropped
        return [r if r is not None else StepResult() for r in results]

    def warmup(self) -> None:
        start = time.perf_counter()
        seconds = self.engine.capture_all()
        if seconds:
            log.info("%s: captured %d CUDA graphs in %.1f s", self.name, self.engine.graph_count, seconds)
        # ends within the slot length: each backend caps an utterance at its slot's frames
        pcm = self.synthesize("Warming up.")  # type: ignore[attr-defined]
        if not pcm:
            raise RuntimeError(f"{self.name}: warm-up produced no audio")
        self.warmup_report = {
            "seconds": warmup_seconds(start),
            "audio_ms": len(pcm) // 2 * 1000 // OUTPUT_RATE,
            "cuda_graphs": self.engine.graph_count,
        }


def request_check(backend: TtsBackendBase[Any]) -> Callable[[TtsRequest], str | None]:
    """A TTS worker's ``admit``: the backend's own ``check_request`` (voice, speed, and what its model
    limits, e.g. Qwen3's instruction tokens) run at submit, so a bad request is refused before it takes
    a slot, with the reason the client sees (HTTP 400 on ``/v1/audio/speech``)."""

    def admit(request: TtsRequest) -> str | None:
        try:
            backend.check_request(request)
        except ValueError as e:
            return f"{backend.name}: {e}"
        return None

    return admit
