"""The gateway as an MCP client (the ``mcp`` package, streamable HTTP): runs a realtime session's
``ListMcpTools`` and ``CallMcpTool`` effects and posts what they found back to its mailbox.

Each request opens its own MCP connection (initialize, then one list or call): no connection outlives
a request, so a slow or broken server holds nothing of the gateway between calls. Every request is
bounded by ``mcp_timeout_s`` and a result by ``mcp_max_result_chars``; a URL that is not on
``mcp_allowed_urls`` is never connected to (the session refuses it first; this is the second lock).
Headers go to their server only: they are never logged, and errors are reported without them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx2

from realtime_gw.config import GatewayConfig
from realtime_gw.sessions.events import CallMcpTool, ListMcpTools, McpCallDone, McpToolsListed

log = logging.getLogger(__name__)


def load_package() -> None:
    """Import the ``mcp`` package: at start, and only by a gateway that allows MCP servers (it is half of
    the gateway's import time; done on the loop at a first request, it would stall every session ~0.5 s)."""
    import mcp.client.session  # noqa: F401
    import mcp.client.streamable_http  # noqa: F401
    import mcp.shared.exceptions  # noqa: F401


class McpRequests:
    """A connection's MCP requests in flight; calls by response, so a cancel stops them at once."""

    def __init__(self, config: GatewayConfig, post: Callable[[Any], Awaitable[None]], spawn: Any) -> None:
        self.timeout_s = config.mcp_timeout_s
        self.max_chars = config.mcp_max_result_chars
        self.allowed = {u.rstrip("/") for u in config.mcp_allowed_urls}
        self.post = post
        self.spawn = spawn
        self.calls: dict[str, set[asyncio.Task[None]]] = {}

    def run(self, e: ListMcpTools | CallMcpTool) -> None:
        if isinstance(e, ListMcpTools):
            self.spawn(self._list(e), f"mcp-list-{e.item_id}")
            return
        task = self.spawn(self._call(e), f"mcp-call-{e.item_id}")
        self.calls.setdefault(e.response_id, set()).add(task)
        task.add_done_callback(lambda t: self._forget(e.response_id, t))

    def _forget(self, response_id: str, task: asyncio.Task[None]) -> None:
        tasks = self.calls.get(response_id)
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                del self.calls[response_id]

    def cancel(self, response_id: str) -> None:
        for task in self.calls.pop(response_id, set()):
            task.cancel()

    @asynccontextmanager
    async def _session(self, url: str, headers: dict[str, str]) -> Any:
        # loaded by then (``load_package`` at start, where servers are allowed): no import on the loop
        from mcp.client.session import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        if url.rstrip("/") not in self.allowed:
            raise PermissionError(f"MCP server URL '{url}' is not allowed by this gateway")
        async with (
            asyncio.timeout(self.timeout_s),
            httpx2.AsyncClient(headers=headers, timeout=self.timeout_s) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session

    async def _list(self, e: ListMcpTools) -> None:
        try:
            async with self._session(e.server_url, e.headers) as session:
                listed = await session.list_tools()
            tools = [
                {
                    "name": t.name,
                    "description": t.description,
                    "input_schema": t.input_schema,
                    "annotations": t.annotations.model_dump(exclude_none=True) if t.annotations else None,
                }
                for t in listed.tools
            ]
            await self.post(McpToolsListed(e.item_id, tools))
        except asyncio.CancelledError:
            raise
        except Exception as err:  # every failure is the listing's, never the connection's
            error = failure(err, self.timeout_s)
            log.info("listing MCP tools at %s failed: %s", e.server_url, error["message"])
            await self.post(McpToolsListed(e.item_id, None, error["message"]))

    async def _call(self, e: CallMcpTool) -> None:
        try:
            arguments = json.loads(e.arguments or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("the arguments are not a JSON object")
        except ValueError as err:
            bad = {"type": "tool_execution_error", "message": f"invalid arguments from the model: {err}"}
            await self.post(McpCallDone(e.response_id, e.epoch, e.item_id, None, bad))
            return
        try:
            async with self._session(e.server_url, e.headers) as session:
                result = await session.call_tool(e.name, arguments)
            text = self._text(result)
            if result.is_error:
                error = {"type": "tool_execution_error", "message": text}
                await self.post(McpCallDone(e.response_id, e.epoch, e.item_id, None, error))
            else:
                await self.post(McpCallDone(e.response_id, e.epoch, e.item_id, text))
        except asyncio.CancelledError:
            raise
        except Exception as err:  # every failure is the call's, never the connection's
            error = failure(err, self.timeout_s)
            log.info("MCP call %s at %s failed: %s", e.name, e.server_url, error["message"])
            await self.post(McpCallDone(e.response_id, e.epoch, e.item_id, None, error))

    def _text(self, result: Any) -> str:
        """A tool result as text: its text contents, else its structured content as JSON; capped."""
        texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
        if texts:
            text = "\n".join(texts)
        elif result.structured_content is not None:
            text = json.dumps(result.structured_content)
        else:
            text = json.dumps([c.model_dump(mode="json", exclude_none=True) for c in result.content])
        if len(text) > self.max_chars:
            text = text[: self.max_chars] + f" [result cut: {len(text)} characters, {self.max_chars} kept]"
        return text


def _mcp_error() -> type[BaseException]:
    from mcp.shared.exceptions import MCPError  # loaded by then: only a request that ran can fail

    return MCPError


def failure(err: BaseException, timeout_s: float) -> dict[str, Any]:
    """An exception as a ``RealtimeMcp*Error`` shape (its message never carries request headers)."""
    while inner := getattr(err, "exceptions", None):
        err = inner[0]  # the transport's task group wraps what went wrong (an exception group)
    if isinstance(err, TimeoutError):
        return {
            "type": "tool_execution_error",
            "message": f"the MCP server did not answer within {timeout_s:g} s",
        }
    if isinstance(err, _mcp_error()):
        return {"type": "protocol_error", "code": err.code, "message": err.message}
    if isinstance(err, httpx2.HTTPStatusError):
        return {
            "type": "http_error",
            "code": err.response.status_code,
            "message": f"HTTP {err.response.status_code}",
        }
    if isinstance(err, httpx2.HTTPError):
        return {
            "type": "tool_execution_error",
            "message": f"the MCP server is unreachable ({type(err).__name__})",
        }
    return {"type": "tool_execution_error", "message": str(err) or type(err).__name__}
