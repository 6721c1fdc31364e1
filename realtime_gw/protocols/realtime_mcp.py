"""The Realtime API's MCP server events, as in ``openai.types.realtime`` (``mcp_list_tools.*``,
``response.mcp_call_arguments.*``, ``response.mcp_call.*``). The items they refer to are ``Item``s of
type ``mcp_list_tools`` (server_label, tools) and ``mcp_call`` (server_label, name, arguments, output
or error). Pure."""

from __future__ import annotations

from realtime_gw.protocols.realtime_server import ServerEvent


class McpListToolsInProgress(ServerEvent, tag="mcp_list_tools.in_progress"):
    item_id: str


class McpListToolsCompleted(ServerEvent, tag="mcp_list_tools.completed"):
    item_id: str


class McpListToolsFailed(ServerEvent, tag="mcp_list_tools.failed"):
    item_id: str


class ResponseMcpCallArgumentsDelta(ServerEvent, tag="response.mcp_call_arguments.delta"):
    response_id: str
    item_id: str
    output_index: int
    delta: str


class ResponseMcpCallArgumentsDone(ServerEvent, tag="response.mcp_call_arguments.done"):
    response_id: str
    item_id: str
    output_index: int
    arguments: str


class ResponseMcpCallInProgress(ServerEvent, tag="response.mcp_call.in_progress"):
    item_id: str
    output_index: int


class ResponseMcpCallCompleted(ServerEvent, tag="response.mcp_call.completed"):
    item_id: str
    output_index: int


class ResponseMcpCallFailed(ServerEvent, tag="response.mcp_call.failed"):
    item_id: str
    output_index: int
