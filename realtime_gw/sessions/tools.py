"""The function calls a response makes, assembled from the responder's fragments into
``function_call`` items. Pure. (Tool definitions are checked in ``settings.py``; the client runs a
function tool and sends a ``function_call_output`` item back; a call of an MCP server's tool becomes
an ``mcp_call`` item the gateway runs: ``sessions/mcp.py``.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import ToolCallDelta


@dataclass(slots=True)
class FunctionCall:
    """One call a response is making, as its fragments arrive."""

    item_id: str
    call_id: str
    name: str = ""
    fragments: list[str] = field(default_factory=list)
    output_index: int = 0
    server_label: str | None = None
    """Set when the call is of an MCP server's tool: an ``mcp_call`` item the gateway runs."""
    pending: bool = False
    """An MCP call the gateway is running."""
    output: str | None = None
    error: dict[str, Any] | None = None
    server_url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    approval_id: str | None = None
    """The ``mcp_approval_request`` item asking the client to approve this MCP call."""
    awaiting: bool = False
    """An MCP call waiting for the client's ``mcp_approval_response``."""
    asked_at: float = 0.0
    """When its approval was asked (session clock, seconds)."""

    @property
    def arguments(self) -> str:
        return "".join(self.fragments)

    def approval_item(self) -> rt.Item:
        return rt.Item(
            type="mcp_approval_request",
            id=self.approval_id,
            server_label=self.server_label or "",
            name=self.name,
            arguments=self.arguments,
        )

    def item(self, status: str) -> rt.Item:
        if self.server_label is not None:
            done = status != "in_progress"
            return rt.Item(
                type="mcp_call",
                id=self.item_id,
                server_label=self.server_label,
                name=self.name,
                arguments=self.arguments if done else "",
                approval_request_id=self.approval_id,
                output=self.output if done else None,
                error=self.error if done else None,
            )
        return rt.Item(
            type="function_call",
            id=self.item_id,
            object="realtime.item",
            status=status,  # type: ignore[arg-type]
            call_id=self.call_id,
            name=self.name,
            arguments=self.arguments if status != "in_progress" else "",
        )


class FunctionCalls:
    """A response's calls by the responder's ``index`` (parallel calls), in the order they began."""

    def __init__(self) -> None:
        self.by_index: dict[int, FunctionCall] = {}

    def __bool__(self) -> bool:
        return bool(self.by_index)

    def __iter__(self) -> Any:
        return iter(self.by_index.values())

    @property
    def for_client(self) -> list[FunctionCall]:
        """The function calls the client runs (not MCP calls)."""
        return [c for c in self.by_index.values() if c.server_label is None]

    def feed(self, delta: ToolCallDelta, new_id: Any) -> None:
        """A fragment. ``new_id(prefix)`` makes item ids (and call ids the backend did not give)."""
        call = self.by_index.get(delta.index)
        if call is None:
            call = self.by_index[delta.index] = FunctionCall(new_id("item"), delta.call_id or new_id("call"))
        elif delta.call_id and not call.fragments and call.call_id != delta.call_id:
            call.call_id = delta.call_id
        if delta.name:
            call.name = delta.name
        if delta.arguments:
            call.fragments.append(delta.arguments)
