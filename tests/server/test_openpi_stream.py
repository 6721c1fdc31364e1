"""Streamed actions and real-time chunking through a live gateway (tiny random-init PI0 on the CPU)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from realtime_gw.config import GatewayConfig
from tests.server.openpi_harness import (
    API_KEY,
    Served,
    droid_obs,
    raw_connection,
    serve,
    tiny_runner,
    wait_for,
)

H = 10


@pytest.fixture(scope="module")
def gw() -> Iterator[Served]:
    config = GatewayConfig(api_key=API_KEY, policy_max_wait_ms=2.0)
    with serve(config, tiny_runner(config)) as served:
        yield served


def _recv(conn: Any, timeout: float = 30) -> Any:
    msg = conn.recv(timeout=timeout)
    return msg if isinstance(msg, str) else msgpack_numpy.unpackb(msg)


def test_rtc_in_request_reply_mode_with_the_stock_client(gw: Served) -> None:
    policy = WebsocketClientPolicy(host="127.0.0.1", port=gw.port, api_key=API_KEY)
    assert "rtc" in policy.get_server_metadata()["policy_server_config"]["extensions"]
    first = policy.infer(droid_obs(1, seed=1))["actions"]
    s, d = 4, 3
    rtc = {"prev_actions": first[s:], "inference_delay": d, "execute_horizon": s}
    joined = policy.infer(droid_obs(2, seed=2, rtc=rtc))["actions"]
    plain = policy.infer(droid_obs(2, seed=2))["actions"]
    np.testing.assert_array_equal(joined[:d], first[s : s + d])  # the executed steps, exactly
    assert np.linalg.norm(joined[d] - first[s + d]) < np.linalg.norm(plain[d] - first[s + d])
    with pytest.raises(RuntimeError, match="'rtc.prev_actions' must have shape"):
        policy.infer(droid_obs(2, rtc={"prev_actions": np.zeros((3, 5)), "inference_delay": 1}))
    policy._ws.close()


def test_streamed_chunks_arrive_in_order_without_gaps(gw: Served) -> None:
    conn = raw_connection(gw)
    conn.send(msgpack_numpy.packb({"endpoint": "stream_stop"}))
    assert "no stream is running" in _recv(conn)
    control_hz, s = 10.0, 5
    conn.send(
        msgpack_numpy.packb({"endpoint": "stream_start", "control_hz": control_hz, "execute_horizon": s})
    )
    started = _recv(conn)
    assert started["status"] == "stream started" and started["action_horizon"] == H
    stop = threading.Event()

    def camera() -> None:  # observations whenever the robot has them: faster than chunks are made
        k = 0
        while not stop.is_set():
            conn.send(msgpack_numpy.packb(droid_obs(k % 3, seed=k)))
            k += 1
            time.sleep(0.04)

    sender = threading.Thread(target=camera)
    sender.start()
    chunks: list[dict[str, Any]] = []
    try:
        while len(chunks) < 5:
            msg = _recv(conn)
            assert not isinstance(msg, str), msg
            if msg.get("type") == "action_chunk":
                chunks.append(msg)
    finally:
        stop.set()
        sender.join()
    assert [c["chunk_index"] for c in chunks] == list(range(5))
    starts = [c["start_step"] for c in chunks]
    for a, b in zip(chunks, chunks[1:], strict=False):
        offset = b["start_step"] - a["start_step"]
        assert s <= offset < H, starts  # the next chunk starts while the previous one still has actions
        d = b["inference_delay"]
        # RTC joins them: the steps that executed while the chunk was computed are the old chunk's.
        np.testing.assert_array_equal(b["actions"][:d], a["actions"][offset : offset + d])
        assert b["actions"].shape == (H, 8) and b["actions"].dtype == np.float32
    conn.send(msgpack_numpy.packb({"endpoint": "stream_stop"}))
    while True:  # chunks already on their way may precede the status
        msg = _recv(conn)
        if isinstance(msg, dict) and msg.get("status") == "stream stopped":
            break
        assert msg.get("type") == "action_chunk", msg
    assert msg["chunks"] >= 5 and msg["gaps"] == 0 and msg["dropped_observations"] > 0
    # Back in request/reply mode on the same connection.
    conn.send(msgpack_numpy.packb(droid_obs(4, seed=4)))
    reply = _recv(conn)
    while "actions" not in reply or "server_timing" not in reply or "type" in reply:
        reply = _recv(conn)
    assert reply["actions"].shape == (H, 8)
    conn.close()
    assert wait_for(lambda: gw.gateway.sessions["openpi"] == 0)
    assert wait_for(lambda: gw.worker.active_count == 0)


def test_disconnect_while_streaming_frees_everything(gw: Served) -> None:
    conn = raw_connection(gw)
    conn.send(msgpack_numpy.packb({"endpoint": "stream_start", "control_hz": 50}))
    assert _recv(conn)["status"] == "stream started"
    conn.send(msgpack_numpy.packb(droid_obs(1)))
    conn.close()  # mid-chunk
    assert wait_for(lambda: gw.gateway.sessions["openpi"] == 0)
    assert wait_for(lambda: gw.worker.active_count == 0)
