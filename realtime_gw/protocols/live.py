"""GPT-Live (``/v1/live/sessions``) events as msgspec Structs, with names as in ``openai.types.live``.

Client events are decoded strictly: an unknown field or an unknown ``type`` is an ``error`` event that
names the event and the parameter (``code``/``param`` as OpenAI spells them: ``unknown_parameter``,
``missing_required_parameter``, ``invalid_value``). Events of the protocol this gateway does not serve
(Decisions) decode to ``Unsupported``, so the session can
refuse them by name. Server events encode with ``encode_server_event``; fields left at their default
(``None``) are omitted, as the SDK's models make them optional. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec
from msgspec import Struct

# ------------------------------------------------------------------------------------------------
# Shapes of the session configuration
# ------------------------------------------------------------------------------------------------


class _Strict(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    pass


class AudioPCM(_Strict, tag="audio/pcm", tag_field="type"):
    rate: Literal[16000, 24000]


class AudioPCMU(_Strict, tag="audio/pcmu", tag_field="type"):
    rate: int


class AudioPCMA(_Strict, tag="audio/pcma", tag_field="type"):
    rate: int


AudioFormat = AudioPCM | AudioPCMU | AudioPCMA


class CustomVoice(_Strict):
    id: str


class AudioOutput(_Strict):
    voice: str | CustomVoice | None = None


class Audio(_Strict):
    format: AudioFormat | None = None
    output: AudioOutput | None = None


class ClientDelegation(_Strict, tag="client", tag_field="type"):
    acknowledgement_delay_ms: int | None = None


class ResponsesConfig(_Strict):
    """``delegation.responses``: the backend model's settings (at start ``model`` is required; an
    update names only what changes). Tools and ``tool_choice`` are checked by the session."""

    model: str | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    parallel_tool_calls: bool | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: str | None = None
    text: dict[str, Any] | None = None
    tool_choice: Any = None
    tools: list[Any] | None = None


class ResponsesDelegation(_Strict, tag="responses", tag_field="type"):
    responses: ResponsesConfig | None = None
    acknowledgement_delay_ms: int | None = None


class DecisionsDelegation(_Strict, tag="decisions", tag_field="type"):
    decisions: dict[str, Any] | None = None
    acknowledgement_delay_ms: int | None = None


Delegation = ClientDelegation | ResponsesDelegation | DecisionsDelegation


class InputText(_Strict):
    text: str
    type: Literal["input_text", "text", "output_text"] | None = None


class InitialItem(_Strict):
    """A text-only history message of ``session.start`` (developer, user or assistant)."""

    role: Literal["developer", "user", "assistant"]
    content: list[InputText]
    id: str | None = None
    status: Literal["incomplete", "completed"] | None = None
    type: Literal["message"] | None = None


class SessionConfig(_Strict):
    model: str
    audio: Audio | None = None
    client: dict[str, Any] | None = None
    delegation: Delegation | None = None
    input: list[InitialItem] | None = None
    instructions: str | None = None
    safety_identifier: str | None = None
    store: bool | None = None
    triggers: list[Any] | None = None


class SessionUpdateConfig(_Strict):
    delegation: Delegation | None = None
    triggers: list[Any] | None = None


class SessionResource(Struct, omit_defaults=True, kw_only=True):
    """The resolved session, as ``session.started``, ``session.updated`` and ``session.closed`` carry it."""

    id: str
    expires_at: int
    model: str
    status: Literal["active"]
    audio: Audio | None = None
    delegation: Delegation | None = None
    input: list[InitialItem] | None = None
    instructions: str | None = None
    safety_identifier: str | None = None
    store: bool | None = None


class SessionUsage(Struct, omit_defaults=True):
    seconds: float


# ------------------------------------------------------------------------------------------------
# Client events
# ------------------------------------------------------------------------------------------------


class ClientEvent(Struct, tag_field="type", kw_only=True, forbid_unknown_fields=True):
    event_id: str | None = None


class SessionStartEvent(ClientEvent, tag="session.start"):
    session: SessionConfig


class SessionUpdateEvent(ClientEvent, tag="session.update"):
    session: SessionUpdateConfig


class InputAudioAppendEvent(ClientEvent, tag="session.input_audio.append"):
    audio: bytes
    """base64 on the wire; msgspec decodes it (invalid base64 is a field error)."""


class InputAudioMuteEvent(ClientEvent, tag="session.input_audio.mute"):
    pass


class InputAudioUnmuteEvent(ClientEvent, tag="session.input_audio.unmute"):
    pass


class _Append(ClientEvent, kw_only=True):
    content: str
    delegation_id: str | None = None


class InstructionsAppendEvent(_Append, tag="session.instructions.append"):
    pass


class ThinkingAppendEvent(_Append, tag="session.thinking.append"):
    pass


class CommentaryAppendEvent(_Append, tag="session.commentary.append"):
    pass


class SessionCloseEvent(ClientEvent, tag="session.close"):
    pass


class ResponseItemCreateEvent(ClientEvent, tag="response.item.create"):
    """An input item for the Responses backend (a ``function_call_output``, or a message)."""

    item: dict[str, Any]


class ResponseCreateEvent(ClientEvent, tag="response.create"):
    """Continue the delegated responses whose function calls all have their outputs."""


class OutputAudioFixturePlayEvent(ClientEvent, tag="session.output_audio.fixture.play"):
    audio: bytes
    """base64 raw mono PCM16LE at 24 kHz, whatever the session's format; at most 30 s."""


AnyClientEvent = (
    SessionStartEvent
    | SessionUpdateEvent
    | InputAudioAppendEvent
    | InputAudioMuteEvent
    | InputAudioUnmuteEvent
    | InstructionsAppendEvent
    | ThinkingAppendEvent
    | CommentaryAppendEvent
    | SessionCloseEvent
    | OutputAudioFixturePlayEvent
    | ResponseItemCreateEvent
    | ResponseCreateEvent
)

UNSUPPORTED_TYPES = frozenset(
    {
        "decision.create",
        "decision.item.create",
        "decision.item.delete",
    }
)
"""Client events of the protocol this gateway does not serve (see docs/protocols.md)."""


class Unsupported(Struct, kw_only=True):
    """A well-formed event of a kind this gateway does not serve: the session refuses it by name."""

    type: str
    event_id: str | None = None


# ------------------------------------------------------------------------------------------------
# Server events
# ------------------------------------------------------------------------------------------------


class ServerEvent(Struct, tag_field="type", kw_only=True, omit_defaults=True):
    event_id: str = ""
    server_event_seq: int | None = None
    """Stamped by the transport's outbox; cleared before encoding (not a field of this protocol)."""


class _Answer(ServerEvent, kw_only=True):
    client_event_id: str | None = None


class SessionStartedEvent(_Answer, tag="session.started"):
    session: SessionResource


class SessionUpdatedEvent(_Answer, tag="session.updated"):
    session: SessionResource


class InputAudioMutedEvent(_Answer, tag="session.input_audio.muted"):
    pass


class InputAudioUnmutedEvent(_Answer, tag="session.input_audio.unmuted"):
    pass


class _Appended(_Answer, kw_only=True):
    start_ms: int
    end_ms: int


class InstructionsAppendedEvent(_Appended, tag="session.instructions.appended"):
    pass


class ThinkingAppendedEvent(_Appended, tag="session.thinking.appended"):
    pass


class CommentaryAppendedEvent(_Appended, tag="session.commentary.appended"):
    pass


class OutputAudioDeltaEvent(ServerEvent, tag="session.output_audio.delta"):
    """One frame of the continuous output stream (no ``event_id``: the SDK's model has none)."""

    delta: bytes
    start_ms: int | None = None
    end_ms: int | None = None


class InputTranscriptDeltaEvent(_Appended, tag="session.input_transcript.delta"):
    delta: str


class OutputTranscriptDeltaEvent(_Appended, tag="session.output_transcript.delta"):
    delta: str


class DelegationRef(Struct, kw_only=True):
    id: str
    target: Literal["client", "responses", "decisions"] = "client"
    type: Literal["delegation"] = "delegation"
    response_id: str | None = None


class DelegationCreatedEvent(_Answer, tag="session.delegation.created"):
    delegation: DelegationRef
    offset_ms: int


class OutputAudioFixturePlayingEvent(_Answer, tag="session.output_audio.fixture.playing"):
    pass


class OutputAudioFixturePlayedEvent(_Answer, tag="session.output_audio.fixture.played"):
    pass


class SessionUsageUpdatedEvent(_Answer, tag="session.usage.updated"):
    usage: SessionUsage


CloseReason = Literal["close_requested", "expired", "content", "remote_hangup", "connection_lost"]


class SessionClosedEvent(_Answer, tag="session.closed"):
    reason: CloseReason
    session: SessionResource
    usage: SessionUsage


class Error(Struct, kw_only=True):
    code: str
    message: str
    type: str = "invalid_request_error"
    client_event_id: str | None = None
    param: str | None = None


class ErrorEvent(_Answer, tag="error"):
    error: Error


class ResponseEventEnvelope(_Answer, tag="response.event"):
    """One event of the Responses backend's stream (``event`` in the Responses API's shape), under the
    delegation it works for."""

    event: dict[str, Any]
    delegation_id: str | None = None


class InfoEvent(_Answer, tag="info"):
    code: str
    message: str


# ------------------------------------------------------------------------------------------------
# Codec
# ------------------------------------------------------------------------------------------------

CLIENT_EVENT_TYPES = frozenset(t.__struct_config__.tag for t in AnyClientEvent.__args__)  # type: ignore[attr-defined]
_decoder = msgspec.json.Decoder(AnyClientEvent)
_encoder = msgspec.json.Encoder()
_PATH = re.compile(r"at `\$\.?([^`]*)`")
_UNKNOWN = re.compile(r"unknown field `([^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]*)`")


class _Header(Struct):
    type: Any = None
    event_id: Any = None


def error_event(
    message: str, code: str, param: str | None = None, client_event_id: str | None = None
) -> ErrorEvent:
    error = Error(code=code, message=message, param=param, client_event_id=client_event_id)
    return ErrorEvent(error=error, client_event_id=client_event_id)


def decode_client_event(raw: bytes | str) -> AnyClientEvent | Unsupported | ErrorEvent:
    """Decode one client frame, or explain exactly why it is not a valid event."""
    try:
        return _decoder.decode(raw)
    except msgspec.ValidationError as e:
        return _explain(raw, str(e))
    except msgspec.DecodeError as e:
        return error_event(f"Malformed JSON: {e}", "invalid_json")
    except (RecursionError, UnicodeError) as e:
        return error_event(f"Malformed JSON: {type(e).__name__}", "invalid_json")


def _explain(raw: bytes | str, problem: str) -> Unsupported | ErrorEvent:
    try:
        header = msgspec.json.decode(raw, type=_Header)
    except msgspec.MsgspecError:
        return error_event("Invalid event: an event is a JSON object with a 'type'", "invalid_value", "type")
    event_id = header.event_id if isinstance(header.event_id, str) else None
    kind = header.type
    if not isinstance(kind, str):
        return error_event("Missing or non-string 'type'", "missing_required_parameter", "type", event_id)
    if kind in UNSUPPORTED_TYPES:
        return Unsupported(type=kind, event_id=event_id)
    if kind not in CLIENT_EVENT_TYPES:
        return error_event(f"Unknown event type '{kind}'", "invalid_value", "type", event_id)
    path = _PATH.search(problem)
    where = path.group(1) if path else ""
    if (unknown := _UNKNOWN.search(problem)) is not None:
        param = ".".join(p for p in (where, unknown.group(1)) if p)
        return error_event(f"Unknown parameter in '{kind}': '{param}'", "unknown_parameter", param, event_id)
    if (missing := _MISSING.search(problem)) is not None:
        param = ".".join(p for p in (where, missing.group(1)) if p)
        message = f"Missing required parameter in '{kind}': '{param}'"
        return error_event(message, "missing_required_parameter", param, event_id)
    return error_event(f"Invalid '{kind}': {problem}", "invalid_value", where or None, event_id)


def encode_server_event(event: ServerEvent) -> bytes:
    event.server_event_seq = None  # the outbox's counter is not a field of this protocol
    return _encoder.encode(event)
