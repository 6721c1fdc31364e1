"""openpi's robots as openpi users run them: each preset's own example observation (openpi's
``make_*_example``) sent with the PyPI ``openpi-client`` returns actions of the robot's shape, the same as
openpi's stock ``WebsocketPolicyServer`` serving the same policy object with the same transforms; real-time
chunking and streamed chunks work in the robot's action space (tiny random-init PI0 and π0.5 on the CPU)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import websockets.sync.client as ws_client
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from realtime_gw.client.openpi import sample_observation
from realtime_gw.config import GatewayConfig
from realtime_gw.server.openpi_local import LocalPolicy
from tests.openpi_examples import ACTION_DIMS, EXAMPLES
from tests.server.openpi_harness import Served, serve, tiny_runner
from tests.server.openpi_stock_server import connect_stock, stock_server

H = 10


@pytest.fixture(
    scope="module",
    params=[(m, r) for m in ("pi0", "pi05") for r in ("droid", "libero", "aloha")],
    ids=lambda p: "-".join(p),
)
def robot(request: pytest.FixtureRequest) -> Iterator[tuple[str, Served, int]]:
    """(preset, our gateway, the stock server's port), both serving one runner (PI0 or π0.5) with the
    preset's spec."""
    policy, preset = request.param
    config = GatewayConfig(policy=policy, robot=preset, policy_max_wait_ms=1.0)
    runner = tiny_runner(config)
    with serve(config, runner) as gw, stock_server(LocalPolicy(runner, seed=42)) as stock_port:
        yield preset, gw, stock_port


def test_openpi_examples_through_openpi_client_and_the_stock_server(robot: tuple[str, Served, int]) -> None:
    name, gw, stock_port = robot
    ours = WebsocketClientPolicy(host="127.0.0.1", port=gw.port)
    stock = connect_stock(stock_port)
    meta = ours.get_server_metadata()
    assert meta == stock.get_server_metadata()
    assert meta["policy_server_config"]["robot"] == name
    assert meta["policy_server_config"]["action_dim"] == ACTION_DIMS[name]
    try:
        for seed in (1, 2):
            example = EXAMPLES[name](seed)
            a = ours.infer({**example, "seed": 42})["actions"]
            b = stock.infer(example)["actions"]
            assert a.shape == (H, ACTION_DIMS[name]) and a.dtype == np.float32
            np.testing.assert_array_equal(a, b)
        # Another openpi image convention (float in [0, 1], the other channel order) and another size.
        converted = _other_convention(name, EXAMPLES[name](3))
        a = ours.infer({**converted, "seed": 42})["actions"]
        np.testing.assert_array_equal(a, stock.infer(converted)["actions"])
        # Our client builds a valid observation for the preset from the metadata alone.
        assert ours.infer(sample_observation(meta, seed=4))["actions"].shape == (H, ACTION_DIMS[name])
    finally:
        ours._ws.close()
        stock._ws.close()


def test_the_action_contract_through_openpi_client(robot: tuple[str, Served, int]) -> None:
    """The stock client reads the metadata and infers as before; one that opts in gets ``valid_steps``
    and its timestamp back, from our socket and from the stock server serving the same session."""
    name, gw, stock_port = robot
    ours, stock = WebsocketClientPolicy(host="127.0.0.1", port=gw.port), connect_stock(stock_port)
    try:
        contract = ours.get_server_metadata()["policy_server_config"]["action_contract"]
        assert contract["layout"] == f"openpi/{name}" and contract["action"]["dim"] == ACTION_DIMS[name]
        ask = {"action_contract": {"layout": contract["layout"], "horizon": H}, "timestamp": 3.5}
        for policy in (ours, stock):
            reply = policy.infer({**EXAMPLES[name](7), "seed": 42, **ask})
            assert (reply["valid_steps"], reply["frozen_steps"], reply["obs_timestamp"]) == (H, 0, 3.5)
            assert reply["actions"].shape == (H, ACTION_DIMS[name])
        with pytest.raises(RuntimeError, match="action_contract.layout: this server serves"):
            ours.infer({**EXAMPLES[name](7), "action_contract": {"layout": "openpi/other"}})
    finally:
        ours._ws.close()
        stock._ws.close()


def test_rtc_joins_in_the_robots_action_space(robot: tuple[str, Served, int]) -> None:
    name, gw, _ = robot
    policy = WebsocketClientPolicy(host="127.0.0.1", port=gw.port)
    try:
        first = policy.infer({**EXAMPLES[name](5), "seed": 1})["actions"]
        s, d = 4, 3
        rtc = {"prev_actions": first[s:], "inference_delay": d, "execute_horizon": s}
        joined = policy.infer({**EXAMPLES[name](6), "seed": 2, "rtc": rtc})["actions"]
        np.testing.assert_array_equal(joined[:d], first[s : s + d])  # the executed steps, exactly
    finally:
        policy._ws.close()


def test_streamed_chunks_for_every_preset(robot: tuple[str, Served, int]) -> None:
    name, gw, _ = robot
    conn = ws_client.connect(gw.url, max_size=None, compression=None)
    try:
        msgpack_numpy.unpackb(conn.recv())  # metadata
        conn.send(msgpack_numpy.packb({"endpoint": "stream_start", "control_hz": 20.0, "execute_horizon": 2}))
        assert _recv(conn)["status"] == "stream started"
        chunks: list[dict[str, Any]] = []
        k = 0
        while len(chunks) < 2:
            conn.send(msgpack_numpy.packb({**EXAMPLES[name](k), "seed": k}))
            k += 1
            msg = _recv(conn, timeout=0.1)
            if msg is not None and msg.get("type") == "action_chunk":
                chunks.append(msg)
        first, second = chunks
        assert first["actions"].shape == second["actions"].shape == (H, ACTION_DIMS[name])
        offset, d = second["start_step"] - first["start_step"], second["inference_delay"]
        np.testing.assert_array_equal(second["actions"][:d], first["actions"][offset : offset + d])
        conn.send(msgpack_numpy.packb({"endpoint": "stream_stop"}))
    finally:
        conn.close()


def _recv(conn: Any, timeout: float = 30) -> Any:
    try:
        msg = conn.recv(timeout=timeout)
    except TimeoutError:
        return None
    assert not isinstance(msg, str), msg
    return msgpack_numpy.unpackb(msg)


def _other_convention(name: str, example: dict[str, Any]) -> dict[str, Any]:
    """The example's cameras as float (3, H, W) in [0, 1] (LeRobot's storage), or for ALOHA as uint8
    (H, W, 3); the first camera at 240x320, which is resized with padding."""
    out = dict(example)
    if name == "aloha":
        images = {k: v.transpose(1, 2, 0) for k, v in example["images"].items()}
        images["cam_high"] = np.random.default_rng(0).integers(0, 256, (240, 320, 3), dtype=np.uint8)
        return {**out, "images": images}
    keys = [k for k, v in example.items() if isinstance(v, np.ndarray) and v.ndim == 3]
    for k in keys:
        out[k] = (example[k].transpose(2, 0, 1) / 255.0).astype(np.float32)
    out[keys[0]] = np.random.default_rng(0).random((3, 240, 320)).astype(np.float32)
    return out
