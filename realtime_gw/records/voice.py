"""Plain request and result records exchanged with stage workers (no torch, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from realtime_gw.protocols.audio import FRAME_SAMPLES, OUTPUT_RATE

__all__ = [
    "FRAME_SAMPLES",
    "OUTPUT_RATE",
    "AsrRequest",
    "AsrResult",
    "AsrStreamRequest",
    "ChatMessage",
    "ChatRequest",
    "ChatUsage",
    "ReplyPiece",
    "ToolCall",
    "ToolCallDelta",
    "TtsFrame",
    "TtsRequest",
    "TurnRequest",
    "TurnScore",
    "VadProbs",
    "VadRequest",
    "VoiceAdded",
    "VoiceRegistration",
    "VoiceRemoval",
    "WordTime",
]


@dataclass(slots=True)
class ToolCall:
    """A function call the model made (an assistant message's ``tool_calls`` entry)."""

    call_id: str
    name: str
    arguments: str
    """JSON text, as the model produced it (the gateway never parses or runs it)."""


@dataclass(slots=True)
class ChatMessage:
    """One message of the conversation as a responder sees it (OpenAI chat roles:
    ``system``, ``user``, ``assistant``, ``tool``)."""

    role: str
    content: str
    images: list[str] = field(default_factory=list)
    """``input_image`` parts of a user message: data URLs or http(s) URLs, in order after the text."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    """``assistant`` only: the calls it made (``function_call`` items that follow it)."""
    tool_call_id: str | None = None
    """``tool`` only: the call this is the output of (a ``function_call_output`` item)."""


@dataclass(slots=True)
class ChatRequest:
    """What a responder is asked: the model context plus the response's tool settings."""

    messages: list[ChatMessage]
    max_tokens: int | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    """Realtime function tools as the client gave them: ``{"type": "function", "name", "description",
    "parameters"}`` (validated by the session; never executed by the gateway)."""
    tool_choice: str | dict[str, Any] = "auto"
    """``auto`` | ``none`` | ``required`` | ``{"type": "function", "name": ...}``."""
    temperature: float | None = None


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of a streamed tool call. ``index`` tells parallel calls apart; ``call_id`` and ``name``
    come with the first piece of a call, ``arguments`` is a fragment of its JSON text."""

    index: int
    arguments: str = ""
    call_id: str | None = None
    name: str | None = None


@dataclass(slots=True)
class ChatUsage:
    """Token counts the backend reported for one response (last piece of a stream, when known)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0


ReplyPiece = str | ToolCallDelta | ChatUsage
"""What a responder streams: spoken/written text, tool-call fragments, and finally usage."""


@dataclass(slots=True)
class TtsRequest:
    voice: str = "default"
    speed: float = 1.0
    instructions: str | None = None
    """How to speak, in words (OpenAI's ``instructions``): backends that take a description use it
    (Qwen3-TTS VoiceDesign: the voice; CustomVoice: the style); others ignore it."""


VOICE_KINDS = ("audio_sample", "prompt")
"""Custom voice kinds (OpenAI's ``type``): cloned from a recording, or designed from a description."""


@dataclass(slots=True)
class VoiceRegistration:
    """Asks the TTS stage to add a custom voice at run time, named ``voice_id`` (then a ``TtsRequest``'s
    ``voice``), or a speech-to-speech stage that takes voice prompts to encode one (it keeps nothing: an
    ``S2sOpen`` names the voice and carries the answer's codes). Answered by one ``VoiceAdded``; a backend
    that cannot make ``kind`` refuses it."""

    voice_id: str
    kind: str
    """``audio_sample``: cloned from ``sample``; ``prompt``: designed from ``description``."""
    sample: bytes = b""
    """``audio_sample``: the recording as float32 mono samples at 24 kHz (``protocols.voices``; for a
    speech-to-speech stage, already brought to its prompt's loudness: ``protocols.voices.prompt_sample``)."""
    description: str = ""
    """``prompt``: the voice in words."""
    vector: tuple[float, ...] = ()
    """``audio_sample``: the x-vector a previous registration computed (a restart), so nothing is computed
    again; empty: compute it from ``sample``."""


@dataclass(slots=True)
class VoiceAdded:
    """A registered voice: what the server keeps (a TTS stage's x-vector ``vector``, registered again after
    a restart; or a speech-to-speech stage's voice prompt ``codes`` of codec card ``card``, which an opening
    that names the voice carries: ``records.s2s.VoiceCodes``)."""

    voice_id: str
    vector: tuple[float, ...] = ()
    codes: tuple[tuple[int, ...], ...] = ()
    card: int = 0


@dataclass(slots=True)
class VoiceRemoval:
    """Forget a custom voice (its id is refused afterwards); the stream ends with no output."""

    voice_id: str


@dataclass(slots=True)
class TtsFrame:
    """One 80 ms frame of 24 kHz PCM16 (the final frame of an utterance may be shorter or empty)."""

    pcm: bytes
    text: str = ""
    """Text whose audio starts in this frame ("" on continuation frames)."""
    final: bool = False


@dataclass(slots=True)
class AsrRequest:
    pcm: bytes
    """PCM16 little-endian mono."""
    sample_rate: int


@dataclass(slots=True)
class AsrStreamRequest:
    """A transcription decoded while the user speaks: PCM16 chunks are pushed to the stream as they
    arrive, ``END_OF_INPUT`` when the turn is committed (a ``TrailingSilence`` just before it, when the
    turn's end was heard)."""

    sample_rate: int
    word_times: bool = False
    """Ask for each word's start and end in the final result (backends that can: ``BackendInfo.word_times``)."""


@dataclass(frozen=True, slots=True)
class TrailingSilence:
    """Pushed to an ASR stream before ``END_OF_INPUT``: the audio pushed so far ends with at least this
    much silence (server VAD's wait for the end of the turn). A recogniser whose text lags the audio
    counts it toward the silence it runs after the turn to flush its text."""

    seconds: float


@dataclass(slots=True)
class WordTime:
    word: str
    start_s: float
    """From the stream's first sample."""
    end_s: float


@dataclass(slots=True)
class AsrResult:
    text: str
    final: bool = True
    """False: a partial hypothesis of a streamed transcription (all the text so far; it may still
    change). True: the transcript."""
    words: list[WordTime] | None = None
    """The final result's words with their times, when the stream asked (``word_times``)."""


@dataclass(slots=True)
class VadRequest:
    sample_rate: int
    """Rate of the PCM16 chunks that will be pushed to this stream."""


@dataclass(slots=True)
class VadProbs:
    """Speech probabilities for consecutive windows of one stream's audio."""

    start_ms: float
    """Position of the first window, in ms of audio pushed to this stream so far."""
    window_ms: float
    probs: list[float]


@dataclass(slots=True)
class TurnRequest:
    """Has the speaker finished their turn? The turn's audio up to now (PCM16 mono; the model reads
    the last 8 s)."""

    pcm: bytes
    sample_rate: int


@dataclass(slots=True)
class TurnScore:
    probability: float
    """That the turn is complete (0..1)."""
