"""The Realtime API's server events (GA) as msgspec Structs, with names as in ``openai.types.realtime``;
``realtime.py`` re-exports them beside the client events, so users see one namespace. Extensions are
additive (``playback.acknowledged``, ``overlap.decision``, ``session.closed``). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

from realtime_gw.protocols.realtime_shapes import (
    Item,
    RateLimit,
    ResponseUsage,
    Truncation,
)


class ServerEvent(Struct, tag_field="type", kw_only=True):
    event_id: str = ""
    server_event_seq: int | None = None
    """Additive: a per-session monotonically increasing counter, set by the transport."""


class ErrorDetail(Struct, omit_defaults=True):
    type: str
    message: str
    code: str | None = None
    param: str | None = None
    event_id: str | None = None


class ErrorEvent(ServerEvent, tag="error"):
    error: ErrorDetail


class SessionOut(Struct, kw_only=True, tag="realtime", tag_field="type"):
    """The full session as echoed in ``session.created`` / ``session.updated``."""

    object: str = "realtime.session"
    id: str = ""
    model: str = "realtime-gw"
    instructions: str = ""
    output_modalities: list[str] = msgspec.field(default_factory=lambda: ["audio"])
    audio: dict[str, Any] = msgspec.field(default_factory=dict)
    max_output_tokens: int | Literal["inf"] = "inf"
    tools: list[Any] = msgspec.field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    truncation: Truncation = "auto"
    capabilities: dict[str, Any] | None = None
    duplex: dict[str, Any] | None = None


class TranscriptionSessionOut(Struct, kw_only=True, tag="transcription", tag_field="type"):
    """A transcription session (``?intent=transcription``, or ``session.update`` with ``type:
    "transcription"``) as echoed: its input audio only (no responses, no output)."""

    object: str = "realtime.transcription_session"
    id: str = ""
    audio: dict[str, Any] = msgspec.field(default_factory=dict)
    include: list[str] | None = None


class SessionCreatedEvent(ServerEvent, tag="session.created"):
    session: SessionOut | TranscriptionSessionOut


class SessionUpdatedEvent(ServerEvent, tag="session.updated"):
    session: SessionOut | TranscriptionSessionOut


class InputAudioBufferSpeechStartedEvent(ServerEvent, tag="input_audio_buffer.speech_started"):
    audio_start_ms: int
    item_id: str


class InputAudioBufferSpeechStoppedEvent(ServerEvent, tag="input_audio_buffer.speech_stopped"):
    audio_end_ms: int
    item_id: str


class InputAudioBufferCommittedEvent(ServerEvent, tag="input_audio_buffer.committed"):
    item_id: str
    previous_item_id: str | None = None


class InputAudioBufferClearedEvent(ServerEvent, tag="input_audio_buffer.cleared"):
    pass


class InputAudioBufferTimeoutTriggered(ServerEvent, tag="input_audio_buffer.timeout_triggered"):
    audio_start_ms: int
    audio_end_ms: int
    item_id: str


class OutputAudioBufferClearedEvent(ServerEvent, tag="output_audio_buffer.cleared"):
    response_id: str


class OutputAudioBufferStartedEvent(ServerEvent, tag="output_audio_buffer.started"):
    """WebRTC calls: a response's first audio went on the outgoing track."""

    response_id: str


class OutputAudioBufferStoppedEvent(ServerEvent, tag="output_audio_buffer.stopped"):
    """WebRTC calls: a response's last audio left on the track (may come after ``response.done``)."""

    response_id: str


class ConversationItemAdded(ServerEvent, tag="conversation.item.added"):
    item: Item
    previous_item_id: str | None = None


class ConversationItemDone(ServerEvent, tag="conversation.item.done"):
    item: Item
    previous_item_id: str | None = None


class ConversationItemRetrieved(ServerEvent, tag="conversation.item.retrieved"):
    item: Item


class ConversationItemTruncatedEvent(ServerEvent, tag="conversation.item.truncated"):
    item_id: str
    content_index: int
    audio_end_ms: int


class ConversationItemDeletedEvent(ServerEvent, tag="conversation.item.deleted"):
    item_id: str


class TranscriptionUsage(Struct):
    seconds: float
    type: str = "duration"


class ConversationItemInputAudioTranscriptionDeltaEvent(
    ServerEvent, tag="conversation.item.input_audio_transcription.delta"
):
    item_id: str
    content_index: int = 0
    delta: str = ""


class ConversationItemInputAudioTranscriptionCompletedEvent(
    ServerEvent, tag="conversation.item.input_audio_transcription.completed"
):
    item_id: str
    content_index: int
    transcript: str
    usage: TranscriptionUsage


class TranscriptionError(Struct, omit_defaults=True):
    type: str = "transcription_error"
    code: str | None = None
    message: str | None = None
    param: str | None = None


class ConversationItemInputAudioTranscriptionFailedEvent(
    ServerEvent, tag="conversation.item.input_audio_transcription.failed"
):
    item_id: str
    content_index: int
    error: TranscriptionError


class ResponseStatusDetails(Struct, omit_defaults=True):
    type: str | None = None
    reason: str | None = None
    error: dict[str, Any] | None = None


class Response(Struct, kw_only=True):
    id: str
    object: str = "realtime.response"
    status: Literal["in_progress", "completed", "cancelled", "failed", "incomplete"] = "in_progress"
    status_details: ResponseStatusDetails | None = None
    output: list[Item] = msgspec.field(default_factory=list)
    output_modalities: list[str] = msgspec.field(default_factory=lambda: ["audio"])
    conversation_id: str | None = None
    metadata: dict[str, str] | None = None
    usage: ResponseUsage | None = None


class ResponseCreatedEvent(ServerEvent, tag="response.created"):
    response: Response


class ResponseDoneEvent(ServerEvent, tag="response.done"):
    response: Response


class _ResponsePartRef(ServerEvent, kw_only=True):
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


class ResponseOutputItemAddedEvent(ServerEvent, tag="response.output_item.added"):
    response_id: str
    output_index: int
    item: Item


class ResponseOutputItemDoneEvent(ServerEvent, tag="response.output_item.done"):
    response_id: str
    output_index: int
    item: Item


class Part(Struct, omit_defaults=True):
    type: Literal["text", "audio"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None


class ResponseContentPartAddedEvent(_ResponsePartRef, tag="response.content_part.added"):
    part: Part


class ResponseContentPartDoneEvent(_ResponsePartRef, tag="response.content_part.done"):
    part: Part


class ResponseAudioDeltaEvent(_ResponsePartRef, tag="response.output_audio.delta"):
    delta: bytes
    """base64 PCM16 (or G.711) of one 80 ms frame; never cumulative."""
    seq: int = 0
    """Additive: frame index within the response, from 0."""
    sample_rate_hz: int = 24000


class ResponseAudioDoneEvent(_ResponsePartRef, tag="response.output_audio.done"):
    pass


class ResponseAudioTranscriptDeltaEvent(_ResponsePartRef, tag="response.output_audio_transcript.delta"):
    delta: str


class ResponseAudioTranscriptDoneEvent(_ResponsePartRef, tag="response.output_audio_transcript.done"):
    transcript: str


class ResponseTextDeltaEvent(_ResponsePartRef, tag="response.output_text.delta"):
    delta: str


class ResponseTextDoneEvent(_ResponsePartRef, tag="response.output_text.done"):
    text: str


class ResponseFunctionCallArgumentsDeltaEvent(ServerEvent, tag="response.function_call_arguments.delta"):
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


class ResponseFunctionCallArgumentsDoneEvent(ServerEvent, tag="response.function_call_arguments.done"):
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


class RateLimitsUpdatedEvent(ServerEvent, tag="rate_limits.updated"):
    rate_limits: list[RateLimit]


class PlaybackAcknowledgedEvent(ServerEvent, tag="playback.acknowledged"):
    """Extension (duplex): the ledger entry for a ``playback.ack``."""

    response_id: str
    played_ms: int
    """The furthest point acknowledged for this response (acks never move backwards)."""
    audio_ms: int
    """Audio generated for the response so far."""


class OverlapDecisionEvent(ServerEvent, tag="overlap.decision"):
    """Extension (duplex): what user speech over assistant speech was taken to mean."""

    decision: Literal["drop", "listen", "barge_in"]
    item_id: str
    """The user speech's item id (as in ``speech_started``)."""
    response_id: str
    audio_start_ms: int
    speech_ms: int
    reason: str


class SessionClosedEvent(ServerEvent, tag="session.closed"):
    """Extension (duplex): the answer to ``session.close``; the socket closes after it."""

    session_id: str


def error_event(
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    event_id: str | None = None,
    type: str = "invalid_request_error",
) -> ErrorEvent:
    return ErrorEvent(
        error=ErrorDetail(type=type, code=code, message=message, param=param, event_id=event_id)
    )


_encoder = msgspec.json.Encoder()


def encode_server_event(event: ServerEvent) -> bytes:
    return _encoder.encode(event)
