"""Observation history over the live socket: robots sharing a connection keep separate rings."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from realtime_gw.config import GatewayConfig
from tests.server.openpi_harness import API_KEY, Served, droid_obs, serve, tiny_runner


@pytest.fixture(scope="module")
def gw() -> Iterator[Served]:
    # Two state frames (previous and current) feed the model; images stay single-frame to keep it cheap.
    config = GatewayConfig(api_key=API_KEY, openpi_state_history=[-1, 0])
    with serve(config, tiny_runner(config)) as served:
        yield served


def _client(gw: Served) -> WebsocketClientPolicy:
    return WebsocketClientPolicy(host="127.0.0.1", port=gw.port, api_key=API_KEY)


def _obs(frame: int, sid: str, prompt: str = "stack the blocks") -> dict:
    return droid_obs(frame, prompt=prompt, seed=5, session_id=sid)


def test_robots_on_one_connection_keep_separate_histories(gw: Served) -> None:
    meta = _client(gw).get_server_metadata()["policy_server_config"]
    assert meta["state_history"] == [-1, 0] and meta["needs_session_id"] is True

    def fresh(*frames: int, prompt: str = "stack the blocks") -> np.ndarray:
        """Actions after sending ``frames`` in order from a new connection."""
        policy = _client(gw)
        for f in frames:
            out = policy.infer(_obs(f, "solo", prompt))["actions"]
        policy._ws.close()
        return out

    policy = _client(gw)
    policy.infer(_obs(1, "a"))
    policy.infer(_obs(3, "b"))
    a2 = policy.infer(_obs(2, "a"))["actions"]  # history of a: [1, 2]
    b2 = policy.infer(_obs(2, "b"))["actions"]  # history of b: [3, 2]
    np.testing.assert_array_equal(a2, fresh(1, 2))
    np.testing.assert_array_equal(b2, fresh(3, 2))
    assert not np.allclose(a2, b2)  # same frame and seed, different past

    # First call repeats the only frame; reset and a prompt change both start the ring again.
    only2 = fresh(2)
    assert not np.allclose(only2, a2)
    assert policy.infer({"endpoint": "reset", "session_id": "a"}) == {"status": "reset successful"}
    np.testing.assert_array_equal(policy.infer(_obs(2, "a"))["actions"], only2)
    np.testing.assert_array_equal(
        policy.infer(_obs(2, "b", prompt="unstack"))["actions"], fresh(2, prompt="unstack")
    )
    policy._ws.close()
