"""The action contract (pure): the metadata frame states it, an observation opts in to the reply fields
(``valid_steps``, ``frozen_steps``, ``obs_timestamp``) or states what it expects, and a mismatch is an
error naming the field; a stock observation's reply is unchanged."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy

from realtime_gw.protocols import openpi as wire
from realtime_gw.protocols.action_contract import CONTRACT_VERSION, ContractError, parse_opt_in
from realtime_gw.protocols.robots import robot_format
from realtime_gw.records.policy import PolicySpec
from realtime_gw.sessions.openpi import FrameReceived, Opened, OpenPISession, PolicyDone, RunPolicy
from realtime_gw.sessions.policy_request_reply import SendError, SendReply
from tests.openpi_examples import EXAMPLES
from tests.sessions.policy_helpers import obs, spec

H = 10
LAYOUT = {
    "droid": ("openpi/droid", 15.0, 8),
    "libero": ("openpi/libero", 20.0, 7),
    "aloha": ("openpi/aloha", 50.0, 14),
}


def preset(robot: str, **fields: Any) -> PolicySpec:
    return PolicySpec.for_robot(robot_format(robot), model="test", action_horizon=H, **fields)


def opened(s: PolicySpec) -> tuple[OpenPISession, dict[str, Any]]:
    session = OpenPISession(s)
    (meta,) = session.handle(Opened(), 0.0)
    assert isinstance(meta, SendReply)
    return session, meta.payload["policy_server_config"]


def answer(session: OpenPISession, msg: dict[str, Any], actions: np.ndarray) -> Any:
    (job,) = session.handle(FrameReceived(msg, 1.0), 1.0)
    if not isinstance(job, RunPolicy):
        return job
    (reply,) = session.handle(PolicyDone(job.job, actions), 2.0)
    return reply


@pytest.mark.parametrize("robot", ["droid", "libero", "aloha"])
def test_the_metadata_frame_states_the_contract_of_each_preset(robot: str) -> None:
    _, meta = opened(preset(robot))
    contract = meta["action_contract"]
    layout, hz, action_dim = LAYOUT[robot]
    assert contract["version"] == CONTRACT_VERSION and contract["layout"] == layout
    assert contract["control_hz"] == hz and contract["action"] == {
        "key": "actions",
        "dim": action_dim,
        "dtype": "float32",
        "horizon": H,
    }
    assert contract["state"]["dim"] == meta["state_dim"] and contract["state"]["dtype"] == "float32"
    assert contract["state"]["keys"] == meta["state_keys"]
    assert contract["rtc"] == {
        "frozen_steps": "inference_delay",
        "max_inference_delay": H,
        "frozen_exact": True,
    }
    assert "action_contract" in meta["extensions"]
    # The frame survives openpi's own msgpack-numpy and the stock client's decoder as plain data.
    assert msgpack_numpy.unpackb(wire.packb({"policy_server_config": meta}))["policy_server_config"] == meta


def test_generic_layout_and_a_configured_control_rate() -> None:
    _, meta = opened(spec())
    contract = meta["action_contract"]
    assert contract["layout"] == "generic" and contract["control_hz"] is None
    assert contract["state"]["keys"] == [meta["state_key"]]
    _, meta = opened(preset("droid", control_hz=10.0))
    assert meta["action_contract"]["control_hz"] == 10.0


def test_an_opted_in_reply_carries_valid_steps_and_the_observation_timestamp() -> None:
    session, _ = opened(preset("droid"))
    actions = np.zeros((H, 8), np.float32)
    stock = answer(session, EXAMPLES["droid"](1), actions)
    assert set(stock.payload) == {"actions", "server_timing"}  # a stock observation: the stock reply
    reply = answer(session, {**EXAMPLES["droid"](2), "action_contract": True, "timestamp": 1733.25}, actions)
    assert isinstance(reply, SendReply)
    assert reply.payload["valid_steps"] == H and reply.payload["frozen_steps"] == 0
    assert reply.payload["obs_timestamp"] == 1733.25 and reply.payload["contract_version"] == CONTRACT_VERSION
    # The version number opts in as well; without a timestamp the reply says None.
    reply = answer(session, {**EXAMPLES["droid"](3), "action_contract": np.int64(CONTRACT_VERSION)}, actions)
    assert reply.payload["obs_timestamp"] is None and reply.payload["valid_steps"] == H
    # Real-time chunking: the frozen steps are the inference delay's.
    prev = np.ones((6, 8), np.float32)
    rtc = {"prev_actions": prev, "inference_delay": 3, "execute_horizon": 4}
    msg = {**EXAMPLES["droid"](4), "rtc": rtc, "action_contract": {"layout": "openpi/droid"}, "timestamp": 7}
    reply = answer(session, msg, actions)
    assert reply.payload["frozen_steps"] == 3 and reply.payload["obs_timestamp"] == 7.0
    np.testing.assert_array_equal(reply.payload["actions"][:3], prev[:3])


def test_the_reply_fields_round_trip_through_msgpack() -> None:
    session, _ = opened(preset("aloha"))
    msg = {**EXAMPLES["aloha"](0), "action_contract": True, "timestamp": 12.5}
    reply = answer(session, msgpack_numpy.unpackb(msgpack_numpy.packb(msg)), np.zeros((H, 14), np.float32))
    back = msgpack_numpy.unpackb(wire.packb(reply.payload))
    assert (back["valid_steps"], back["frozen_steps"], back["obs_timestamp"]) == (H, 0, 12.5)
    assert set(msgpack.unpackb(wire.packb({k: v for k, v in reply.payload.items() if k != "actions"}))) >= {
        "valid_steps",
        "obs_timestamp",
    }


@pytest.mark.parametrize(
    ("ask", "message"),
    [
        (
            {"layout": "openpi/libero"},
            "action_contract.layout: this server serves 'openpi/droid', the client expects 'openpi/libero'",
        ),
        ({"action_dim": 7}, "action_contract.action_dim: this server serves 8, the client expects 7"),
        ({"horizon": 50}, "action_contract.horizon: this server serves 10, the client expects 50"),
        ({"control_hz": 10}, "action_contract.control_hz: this server serves 15.0, the client expects 10"),
        ({"version": 2}, "action_contract.version: this server serves 1, the client expects 2"),
        ({"state_dim": True}, "action_contract.state_dim: this server serves 8, the client expects True"),
        ({"layuot": "x"}, "action_contract: unknown field(s) ['layuot']"),
        ("yes", "action_contract must be true, the version number (1) or a map"),
        (2, "action_contract must be true, the version number (1) or a map"),
    ],
)
def test_a_mismatching_expectation_is_an_error_naming_the_field(ask: Any, message: str) -> None:
    session, _ = opened(preset("droid"))
    # Before the robot's own keys are checked: a client for another layout learns that first.
    error = answer(session, {"action_contract": ask}, np.zeros((H, 8), np.float32))
    assert isinstance(error, SendError) and message in error.message, error
    # The session goes on: the next (well-formed) observation is served.
    reply = answer(session, {**EXAMPLES["droid"](1), "action_contract": True}, np.zeros((H, 8), np.float32))
    assert isinstance(reply, SendReply) and reply.payload["valid_steps"] == H


def test_matching_expectations_and_bad_timestamps() -> None:
    contract = preset("libero").contract
    ok = {
        "version": 1,
        "layout": "openpi/libero",
        "state_dim": 8,
        "action_dim": 7,
        "horizon": H,
        "control_hz": 20,
    }
    assert parse_opt_in(contract, {"action_contract": ok}) is not None
    assert parse_opt_in(contract, {"action_contract": False}) is None
    assert parse_opt_in(contract, {}) is None
    for stamp in ("now", float("nan"), True):
        with pytest.raises(ContractError, match="'timestamp' must be a finite number"):
            parse_opt_in(contract, {"action_contract": True, "timestamp": stamp})
    # Generic observations opt in the same way.
    generic = obs(action_contract={"layout": "generic", "action_dim": 2})
    assert parse_opt_in(spec().contract, generic) is not None


def test_streamed_chunks_of_opted_in_observations_carry_the_fields() -> None:
    session, _ = opened(preset("libero"))
    (started,) = session.handle(FrameReceived({"endpoint": "stream_start", "control_hz": 20.0}, 0.0), 0.0)
    assert isinstance(started, SendReply) and started.payload["status"] == "stream started"
    msg = {**EXAMPLES["libero"](1), "action_contract": True, "timestamp": 0.5}
    (job,) = [e for e in session.handle(FrameReceived(msg, 0.01), 0.01) if isinstance(e, RunPolicy)]
    (chunk,) = session.handle(PolicyDone(job.job, np.zeros((H, 7), np.float32)), 0.05)
    assert isinstance(chunk, SendReply) and chunk.payload["type"] == "action_chunk"
    assert (chunk.payload["valid_steps"], chunk.payload["obs_timestamp"]) == (H, 0.5)
