"""What ``response.create`` asks for, checked and merged over the session's settings. Pure."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET

from realtime_gw.protocols import audio
from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import ChatMessage
from realtime_gw.sessions.context import chat_units
from realtime_gw.sessions.conversation import Conversation, ConversationError, Entry, check_item
from realtime_gw.sessions.events import Limits
from realtime_gw.sessions.mcp import check_allowed
from realtime_gw.sessions.settings import (
    SessionError,
    SessionSettings,
    TextLimits,
    check_instructions,
    check_tool_choice,
    check_tools,
    check_voice,
)


def validated(
    p: rt.ResponseParams,
    s: SessionSettings,
    voices: frozenset[str],
    limits: Limits,
    conversation: Conversation,
) -> dict[str, Any]:
    """What ``response.create`` asks for, merged over the session settings (``None``: the session's
    value); raises ``SessionError`` (or ``ConversationError``)."""
    voice, speed = s.voice, s.speed
    if p.audio is not None and p.audio.output not in (UNSET, None):
        if p.audio.output.voice not in (UNSET, None):
            voice = check_voice(p.audio.output.voice, voices, "response.audio.output.voice")
        if p.audio.output.speed not in (UNSET, None):
            speed = p.audio.output.speed
            if not audio.speed_in_range(speed):
                raise SessionError(audio.SPEED_ERROR, "invalid_value", "response.audio.output.speed")
    if p.conversation not in (None, "auto", "none"):
        raise SessionError(
            f"conversation must be 'auto' or 'none', got '{p.conversation}'",
            "invalid_value",
            "response.conversation",
        )
    text_limits = TextLimits(limits.max_instructions_chars, limits.max_tools)
    instructions = s.instructions
    if p.instructions is not None:
        instructions = check_instructions(p.instructions, text_limits, "response.instructions")
    tools = s.tools
    if p.tools is not None:  # the response's tools replace the session's, MCP servers included
        tools = check_tools(p.tools, limits.max_tools, limits.max_instructions_chars, "response.tools")
        check_allowed(tools, limits.mcp_allowed_urls, "response.tools")
    tool_choice = s.tool_choice if p.tool_choice is None else p.tool_choice
    tool_choice = check_tool_choice(tool_choice, tools, "response.tool_choice")
    mcp_tools = [t for t in tools if t["type"] == "mcp"]
    tools = [t for t in tools if t["type"] == "function"]
    context = None if p.input is None else _input_context(p.input, conversation, limits.max_item_text_chars)
    _check_metadata(p.metadata)
    max_tokens = p.max_output_tokens if p.max_output_tokens not in (None, "inf") else s.max_output_tokens
    if isinstance(max_tokens, int) and max_tokens < 1:
        raise SessionError(
            "max_output_tokens must be at least 1", "invalid_value", "response.max_output_tokens"
        )
    return {
        "audio": "audio" in (p.output_modalities or s.output_modalities),
        "in_conversation": p.conversation != "none",
        "instructions": instructions,
        "context": context,
        "voice": voice,
        "speed": speed,
        "max_output_tokens": max_tokens if isinstance(max_tokens, int) else None,
        "metadata": p.metadata,
        "tools": tools,
        "mcp_tools": mcp_tools,
        "tool_choice": tool_choice,
        "temperature": p.temperature,
        "truncation": s.truncation,
    }


def _check_metadata(metadata: dict[str, str] | None) -> None:
    """OpenAI's bounds (16 pairs, keys ≤ 64, values ≤ 512 characters): it is echoed twice."""
    if metadata is None:
        return
    if len(metadata) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in metadata.items()):
        raise SessionError(
            "metadata: at most 16 pairs, keys up to 64 and values up to 512 characters",
            "invalid_value",
            "response.metadata",
        )


def _input_context(raw: list[Any], conversation: Conversation, max_chars: int) -> list[ChatMessage]:
    """``response.input``: the items the model reads instead of the conversation, in order; an
    ``item_reference`` names a conversation item by id."""
    entries: list[Entry] = []
    for i, given in enumerate(raw):
        try:
            item = msgspec.convert(given, rt.Item)
        except msgspec.ValidationError as e:
            raise SessionError(
                f"Invalid response.input[{i}]: {e}", "invalid_value", f"response.input[{i}]"
            ) from None
        if item.type == "item_reference":
            if not item.id or item.id not in conversation:
                raise SessionError(
                    f"response.input[{i}] refers to item '{item.id}', which does not exist",
                    "invalid_value",
                    f"response.input[{i}].id",
                )
            entries.append(conversation.get(item.id))
            continue
        try:
            check_item(item, max_chars)
        except ConversationError as e:
            raise SessionError(str(e), e.code, f"response.input[{i}]") from None
        item.id = item.id or f"input_{i}"
        entries.append(Entry(item))
    return [m for unit in chat_units(entries) for m in unit.messages]
