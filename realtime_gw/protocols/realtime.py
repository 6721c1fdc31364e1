"""OpenAI Realtime API (GA) events as msgspec Structs, with names as in ``openai.types.realtime``.

Client events are a tagged union on ``type``; ``decode_client_event`` turns bytes into one of them or
into an ``ErrorEvent`` naming the bad field. The server events (``realtime_server.py``) and the shapes
both carry (``realtime_shapes.py``) are re-exported here: one namespace of events and their fields.
Server events encode with ``encode_server_event``.
Fields we do not act on (tracing, prompt, ...) are accepted and ignored, so the SDK's full payloads pass.
Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec
from msgspec import Struct

from realtime_gw.protocols.realtime_server import (  # noqa: F401
    ConversationItemAdded,
    ConversationItemDeletedEvent,
    ConversationItemDone,
    ConversationItemInputAudioTranscriptionCompletedEvent,
    ConversationItemInputAudioTranscriptionDeltaEvent,
    ConversationItemInputAudioTranscriptionFailedEvent,
    ConversationItemRetrieved,
    ConversationItemTruncatedEvent,
    ErrorDetail,
    ErrorEvent,
    InputAudioBufferClearedEvent,
    InputAudioBufferCommittedEvent,
    InputAudioBufferSpeechStartedEvent,
    InputAudioBufferSpeechStoppedEvent,
    InputAudioBufferTimeoutTriggered,
    OutputAudioBufferClearedEvent,
    OutputAudioBufferStartedEvent,
    OutputAudioBufferStoppedEvent,
    OverlapDecisionEvent,
    Part,
    PlaybackAcknowledgedEvent,
    RateLimitsUpdatedEvent,
    Response,
    ResponseAudioDeltaEvent,
    ResponseAudioDoneEvent,
    ResponseAudioTranscriptDeltaEvent,
    ResponseAudioTranscriptDoneEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseDoneEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseStatusDetails,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
    ServerEvent,
    SessionClosedEvent,
    SessionCreatedEvent,
    SessionOut,
    SessionUpdatedEvent,
    TranscriptionError,
    TranscriptionSessionOut,
    TranscriptionUsage,
    encode_server_event,
    error_event,
)
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
# Codec
# ------------------------------------------------------------------------------------------------

_decoder = msgspec.json.Decoder(AnyClientEvent)
_PATH = re.compile(r"at `\$\.?([^`]*)`")


class _Header(Struct):
    type: Any = None
    event_id: Any = None


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
