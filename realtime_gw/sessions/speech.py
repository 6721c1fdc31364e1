"""The speech stream's session (``WS /v1/audio/speech/stream``): ``handle(event) -> list[effect]``, pure.

Text in, 80 ms PCM16 frames out, one utterance at a time. An utterance grows while it is spoken, but a
TTS slot is held only while text is being synthesized: text waits here until it holds complete
sentences (``protocols/text.segment_end``) or ``input.done`` came, then that segment is spoken by its
own TTS stream (``Speak``); the next segment starts when that one ended. An idle stream, or one
waiting for the rest of a sentence, holds no slot. Segments' audio is reframed here, so every frame
but an utterance's last is 80 ms, and ``audio.done`` counts what was sent.

The transport (``server/speech_stream.py``) moves bytes and runs the effects: it hands in decoded
client events (a frame it cannot take comes as ``StreamError``), each segment's audio and its end
(``SegmentAudio``, ``SegmentEnded`` / ``SegmentFailed`` / ``SegmentRefused``) and the end of the
stream's lifetime (``Expired``). It reads the socket only while ``takes_text`` (and its outbox has
room): text waiting to be spoken is bounded by ``max_pending_chars``, and while an utterance finishes
(``input.done`` came) the next one waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from realtime_gw.protocols import speech as sp
from realtime_gw.protocols.audio import SPEED_ERROR, Reframer, speed_in_range
from realtime_gw.protocols.text import MAX_SENTENCE_CHARS, segment_end
from realtime_gw.records.voice import OUTPUT_RATE, TtsRequest


@dataclass(frozen=True, slots=True)
class SpeechLimits:
    voices: frozenset[str]
    """The voice names ``session.config`` may choose."""
    max_pending_chars: int = 16 * 1024
    """Text waiting to be spoken; one ``input.text`` longer than this is refused."""
    max_utterance_chars: int = 256 * 1024


# -- events (besides the client's sp.StreamClientEvent and sp.StreamError) ------------------------------
@dataclass(frozen=True, slots=True)
class SegmentAudio:
    segment: int
    pcm: bytes
    """24 kHz PCM16 of any length (reframed here)."""


@dataclass(frozen=True, slots=True)
class SegmentEnded:
    """The segment's TTS stream spoke all of it."""

    segment: int


@dataclass(frozen=True, slots=True)
class SegmentFailed:
    """The segment's TTS stream failed (a worker fault): the utterance goes on without the rest of it."""

    segment: int
    reason: str


@dataclass(frozen=True, slots=True)
class SegmentRefused:
    """No TTS slot was free for the segment: it is skipped, the utterance goes on."""

    segment: int
    reason: str


@dataclass(frozen=True, slots=True)
class Expired:
    """The stream was idle too long or reached its maximum duration (``why`` says which)."""

    why: str


SpeechEvent = (
    sp.SessionConfig
    | sp.InputText
    | sp.InputDone
    | sp.StreamError
    | SegmentAudio
    | SegmentEnded
    | SegmentFailed
    | SegmentRefused
    | Expired
)


# -- effects ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Send:
    item: sp.StreamEvent | bytes
    audio: bool = False
    """Part of an utterance's output (frames, its errors, ``audio.done``), in order; its producer waits
    for room in the outbox. Otherwise a reply, queued at once."""


@dataclass(frozen=True, slots=True)
class Speak:
    """Open a TTS stream for ``request``, give it ``text`` and end its input; report its audio and its
    end as ``SegmentAudio`` then ``SegmentEnded`` / ``SegmentFailed`` / ``SegmentRefused``."""

    segment: int
    text: str
    request: TtsRequest


@dataclass(frozen=True, slots=True)
class Close:
    """Send what is queued, then close the socket (a reason given earlier, e.g. by a limit, stands)."""

    code: int
    reason: str


SpeechEffect = Send | Speak | Close


@dataclass(slots=True)
class _Utterance:
    number: int
    text: list[str] = field(default_factory=list)
    """Its pieces, joined once at ``audio.done``."""
    chars: int = 0
    pending: str = ""
    """Text not yet handed to a TTS stream."""
    scanned: int = 0
    """How much of ``pending`` is known to hold no sentence end."""
    done: bool = False
    """``input.done`` came: speak the rest, then end the utterance."""
    reframer: Reframer = field(default_factory=Reframer)
    frames: int = 0
    samples: int = 0


class SpeechSession:
    def __init__(self, limits: SpeechLimits) -> None:
        self.limits = limits
        self.config = sp.SessionConfig()
        self.utterances = 0
        self.utterance: _Utterance | None = None
        """The utterance in progress (from its first ``input.text`` to its ``audio.done``)."""
        self.segment = 0
        """The number of the newest segment."""
        self.speaking = False
        """A segment's TTS stream is live (it holds a slot; the stream is not idle meanwhile)."""

    @property
    def pending(self) -> str:
        return self.utterance.pending if self.utterance is not None else ""

    @property
    def takes_text(self) -> bool:
        """Whether the next client event may be read: not while too much text waits, nor while an
        utterance finishes (``input.done`` came, its audio is still being made)."""
        u = self.utterance
        return u is None or (not u.done and len(u.pending) < self.limits.max_pending_chars)

    def handle(self, event: SpeechEvent) -> list[SpeechEffect]:
        match event:
            case sp.StreamError():
                return [Send(event)]
            case sp.SessionConfig():
                return self._configure(event)
            case sp.InputText():
                return self._add_text(event.text)
            case sp.InputDone():
                if self.utterance is None or self.utterance.done:
                    return [_error("input.done without an utterance in progress", "no_utterance")]
                self.utterance.done = True
                return self._advance()
            case SegmentAudio():
                return self._audio(event) if self._is_live(event.segment) else []
            case SegmentEnded() | SegmentFailed() | SegmentRefused():
                return self._segment_over(event) if self._is_live(event.segment) else []
            case Expired():
                error = _error(f"Speech stream closed: {event.why}.", "session_expired")
                return [error, Close(1000, event.why[:120])]
            case _:
                raise TypeError(f"not a speech stream event: {event!r}")

    # -- client events ----------------------------------------------------------------------------------
    def _configure(self, ev: sp.SessionConfig) -> list[SpeechEffect]:
        if self.utterance is not None:
            return [_error("session.config cannot change during an utterance", "utterance_in_progress")]
        if ev.voice not in self.limits.voices:
            available = ", ".join(sorted(self.limits.voices))
            return [_error(f"Unknown voice '{ev.voice}'; available: {available}", param="voice")]
        if not speed_in_range(ev.speed):
            return [_error(SPEED_ERROR, param="speed")]
        if (why := sp.instructions_error(ev.instructions)) is not None:
            return [_error(why, param="instructions")]
        self.config = ev
        return []

    def _add_text(self, text: str) -> list[SpeechEffect]:
        limits = self.limits
        if not text:
            return [_error("input.text needs non-empty text", param="text")]
        if len(text) > limits.max_pending_chars:
            return [
                _error(
                    f"input.text of {len(text)} characters is over the limit of {limits.max_pending_chars};"
                    " send it in pieces",
                    "string_above_max_length",
                    "text",
                )
            ]
        out: list[SpeechEffect] = []
        if self.utterance is None:
            self.utterances += 1
            self.utterance = _Utterance(self.utterances)
            out.append(Send(sp.AudioStart(utterance=self.utterances)))
        u = self.utterance
        if u.chars + len(text) > limits.max_utterance_chars:
            message = f"the utterance would exceed {limits.max_utterance_chars} characters; send input.done and start another"
            return [*out, _error(message, "string_above_max_length", "text")]
        u.text.append(text)
        u.chars += len(text)
        u.pending += text
        return out + self._advance()

    # -- segments ---------------------------------------------------------------------------------------
    def _advance(self) -> list[SpeechEffect]:
        """Start the next segment if none is being spoken; end the utterance when all is spoken."""
        u = self.utterance
        if u is None or self.speaking:
            return []
        while True:
            segment = self._next_segment(u)
            if segment is None:
                return self._finish(u)
            if segment == "":
                return []  # wait for the rest of the sentence
            if segment.strip():
                self.segment += 1
                self.speaking = True
                config = self.config
                request = TtsRequest(voice=config.voice, speed=config.speed, instructions=config.instructions)
                return [Speak(self.segment, segment, request)]

    def _next_segment(self, u: _Utterance) -> str | None:
        """The text to speak next ("": wait for more), or None when the utterance is all spoken."""
        # Pending text at its bound always has a segment, so a reader held back by it goes on.
        run_on = min(MAX_SENTENCE_CHARS, self.limits.max_pending_chars)
        end = len(u.pending) if u.done else segment_end(u.pending, u.scanned, run_on)
        if end == 0:
            u.scanned = len(u.pending)
            return None if u.done else ""
        segment, u.pending = u.pending[:end], u.pending[end:]
        u.scanned = len(u.pending)
        return segment

    def _is_live(self, segment: int) -> bool:
        return self.speaking and segment == self.segment

    def _audio(self, ev: SegmentAudio) -> list[SpeechEffect]:
        u = self.utterance
        assert u is not None
        frames = u.reframer.push(ev.pcm)
        u.frames += len(frames)
        u.samples += sum(len(f) for f in frames) // 2
        return [Send(f, audio=True) for f in frames]

    def _segment_over(self, ev: SegmentEnded | SegmentFailed | SegmentRefused) -> list[SpeechEffect]:
        self.speaking = False
        out: list[SpeechEffect] = []
        if isinstance(ev, SegmentRefused):
            out.append(Send(sp.StreamError(message=ev.reason, code="server_busy"), audio=True))
        elif isinstance(ev, SegmentFailed):
            out.append(
                Send(
                    sp.StreamError(message=f"synthesis failed: {ev.reason}", code="server_error"), audio=True
                )
            )
        return out + self._advance()

    def _finish(self, u: _Utterance) -> list[SpeechEffect]:
        out: list[SpeechEffect] = []
        tail = u.reframer.flush()
        if tail:
            u.frames += 1
            u.samples += len(tail) // 2
            out.append(Send(tail, audio=True))
        done = sp.AudioDone(
            utterance=u.number, frames=u.frames, audio_ms=u.samples / OUTPUT_RATE * 1000, text="".join(u.text)
        )
        self.utterance = None
        return [*out, Send(done, audio=True)]


def _error(message: str, code: str = "invalid_value", param: str | None = None) -> Send:
    return Send(sp.StreamError(message=message, code=code, param=param))
