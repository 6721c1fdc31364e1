"""What the model is sent: the conversation as chat messages, cut to the backend's context budget by
``session.truncation``. Pure.

Conversion (``chat_units``): a message item becomes one chat message (text parts and transcripts
joined; ``input_image`` parts as ``images``); the ``function_call`` items of one response become the
``tool_calls`` of one assistant message (that response's spoken or written text, if any, is its
content) and each ``function_call_output`` a ``tool`` message right after it, in call order; an
ended ``mcp_call`` item is a call and its result (output, or ``error: ...``) at once, and so is an
``mcp_approval_request`` the client denied (its result says so). A call
without its output yet (or an output whose call is gone) is left out: chat backends refuse a
``tool_calls`` message that is not answered at once.

Truncation (``ModelContext``): a call and its outputs are one unit, never split. Tokens are estimated,
not counted (no tokenizer at hand, and it must be cheap and deterministic): a message costs its
JSON-escaped length (text, tool names and arguments) / 4, plus ``MESSAGE_OVERHEAD_TOKENS``, plus
``IMAGE_TOKENS`` per image; this matches ~4 characters per token of English text and never
undercounts the JSON a chat request carries. When instructions, tools, the reply's reserve and the
items exceed ``context_tokens``, the oldest units leave the model context (never the client's view)
until what is left fits ``retention_ratio`` of the budget (``auto``: ``AUTO_RETENTION``), so the next
several turns reuse the same prefix (backend prefix caching) instead of cutting one item per turn.
``disabled`` sends everything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from realtime_gw.protocols import realtime as rt
from realtime_gw.protocols.realtime import Item
from realtime_gw.records.voice import ChatMessage, ToolCall
from realtime_gw.sessions.conversation import Entry, item_text

MESSAGE_OVERHEAD_TOKENS = 12
IMAGE_TOKENS = 768
"""A high-detail image tile budget; images are priced by the backend, not by their URL's length."""
AUTO_RETENTION = 0.75


def estimate_tokens(m: ChatMessage) -> int:
    chars = len(json.dumps(m.content)) + len(m.role) + len(m.tool_call_id or "")
    for call in m.tool_calls:
        chars += len(call.name) + len(json.dumps(call.arguments)) + len(call.call_id) + 40
    return -(-chars // 4) + MESSAGE_OVERHEAD_TOKENS + IMAGE_TOKENS * len(m.images)


def message_of(item: Item) -> ChatMessage | None:
    if item.type != "message" or item.role is None:
        return None
    images = [c.image_url for c in item.content if c.type == "input_image" and c.image_url]
    text = item_text(item)
    return ChatMessage(item.role, text, images=images) if text or images else None


@dataclass(slots=True)
class Unit:
    """Messages that go to the model together or not at all, and the items they came from."""

    messages: list[ChatMessage]
    item_ids: list[str] = field(default_factory=list)
    tokens: int = 0


def chat_units(entries: list[Entry]) -> list[Unit]:
    """The items as chat messages, grouped into units that truncation never splits."""
    outputs: dict[str, Item] = {
        e.item.call_id: e.item for e in entries if e.item.type == "function_call_output"
    }  # type: ignore[misc]
    called = {e.item.call_id for e in entries if e.item.type == "function_call"}
    denied = {
        e.item.approval_request_id: e.item
        for e in entries
        if e.item.type == "mcp_approval_response" and e.item.approve is False
    }
    units: list[Unit] = []
    previous: Entry | None = None
    for entry in entries:
        item = entry.item
        if item.type == "function_call":
            output = outputs.get(item.call_id)  # type: ignore[arg-type]
            if output is not None:
                _add_call(units, previous, entry, output)
        elif item.type == "mcp_call" and (item.output is not None or item.error is not None):
            _add_call(units, previous, entry, _mcp_result(item))
        elif item.type == "mcp_approval_request" and item.id in denied:
            reason = denied[item.id].reason
            text = "error: the user denied this call" + (f" ({reason})" if reason else "")
            _add_call(units, previous, entry, Item(type="function_call_output", id=f"{item.id}:result", output=text))
        elif item.type == "message":
            message = message_of(item)
            if message is not None:
                units.append(Unit([message], [item.id or ""]))
        elif item.type == "function_call_output" and item.call_id not in called:
            pass  # its call is gone: a lone tool message would be refused
        previous = entry
    for unit in units:
        unit.tokens = sum(estimate_tokens(m) for m in unit.messages)
    return units


def _mcp_result(item: Item) -> Item:
    """An ``mcp_call`` item is its call and its result at once: the result as a tool message."""
    text = f"error: {item.error.get('message', '')}" if item.error else item.output or ""  # type: ignore[union-attr]
    return Item(type="function_call_output", id=f"{item.id}:result", call_id=item.id, output=text)  # type: ignore[arg-type]


def _add_call(units: list[Unit], previous: Entry | None, entry: Entry, output: Item) -> None:
    """A call joins the assistant message before it when that message is of the same response (its
    text, or the previous call of a parallel set); otherwise it starts an assistant message."""
    call_id = entry.item.id if entry.item.type.startswith("mcp_") else entry.item.call_id
    call = ToolCall(call_id or "", entry.item.name or "", entry.item.arguments or "")
    result = ChatMessage("tool", output.output or "", tool_call_id=call.call_id)
    same_response = (
        previous is not None
        and units
        and units[-1].item_ids
        and units[-1].item_ids[0] == previous.item.id
        and previous.response_id is not None
        and previous.response_id == entry.response_id
        and previous.item.type in ("message", "function_call", "mcp_call", "mcp_approval_request")
        and units[-1].messages[0].role == "assistant"
    )
    if same_response:
        unit = units[-1]
        unit.item_ids[0] = entry.item.id or ""  # the newest item of the unit stands for it
    else:
        unit = Unit([ChatMessage("assistant", "")], [entry.item.id or ""])
        units.append(unit)
    unit.messages[0].tool_calls.append(call)
    unit.messages.append(result)
    unit.item_ids.append(output.id or "")


def retention(truncation: rt.Truncation) -> float | None:
    """The share of the budget kept after a cut; None: never cut."""
    if truncation == "disabled":
        return None
    if isinstance(truncation, rt.RetentionRatio):
        return truncation.retention_ratio
    return AUTO_RETENTION


class ModelContext:
    """Which items the model still sees. The cut only moves forward (a stable prefix between cuts)."""

    def __init__(self, context_tokens: int) -> None:
        self.context_tokens = context_tokens
        self.dropped: set[str] = set()
        """Items (by id) cut from the model context."""

    def limit(self, truncation: rt.Truncation) -> int:
        """The window: the backend's context, or a smaller ``token_limits.post_instructions``."""
        limit = self.context_tokens
        if isinstance(truncation, rt.RetentionRatio) and truncation.token_limits:
            post = truncation.token_limits.get("post_instructions")
            if isinstance(post, int) and post > 0:
                limit = min(limit, post)
        return limit

    def reply_room(self, truncation: rt.Truncation, reply_tokens: int) -> int:
        """What is kept free for the reply: what it may write, at most half the window."""
        return min(reply_tokens, self.limit(truncation) // 2)

    def messages(
        self,
        entries: list[Entry],
        truncation: rt.Truncation,
        fixed: list[ChatMessage],
        tools_chars: int,
        reply_tokens: int,
    ) -> list[ChatMessage]:
        """``fixed`` (the instructions) first, then the newest items that fit."""
        self.dropped.intersection_update(e.item.id for e in entries)  # forgotten or deleted items
        units = chat_units(entries)
        ratio = retention(truncation)
        if ratio is None:
            self.dropped.clear()  # disabled: the whole conversation, as the client sees it
        else:
            units = [u for u in units if not self.dropped.intersection(u.item_ids)]
            room = self.limit(truncation) - self.reply_room(truncation, reply_tokens)
            room -= sum(estimate_tokens(m) for m in fixed) + tools_chars // 4
            total = sum(u.tokens for u in units)
            if total > room:
                keep = max(0.0, min(ratio, 1.0)) * room
                while len(units) > 1 and total > keep:  # the newest (what is being answered) stays
                    gone = units.pop(0)
                    total -= gone.tokens
                    self.dropped.update(gone.item_ids)
        return [*fixed, *(m for u in units for m in u.messages)]
