"""OpenAI Realtime API (GA) events as msgspec Structs, with names as in ``openai.types.realtime``.

Client events are a tagged union on ``type``; ``decode_client_event`` turns bytes into one of them or
into an ``ErrorEvent`` naming the bad field. Server events encode with ``encode_server_event``.
Fields we do not act on (tracing, prompt, ...) are accepted and ignored, so the SDK's full payloads pass.
Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Struct

# The shapes are re-exported: users see one namespace of events and their fields.
from realtime_gw.protocols.realtime_shapes import (  # noqa: F401
    AudioConfig,
    AudioFormat,
    AudioInputConfig,
    AudioOutputConfig,
    ContentPart,
    DuplexParams,
    InputTokenDetails,
    Item,
    NoiseReduction,
    OutputTokenDetails,
    RateLimit,
    ResponseParams,
    ResponseUsage,
    RetentionRatio,
    SemanticVad,
    ServerVad,
    SessionParams,
    TranscriptionConfig,
    Truncation,
    VoiceId,
)

# ------------------------------------------------------------------------------------------------
# Client events (the 11 of the GA API)
# ------------------------------------------------------------------------------------------------


class ClientEvent(Struct, tag_field="type", kw_only=True):
    event_id: str | None = None


class SessionUpdateEvent(ClientEvent, tag="session.update"):
    session: SessionParams


class InputAudioBufferAppendEvent(ClientEvent, tag="input_audio_buffer.append"):
    audio: bytes
    """base64 on the wire; msgspec decodes it (invalid base64 is a field error)."""


class InputAudioBufferCommitEvent(ClientEvent, tag="input_audio_buffer.commit"):
    pass


class InputAudioBufferClearEvent(ClientEvent, tag="input_audio_buffer.clear"):
    pass


class OutputAudioBufferClearEvent(ClientEvent, tag="output_audio_buffer.clear"):
    pass


class ConversationItemCreateEvent(ClientEvent, tag="conversation.item.create"):
    item: Item
    previous_item_id: str | None = None


class ConversationItemRetrieveEvent(ClientEvent, tag="conversation.item.retrieve"):
    item_id: str


class ConversationItemTruncateEvent(ClientEvent, tag="conversation.item.truncate"):
    item_id: str
    content_index: int
    audio_end_ms: int


class ConversationItemDeleteEvent(ClientEvent, tag="conversation.item.delete"):
    item_id: str


class ResponseCreateEvent(ClientEvent, tag="response.create"):
    response: ResponseParams | None = None


class ResponseCancelEvent(ClientEvent, tag="response.cancel"):
    response_id: str | None = None


class PlaybackAckEvent(ClientEvent, tag="playback.ack"):
    """Extension (duplex): how much of a response's audio the client has played."""

    response_id: str
    played_ms: Annotated[int, msgspec.Meta(ge=0)]


class SessionCloseEvent(ClientEvent, tag="session.close"):
    """Extension (duplex): end the session now; the server answers ``session.closed`` and closes."""


AnyClientEvent = (
    SessionUpdateEvent
    | InputAudioBufferAppendEvent
    | InputAudioBufferCommitEvent
    | InputAudioBufferClearEvent
    | OutputAudioBufferClearEvent
    | ConversationItemCreateEvent
    | ConversationItemRetrieveEvent
    | ConversationItemTruncateEvent
    | ConversationItemDeleteEvent
    | ResponseCreateEvent
    | ResponseCancelEvent
    | PlaybackAckEvent
    | SessionCloseEvent
)
CLIENT_EVENT_TYPES = frozenset(
    t.__struct_config__.tag for t in AnyClientEvent.__args__  # type: ignore[attr-defined]
)
EXTENSION_EVENT_TYPES = frozenset({"playback.ack", "session.close"})
GA_CLIENT_EVENT_TYPES = CLIENT_EVENT_TYPES - EXTENSION_EVENT_TYPES

# ------------------------------------------------------------------------------------------------
# Server events
# ------------------------------------------------------------------------------------------------


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


# ------------------------------------------------------------------------------------------------
# Codec
# ------------------------------------------------------------------------------------------------

_decoder = msgspec.json.Decoder(AnyClientEvent)
_encoder = msgspec.json.Encoder()
_PATH = re.compile(r"at `\$\.?([^`]*)`")


class _Header(Struct):
    type: Any = None
    event_id: Any = None


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


def decode_client_event(raw: bytes | str) -> AnyClientEvent | ErrorEvent:
    """Decode one client frame, or explain exactly why it is not a valid event."""
    try:
        return _decode(raw)
    except RecursionError:
        return error_event("Malformed JSON: nested too deeply", code="invalid_json")
    except UnicodeError as e:
        return error_event(f"Malformed JSON: not valid UTF-8 ({e.reason})", code="invalid_json")


def _decode(raw: bytes | str) -> AnyClientEvent | ErrorEvent:
    try:
        return _decoder.decode(raw)
    except msgspec.ValidationError as e:
        try:
            header = msgspec.json.decode(raw, type=_Header)
        except msgspec.ValidationError:
            try:
                msgspec.json.decode(raw)  # typed decoding stops at the first mismatch; is it JSON at all?
            except msgspec.DecodeError as bad:
                return error_event(f"Malformed JSON: {bad}", code="invalid_json")
            return error_event("Invalid event: an event is a JSON object with a 'type'", code="invalid_event")
        except msgspec.DecodeError as bad:
            return error_event(f"Malformed JSON: {bad}", code="invalid_json")
        event_id = header.event_id if isinstance(header.event_id, str) else None
        if not isinstance(header.type, str):
            return error_event(
                "Missing or non-string 'type'", code="invalid_event", param="type", event_id=event_id
            )
        if header.type not in CLIENT_EVENT_TYPES:
            return error_event(
                f"Unknown event type '{header.type}'",
                code="invalid_event_type",
                param="type",
                event_id=event_id,
            )
        match = _PATH.search(str(e))
        param = match.group(1) if match else None
        return error_event(
            f"Invalid '{header.type}': {e}", code="invalid_value", param=param, event_id=event_id
        )
    except msgspec.DecodeError as e:
        return error_event(f"Malformed JSON: {e}", code="invalid_json")


def encode_server_event(event: ServerEvent) -> bytes:
    return _encoder.encode(event)
