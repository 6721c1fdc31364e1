"""The OpenPI session with openpi robot presets: observations mapped before any worker, actions mapped back,
real-time chunking joined in the robot's space, in request/reply and streamed modes (pure, no model)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from realtime_gw.protocols.robots import MODEL_CAMERAS, robot_format
from realtime_gw.records.policy import PolicyRequest, PolicySpec
from realtime_gw.sessions.openpi import FrameReceived, Opened, OpenPISession, PolicyDone, RunPolicy, Wakeup
from realtime_gw.sessions.policy_request_reply import SendError, SendReply
from tests.openpi_examples import ACTION_DIMS, EXAMPLES

H = 10


def session(robot: str, **options: Any) -> OpenPISession:
    spec = PolicySpec.for_robot(robot_format(robot, **options), model="test", action_horizon=H)
    s = OpenPISession(spec)
    (meta,) = s.handle(Opened(), 0.0)
    assert isinstance(meta, SendReply) and meta.payload["policy_server_config"]["robot"] == robot
    return s


def run(s: OpenPISession, msg: Any, now: float = 1.0) -> RunPolicy:
    effects = s.handle(FrameReceived(msg, now), now)
    assert len(effects) == 1 and isinstance(effects[0], RunPolicy), effects
    return effects[0]


def model_actions(robot: str, seed: int = 0) -> np.ndarray:
    spec = PolicySpec.for_robot(robot_format(robot), model="test", action_horizon=H)
    return np.random.default_rng(seed).standard_normal((H, spec.action_dim)).astype(np.float32)


@pytest.mark.parametrize("robot", ["droid", "libero", "aloha"])
def test_openpi_examples_reach_the_worker_as_model_inputs_and_come_back_as_robot_actions(robot: str) -> None:
    s = session(robot)
    job = run(s, EXAMPLES[robot](1))
    req: PolicyRequest = job.request
    fmt = s.spec.robot
    assert len(req.images) == len(MODEL_CAMERAS) and req.images[0] is not None
    assert all(img is None or (img.dtype == np.uint8 and img.shape == (224, 224, 3)) for img in req.images)
    assert req.state.shape == (1, fmt.state_dim) and req.prompt == "do something"
    model = model_actions(robot)
    (reply,) = s.handle(PolicyDone(job.job, model), 2.0)
    assert isinstance(reply, SendReply)
    actions = reply.payload["actions"]
    assert actions.shape == (H, ACTION_DIMS[robot]) and actions.dtype == np.float32
    np.testing.assert_array_equal(actions, fmt.outputs(model, req.state[-1]))


def test_aloha_rtc_target_goes_to_model_space_and_the_frozen_steps_come_back_exact() -> None:
    s = session("aloha")
    first = run(s, EXAMPLES["aloha"](2))
    (reply,) = s.handle(PolicyDone(first.job, model_actions("aloha", 1)), 2.0)
    assert isinstance(reply, SendReply)
    prev = reply.payload["actions"][4:]  # what the robot still has to execute, in its own space
    obs = {**EXAMPLES["aloha"](3), "rtc": {"prev_actions": prev, "inference_delay": 2}}
    second = run(s, obs, 3.0)
    guide = second.request.rtc
    assert guide is not None and guide.inference_delay == 2
    state = second.request.state[-1]
    np.testing.assert_allclose(guide.prev_actions, s.spec.robot.actions_to_model(prev, state), rtol=1e-6)
    assert np.abs(guide.prev_actions - prev).max() > 0.01  # joint flips, grippers and deltas undone
    # The worker writes the frozen steps in model space; the robot gets its own values back, bit for bit.
    model = model_actions("aloha", 2)
    model[:2] = guide.prev_actions[:2]
    (joined,) = s.handle(PolicyDone(second.job, model), 4.0)
    assert isinstance(joined, SendReply)
    np.testing.assert_array_equal(joined.payload["actions"][:2], prev[:2])


@pytest.mark.parametrize("robot", ["droid", "libero", "aloha"])
def test_streamed_chunks_are_in_the_robots_space_and_join_there(robot: str) -> None:
    s = session(robot)
    hz, step = 10.0, 0.1
    (started,) = s.handle(
        FrameReceived({"endpoint": "stream_start", "control_hz": hz, "execute_horizon": 4}, 0.0), 0.0
    )
    assert isinstance(started, SendReply) and started.payload["status"] == "stream started"
    chunk0 = run(s, EXAMPLES[robot](4), 0.0)
    assert chunk0.request.rtc is None
    out = s.handle(PolicyDone(chunk0.job, model_actions(robot, 3)), 0.2)
    first = next(e for e in out if isinstance(e, SendReply))
    assert first.payload["type"] == "action_chunk" and first.payload["actions"].shape == (
        H,
        ACTION_DIMS[robot],
    )
    # A fresh observation waits until the execute horizon (step 4), then the next chunk is guided by the rest
    # of the first, mapped back to model space with the new observation's state.
    assert s.handle(FrameReceived(EXAMPLES[robot](5), 0.25), 0.25) == []
    (chunk1,) = [e for e in s.handle(Wakeup(), 4 * step) if isinstance(e, RunPolicy)]
    guide = chunk1.request.rtc
    assert guide is not None
    remaining = first.payload["actions"][4:]
    np.testing.assert_allclose(
        guide.prev_actions, s.spec.robot.actions_to_model(remaining, chunk1.request.state[-1]), rtol=1e-6
    )
    d = guide.inference_delay
    model = model_actions(robot, 4)
    model[:d] = guide.prev_actions[:d]
    out = s.handle(PolicyDone(chunk1.job, model), 0.5)
    second = next(e for e in out if isinstance(e, SendReply))
    np.testing.assert_array_equal(second.payload["actions"][:d], remaining[:d])


def test_robot_errors_are_text_frames_and_the_connection_stays() -> None:
    s = session("droid")
    (err,) = s.handle(FrameReceived({"observation/state": np.zeros(8), "prompt": "x"}, 1.0), 1.0)
    assert isinstance(err, SendError) and "missing key 'observation/exterior_image_1_left'" in err.message
    run(s, EXAMPLES["droid"](0), 2.0)


def test_metadata_describes_the_robots_keys() -> None:
    s = session("libero")
    meta = s.metadata["policy_server_config"]
    assert meta["camera_keys"] == ["observation/image", "observation/wrist_image"]
    assert meta["state_key"] == "observation/state" and meta["state_dim"] == 8 and meta["action_dim"] == 7
    assert meta["robot_options"]["delta_actions"] is True
    assert {tuple(f["path"]) for f in meta["observation"]} == {
        ("observation/image",),
        ("observation/wrist_image",),
        ("observation/state",),
        ("prompt",),
    }
