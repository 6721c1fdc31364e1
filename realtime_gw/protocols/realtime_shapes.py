"""OpenAI Realtime API (GA) shapes shared by client and server events: session configuration, conversation
items and their content, response parameters. msgspec Structs with names as in ``openai.types.realtime``;
``protocols.realtime`` re-exports them beside the events. Pure: no I/O.
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
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None


class SemanticVad(Struct, tag="semantic_vad", tag_field="type", kw_only=True):
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    create_response: bool = True
    interrupt_response: bool = True


TurnDetection = ServerVad | SemanticVad


class NoiseReduction(Struct):
    type: str | None = None


class AudioInputConfig(Struct, kw_only=True):
    format: AudioFormat | UnsetType = UNSET
    transcription: TranscriptionConfig | None | UnsetType = UNSET
    turn_detection: TurnDetection | None | UnsetType = UNSET
    noise_reduction: NoiseReduction | None | UnsetType = UNSET


class AudioOutputConfig(Struct, kw_only=True):
    format: AudioFormat | UnsetType = UNSET
    voice: str | UnsetType = UNSET
    speed: float | UnsetType = UNSET


class AudioConfig(Struct, kw_only=True):
    input: AudioInputConfig | UnsetType = UNSET
    output: AudioOutputConfig | UnsetType = UNSET


class DuplexParams(Struct, kw_only=True):
    """Extension: the overlap policy of ``?duplex=1`` sessions."""

    overlap_short_ack_ms: Annotated[int, msgspec.Meta(ge=0)] | UnsetType = UNSET
    overlap_barge_in_ms: Annotated[int, msgspec.Meta(ge=0)] | UnsetType = UNSET
    echo_guard_ms: Annotated[int, msgspec.Meta(ge=0)] | UnsetType = UNSET


class SessionParams(Struct, kw_only=True):
    """The ``session`` of ``session.update``: every field optional, absent means unchanged."""

    type: str | UnsetType = UNSET
    model: str | UnsetType = UNSET
    instructions: str | UnsetType = UNSET
    output_modalities: list[Literal["text", "audio"]] | UnsetType = UNSET
    audio: AudioConfig | UnsetType = UNSET
    max_output_tokens: int | Literal["inf"] | UnsetType = UNSET
    tools: list[Any] | UnsetType = UNSET
    tool_choice: Any = UNSET
    tracing: Any = UNSET
    truncation: Any = UNSET
    include: list[str] | None | UnsetType = UNSET
    prompt: Any = UNSET
    duplex: DuplexParams | UnsetType = UNSET


class ContentPart(Struct, omit_defaults=True):
    """One content part of a message item (input_text, input_audio, output_text, output_audio...)."""

    type: str
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None


class Item(Struct, kw_only=True):
    """A conversation item as sent by clients and echoed by the server (messages only; other item
    types decode too, so the session can say they are not supported)."""

    type: str = "message"
    id: str | None = None
    object: str | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    role: Literal["user", "assistant", "system"] | None = None
    content: list[ContentPart] = msgspec.field(default_factory=list)


class ResponseParams(Struct, kw_only=True):
    conversation: str | None = None
    instructions: str | None = None
    output_modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioConfig | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    metadata: dict[str, str] | None = None
    input: list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    prompt: Any = None
