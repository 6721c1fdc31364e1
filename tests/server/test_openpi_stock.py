"""Our socket and openpi's stock ``WebsocketPolicyServer`` give the same actions for the same PI0."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from openpi_server import WebsocketPolicyServer

from realtime_gw.config import GatewayConfig
from realtime_gw.server.openpi_local import LocalPolicy
from tests.server.test_openpi_harness import droid_obs, free_port, serve, tiny_runner, wait_for


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


def _connect(port: int) -> WebsocketClientPolicy:
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


def test_same_actions_as_the_stock_openpi_server() -> None:
    config = GatewayConfig()
    runner = tiny_runner(config)
    adapter = LocalPolicy(runner, seed=42)  # the stock server passes no seed; the adapter fixes it
    observations = [droid_obs(20), droid_obs(21, prompt="open the drawer", size=(240, 320))]
    with serve(config, runner) as gw, stock_server(adapter) as stock_port:
        ours = WebsocketClientPolicy(host="127.0.0.1", port=gw.port)
        stock = _connect(stock_port)
        assert ours.get_server_metadata() == stock.get_server_metadata()
        for obs in observations:
            a = ours.infer({**obs, "seed": 42})
            b = stock.infer(obs)
            np.testing.assert_array_equal(a["actions"], b["actions"])
            assert set(a["server_timing"]) == set(b["server_timing"])
        ours._ws.close()
        stock._ws.close()
