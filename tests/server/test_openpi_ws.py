"""The stock ``openpi_client`` drives a live gateway serving the tiny random-init PI0."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy
from openpi_client.action_chunk_broker import ActionChunkBroker
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from prometheus_client import REGISTRY
from websockets.exceptions import ConnectionClosed, InvalidStatus

from realtime_gw.config import GatewayConfig
from realtime_gw.models.contract import BackendInfo
from realtime_gw.models.policy.factory import policy_spec
from realtime_gw.server import openpi_ws
from tests.server import fakes
from tests.server.openpi_harness import (
    API_KEY,
    Served,
    batch_histogram,
    droid_obs,
    raw_connection,
    serve,
    tiny_runner,
    wait_for,
)

FRAME_LIMIT = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def gw() -> Iterator[Served]:
    config = GatewayConfig(api_key=API_KEY, openpi_max_frame_bytes=FRAME_LIMIT, policy_max_wait_ms=5.0)
    with serve(config, tiny_runner(config)) as served:
        yield served


def client(gw: Served, path: str = "") -> WebsocketClientPolicy:
    host = f"ws://127.0.0.1:{gw.port}{path}" if path else "127.0.0.1"
    return WebsocketClientPolicy(host=host, port=None if path else gw.port, api_key=API_KEY)


class _Counting:
    """Counts the inner policy's inferences under ActionChunkBroker."""

    def __init__(self, inner: WebsocketClientPolicy) -> None:
        self.inner, self.calls = inner, 0

    def infer(self, obs: dict) -> dict:
        self.calls += 1
        return self.inner.infer(obs)

    def reset(self) -> None:
        self.inner.reset()


def test_stock_client_metadata_infer_chunks_and_reset(gw: Served) -> None:
    policy = client(gw)
    meta = policy.get_server_metadata()["policy_server_config"]
    assert meta["action_horizon"] == 10 and meta["action_dim"] == 8 and meta["action_keys"] == ["actions"]
    assert meta["camera_keys"][:2] == list(droid_obs(0))[:2]
    assert meta["image_size"] == [224, 224] and meta["random_init"] is True
    assert meta["needs_session_id"] is False and meta["state_history"] == [0]

    first = policy.infer(droid_obs(1))
    assert first["actions"].shape == (10, 8) and first["actions"].dtype == np.float32
    assert np.isfinite(first["actions"]).all()
    assert first["server_timing"]["infer_ms"] > 0 and "prev_total_ms" not in first["server_timing"]
    second = policy.infer(droid_obs(2, size=(180, 320)))  # not 224x224: resized with padding
    assert second["actions"].shape == (10, 8) and second["server_timing"]["prev_total_ms"] > 0

    counting = _Counting(policy)
    broker = ActionChunkBroker(counting, action_horizon=10)
    steps = [broker.infer(droid_obs(3, seed=1)) for _ in range(11)]
    assert counting.calls == 2  # one chunk served 10 steps, the 11th step asked for a new chunk
    assert all(s["actions"].shape == (8,) for s in steps)
    np.testing.assert_array_equal(steps[0]["actions"], steps[10]["actions"])  # same obs + seed
    assert not np.array_equal(steps[0]["actions"], steps[1]["actions"])

    assert policy.infer({"endpoint": "reset"}) == {"status": "reset successful"}
    broker.reset()

    # The explicit path serves the same contract.
    other = client(gw, "/v1/realtime/robot/openpi")
    np.testing.assert_array_equal(other.infer(droid_obs(3, seed=1))["actions"][0], steps[0]["actions"])
    policy._ws.close()
    other._ws.close()


def test_seed_and_num_inference_steps(gw: Served) -> None:
    policy = client(gw)
    a = policy.infer(droid_obs(4, seed=123))["actions"]
    b = policy.infer(droid_obs(4, seed=123))["actions"]
    c = policy.infer(droid_obs(4, seed=124))["actions"]
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    unseeded = [policy.infer(droid_obs(4))["actions"] for _ in range(2)]
    assert not np.array_equal(*unseeded)
    one_step = policy.infer(droid_obs(4, seed=123, num_inference_steps=1))["actions"]
    assert one_step.shape == (10, 8) and not np.allclose(one_step, a)
    with pytest.raises(RuntimeError, match="'num_inference_steps' must be an integer from 1 to 100, got 0"):
        policy.infer(droid_obs(4, num_inference_steps=0))
    policy._ws.close()


def test_eight_robots_batched_each_get_their_own_answer(gw: Served) -> None:
    observations = [droid_obs(100 + i, prompt=f"task {i}", seed=1000 + i) for i in range(8)]
    solo_client = client(gw)
    solo = [solo_client.infer(obs)["actions"] for obs in observations]
    solo_client._ws.close()

    robots = [client(gw) for _ in observations]
    count0, ones0 = batch_histogram()
    barrier = threading.Barrier(len(robots))

    def run(i: int) -> np.ndarray:
        barrier.wait()
        return robots[i].infer(observations[i])["actions"]

    with ThreadPoolExecutor(len(robots)) as pool:
        together = list(pool.map(run, range(len(robots))))
    count1, ones1 = batch_histogram()
    for r in robots:
        r._ws.close()

    for i in range(8):
        # Same noise and inputs; only the batch size differs (BLAS blocking may change the last bits).
        np.testing.assert_allclose(together[i], solo[i], rtol=0, atol=1e-5, err_msg=f"robot {i}")
    for i in range(1, 8):
        assert not np.allclose(together[0], together[i])
    steps, batched_steps = count1 - count0, (count1 - count0) - (ones1 - ones0)
    assert batched_steps >= 1 and steps < 8, f"{steps} steps for 8 robots, {batched_steps} with batch > 1"


def _ask(conn: Any, frame: bytes) -> Any:
    conn.send(frame)
    reply = conn.recv(timeout=30)
    return reply if isinstance(reply, str) else msgpack_numpy.unpackb(reply)


def test_bad_input_gets_exact_errors_and_the_server_keeps_serving(gw: Served) -> None:
    healthy_results: list[tuple[int, ...]] = []
    stop = threading.Event()

    def healthy_robot() -> None:
        robot = client(gw)
        while not stop.is_set():
            healthy_results.append(robot.infer(droid_obs(7, seed=7))["actions"].shape)
        robot._ws.close()

    thread = threading.Thread(target=healthy_robot)
    thread.start()
    pack = msgpack_numpy.packb
    conn = raw_connection(gw)
    object_array = msgpack.packb(
        {"observation/state": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "|O", b"shape": [1]}}
    )
    missing_wrist = droid_obs(8)
    del missing_wrist["observation/wrist_image_left"]
    cases: list[tuple[bytes, str]] = [
        (b"\xc1 this is not msgpack", "could not decode observation: not valid msgpack"),
        (object_array, "at 'observation/state': dtype '|O' (object) is not allowed"),
        (
            b"\0" * (FRAME_LIMIT + 1),
            "frame is 4194305 bytes (4.0 MiB), over the limit of 4194304 bytes (4.0 MiB)",
        ),
        (pack(missing_wrist), "missing camera key 'observation/wrist_image_left'"),
        (
            pack(droid_obs(8, **{"observation/state": np.zeros(7)})),
            "'observation/state' must have length 8, got length 7",
        ),
        (
            pack(droid_obs(8, **{"observation/wrist_image_left": np.zeros((224, 224, 3), np.float32)})),
            "'observation/wrist_image_left' must have dtype uint8, got float32",
        ),
        (pack([1, 2, 3]), "an observation must be a msgpack map, got list"),
        (pack(droid_obs(8, seed=-1)), "'seed' must be an integer from 0 to 2**63-1, got -1"),
        (pack({"endpoint": "shutdown"}), "unknown endpoint 'shutdown'"),
    ]
    for frame, expected in cases:
        reply = _ask(conn, frame)
        assert isinstance(reply, str) and expected in reply, (expected, reply)
    conn.send("a text frame")
    assert "expected a binary msgpack-numpy frame" in conn.recv(timeout=10)
    # Still open and serving after every refusal.
    ok = _ask(conn, pack(droid_obs(8, seed=8)))
    assert ok["actions"].shape == (10, 8)
    conn.close()

    with pytest.raises(InvalidStatus) as refused:
        WebsocketClientPolicy(host="127.0.0.1", port=gw.port, api_key="wrong-key")
    assert refused.value.response.status_code == 401
    assert b"invalid or missing API key" in refused.value.response.body
    with pytest.raises(InvalidStatus):
        WebsocketClientPolicy(host="127.0.0.1", port=gw.port)  # no key at all

    stop.set()
    thread.join(timeout=60)
    assert len(healthy_results) >= 2 and set(healthy_results) == {(10, 8)}
    # Nothing leaks: every connection closed, every worker slot returned.
    assert wait_for(lambda: gw.gateway.sessions["openpi"] == 0)
    assert REGISTRY.get_sample_value("realtime_gw_sessions", {"kind": "openpi"}) == 0
    assert wait_for(lambda: gw.worker.active_count == 0)
    assert gw.worker.backend._used == 0  # type: ignore[attr-defined]


def test_client_disconnect_mid_inference_frees_everything(gw: Served) -> None:
    conn = raw_connection(gw)
    conn.send(msgpack_numpy.packb(droid_obs(9)))
    conn.close()  # gone before the reply
    assert wait_for(lambda: gw.gateway.sessions["openpi"] == 0)
    assert wait_for(lambda: gw.worker.active_count == 0)
    with pytest.raises(ConnectionClosed):
        conn.recv(timeout=1)


async def test_a_robot_that_stops_reading_is_closed_after_the_send_timeout() -> None:
    """In process: the metadata frame cannot be written (the client's buffers are full): close 1008."""
    config = GatewayConfig(policy="noop", send_timeout_s=0.3)
    info = BackendInfo(name="policy", policy_spec=policy_spec(config, model="noop", action_horizon=10))
    worker = SimpleNamespace(name="policy", describe=lambda: info)
    ws = fakes.FakeSocket()
    ws.stalled = True
    await asyncio.wait_for(openpi_ws._Loop(ws, SimpleNamespace(config=config), worker).run(), 5.0)  # type: ignore[arg-type]
    assert ws.closed == (1008, "client is not reading")
