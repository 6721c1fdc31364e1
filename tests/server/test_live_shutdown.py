"""A server shutdown ends every GPT-Live session with ``session.closed`` (a client takes a bare close
for a fault), then the server exits."""

from __future__ import annotations

import asyncio

from realtime_gw.testing.gateway import start_server, stop_server
from tests.server.live_sdk_client import Heard, listen, live_session


async def test_shutdown_closes_live_sessions_with_session_closed() -> None:
    server = start_server(
        "--policy", "none", "--api-key", "test-key", "--tts", "tone", "--no-cpu-backend-spare",
        name="live-shutdown",
    )  # fmt: skip
    try:
        async with live_session(server) as first, live_session(server) as second:
            stopping = asyncio.create_task(asyncio.to_thread(stop_server, server))
            for conn in (first, second):
                heard = await listen(conn, Heard(), lambda h: bool(h.of("session.closed")), timeout=15)
                (closed,) = heard.of("session.closed")
                assert closed.reason == "connection_lost" and closed.session.id == conn.started.session.id
            await stopping
        assert server.proc.poll() is not None  # it exited (uvicorn re-raises the SIGTERM it handled)
    finally:
        stop_server(server)
