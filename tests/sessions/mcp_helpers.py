"""Shared helpers for the MCP session tests: an allowed server, its listing, and a model that calls."""

from __future__ import annotations

from typing import Any

from realtime_gw.records.voice import ToolCallDelta
from realtime_gw.sessions.events import (
    Limits,
    ListMcpTools,
    McpToolsListed,
    ResponseFinished,
    ResponseToolCall,
    StartResponse,
)
from realtime_gw.sessions.realtime import RealtimeSession
from tests.sessions.realtime_helpers import client, events, of, session

URL = "http://127.0.0.1:9/mcp"
TOOLS = [
    {"name": "add", "description": "Add two numbers.", "input_schema": {"type": "object", "properties": {}}},
    {"name": "secret", "description": "Not allowed.", "input_schema": {"type": "object"}},
]
MCP = {
    "type": "mcp",
    "server_label": "calc",
    "server_url": URL,
    "allowed_tools": ["add"],
    "require_approval": "never",
    "headers": {"Authorization": "Bearer hush"},
}


def mcp_session(**settings: Any) -> tuple[RealtimeSession, list[Any]]:
    s = session(Limits(mcp_allowed_urls=(URL + "/",)), output_modalities=["text"])
    return s, client(s, {"type": "session.update", "session": {"tools": [MCP], **settings}})


def listed_session(**settings: Any) -> RealtimeSession:
    s, effects = mcp_session(**settings)
    (listing,) = of(effects, ListMcpTools)
    events(s.handle(McpToolsListed(listing.item_id, TOOLS), 0.0))
    return s


def model_calls(s: RealtimeSession, start: StartResponse, *calls: tuple[str, str]) -> list[Any]:
    out: list[Any] = []
    for index, (name, args) in enumerate(calls):
        out += s.handle(
            ResponseToolCall(start.response_id, start.epoch, ToolCallDelta(index, "", f"call_{index}", name)),
            0,
        )
        for i in range(0, len(args), 4):
            out += s.handle(
                ResponseToolCall(start.response_id, start.epoch, ToolCallDelta(index, args[i : i + 4])), 0
            )
    return out + s.handle(ResponseFinished(start.response_id, start.epoch), 0.0)
