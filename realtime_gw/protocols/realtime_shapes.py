"""OpenAI Realtime API (GA) shapes shared by client and server events: session configuration, conversation
items and their content, response parameters. msgspec Structs with names as in ``openai.types.realtime``;
``protocols.realtime`` re-exports them beside the events. Pure: no I/O.

Every optional field also takes an explicit ``null``, which means the field's default (clients built on
the SDK's pydantic models send ``"max_output_tokens": null`` and the like): ``None`` here, resolved to
the default by the session (``turn_detection``, ``transcription`` and ``noise_reduction``: ``null`` is
"off", as in the API).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType


class AudioFormat(Struct, omit_defaults=True):
    type: str = "audio/pcm"
    rate: int | None = None


class TranscriptionConfig(Struct, omit_defaults=True):
    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class ServerVad(Struct, tag="server_vad", tag_field="type", kw_only=True):
    threshold: float | None = 0.5
    prefix_padding_ms: int | None = 300
    silence_duration_ms: int | None = 500
    create_response: bool | None = True
    interrupt_response: bool | None = True
    idle_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        _nulls_to_defaults(self)


class SemanticVad(Struct, tag="semantic_vad", tag_field="type", kw_only=True):
    eagerness: Literal["low", "medium", "high", "auto"] | None = "auto"
    create_response: bool | None = True
    interrupt_response: bool | None = True

    def __post_init__(self) -> None:
        _nulls_to_defaults(self)


def _nulls_to_defaults(s: Struct) -> None:
    """An explicit ``null`` for a field with a default means the default (msgspec decodes the null
    only where the annotation admits ``None``, hence the loose types above)."""
    for name, default in zip(s.__struct_fields__[-len(s.__struct_defaults__) :], s.__struct_defaults__, strict=True):
        if getattr(s, name) is None and default is not None:
            setattr(s, name, default)


TurnDetection = ServerVad | SemanticVad


class NoiseReduction(Struct):
    type: str | None = None


class AudioInputConfig(Struct, kw_only=True):
    format: AudioFormat | None | UnsetType = UNSET
    transcription: TranscriptionConfig | None | UnsetType = UNSET
    turn_detection: TurnDetection | None | UnsetType = UNSET
    noise_reduction: NoiseReduction | None | UnsetType = UNSET


class VoiceId(Struct):
    """A voice given as an object (the API's custom-voice reference): ``{"id": "marin"}``."""

    id: str


class AudioOutputConfig(Struct, kw_only=True):
    format: AudioFormat | None | UnsetType = UNSET
    voice: str | VoiceId | None | UnsetType = UNSET
    speed: float | None | UnsetType = UNSET


class AudioConfig(Struct, kw_only=True):
    input: AudioInputConfig | None | UnsetType = UNSET
    output: AudioOutputConfig | None | UnsetType = UNSET


class DuplexParams(Struct, kw_only=True):
    """Extension: the overlap policy of ``?duplex=1`` sessions."""

    overlap_short_ack_ms: Annotated[int, msgspec.Meta(ge=0)] | UnsetType = UNSET
    overlap_barge_in_ms: Annotated[int, msgspec.Meta(ge=0)] | UnsetType = UNSET
    echo_guard_ms: Annotated[int, msgspec.Meta(ge=0)] | UnsetType = UNSET


class RetentionRatio(Struct, tag="retention_ratio", tag_field="type", kw_only=True):
    """``truncation: {"type": "retention_ratio", "retention_ratio": r}``: after a cut, keep that share
    of the context budget (the rest is dropped at once, so the kept prefix stays stable for caching)."""

    retention_ratio: float
    token_limits: dict[str, Any] | None = None


Truncation = Literal["auto", "disabled"] | RetentionRatio


class SessionParams(Struct, kw_only=True):
    """The ``session`` of ``session.update``: every field optional, absent means unchanged, ``null``
    means the field's default."""

    type: str | None | UnsetType = UNSET
    model: str | None | UnsetType = UNSET
    instructions: str | None | UnsetType = UNSET
    output_modalities: list[Literal["text", "audio"]] | None | UnsetType = UNSET
    audio: AudioConfig | None | UnsetType = UNSET
    max_output_tokens: int | Literal["inf"] | None | UnsetType = UNSET
    tools: list[Any] | None | UnsetType = UNSET
    tool_choice: Any = UNSET
    parallel_tool_calls: bool | None | UnsetType = UNSET
    tracing: Any = UNSET
    truncation: Truncation | None | UnsetType = UNSET
    include: list[str] | None | UnsetType = UNSET
    prompt: Any = UNSET
    duplex: DuplexParams | None | UnsetType = UNSET


class ContentPart(Struct, omit_defaults=True):
    """One content part of a message item (input_text, input_audio, input_image, output_text,
    output_audio...)."""

    type: str
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None
    image_url: str | None = None
    """``input_image``: a data URL (``data:image/png;base64,...``) or an http(s) URL."""
    detail: Literal["auto", "low", "high"] | None = None


class Item(Struct, kw_only=True):
    """A conversation item as sent by clients and echoed by the server: a ``message`` (role,
    content), a ``function_call`` (call_id, name, arguments) or a ``function_call_output`` (call_id,
    output), or one of the server's MCP items (``mcp_list_tools``, ``mcp_call``). Fields of the other kinds stay unset and are not encoded; other item types decode too,
    so the session can say they are not supported."""

    type: str = "message"
    id: str | None = None
    object: str | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    role: Literal["user", "assistant", "system"] | None = None
    content: list[ContentPart] = msgspec.field(default_factory=list)
    call_id: str | None | UnsetType = UNSET
    name: str | None | UnsetType = UNSET
    arguments: str | None | UnsetType = UNSET
    output: str | None | UnsetType = UNSET
    # MCP items (``mcp_list_tools``, ``mcp_call``; see ``protocols/realtime_mcp.py``)
    server_label: str | UnsetType = UNSET
    tools: list[dict[str, Any]] | UnsetType = UNSET
    approval_request_id: str | None | UnsetType = UNSET
    error: dict[str, Any] | None | UnsetType = UNSET
    approve: bool | UnsetType = UNSET
    reason: str | None | UnsetType = UNSET


class ResponseParams(Struct, kw_only=True):
    """``response.create``'s ``response``: ``None`` (absent or ``null``) takes the session's value."""

    conversation: str | None = None
    instructions: str | None = None
    output_modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioConfig | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    metadata: dict[str, str] | None = None
    input: list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    temperature: float | None = None
    parallel_tool_calls: bool | None = None
    prompt: Any = None


class InputTokenDetails(Struct, kw_only=True):
    text_tokens: int = 0
    audio_tokens: int = 0
    image_tokens: int = 0
    cached_tokens: int = 0
    cached_tokens_details: dict[str, int] = msgspec.field(default_factory=dict)


class OutputTokenDetails(Struct, kw_only=True):
    text_tokens: int = 0
    audio_tokens: int = 0


class ResponseUsage(Struct, kw_only=True):
    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    input_token_details: InputTokenDetails = msgspec.field(default_factory=InputTokenDetails)
    output_token_details: OutputTokenDetails = msgspec.field(default_factory=OutputTokenDetails)


class RateLimit(Struct, kw_only=True):
    name: Literal["requests", "tokens"]
    limit: int
    remaining: int
    reset_seconds: float = 0.0
