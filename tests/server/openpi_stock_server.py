"""openpi's own ``WebsocketPolicyServer`` in a thread, and a client that waits for it to bind: the
reference our policy socket is compared against."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from openpi_client.websocket_client_policy import WebsocketClientPolicy
from openpi_server import WebsocketPolicyServer

from realtime_gw.server.openpi_local import LocalPolicy
from realtime_gw.testing.gateway import free_port
from tests.server.openpi_harness import wait_for


@contextlib.contextmanager
def stock_server(policy: LocalPolicy) -> Iterator[int]:
    """openpi's own server, on its own event loop in a thread."""
    port = free_port()
    server = WebsocketPolicyServer(policy, host="127.0.0.1", port=port, metadata=policy.metadata)
    loop = asyncio.new_event_loop()
    task = loop.create_task(server.run())

    def run() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # how the server stops at the end
            loop.run_until_complete(task)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(task.cancel)
        thread.join(timeout=10)
        loop.close()


def connect_stock(port: int) -> WebsocketClientPolicy:
    """A stock client of the server on ``port``."""
    # The stock server may need a moment to bind; the client itself does not retry.
    result: list[WebsocketClientPolicy] = []

    def attempt() -> bool:
        try:
            result.append(WebsocketClientPolicy(host="127.0.0.1", port=port))
            return True
        except OSError:
            return False

    assert wait_for(attempt, timeout=10)
    return result[0]
