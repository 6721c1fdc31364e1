"""A real MCP server (the ``mcp`` package's ``MCPServer``, streamable HTTP) on a free loopback port,
served from a thread, for tests of the gateway as an MCP client: ``add`` answers, ``explode`` fails,
``nap`` is slow, ``shout`` answers at length, ``secret`` is there to be filtered out. The headers of every request are kept."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer

from realtime_gw.testing.gateway import free_port


def build_server() -> MCPServer:
    server = MCPServer("calculator")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def explode() -> str:
        """Always fails."""
        raise ValueError("the calculator exploded")

    @server.tool()
    async def nap(seconds: float) -> str:
        """Sleeps, then answers."""
        await asyncio.sleep(seconds)
        return "rested"

    @server.tool()
    def shout(times: int) -> str:
        """A long answer."""
        return "A" * times

    @server.tool()
    def secret() -> str:
        """Not for the model."""
        return "hidden"

    return server


class McpTestServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.headers: list[dict[str, str]] = []
        app = build_server().streamable_http_app()
        seen = self.headers

        async def keep_headers(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
            await app(scope, receive, send)

        self.server = uvicorn.Server(
            uvicorn.Config(keep_headers, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self._thread = threading.Thread(target=self.server.run, daemon=True, name="mcp-server")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("MCP server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=5)


@contextmanager
def running_mcp_server() -> Iterator[McpTestServer]:
    server = McpTestServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
