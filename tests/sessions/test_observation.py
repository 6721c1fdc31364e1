"""Observation and control-frame parsing on its own: pure functions, no session state."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from realtime_gw.records.policy import PolicySpec
from realtime_gw.sessions.observation import (
    ObservationError,
    StreamSettings,
    endpoint_name,
    parse_observation,
    parse_stream_start,
    session_id_of,
)
from tests.sessions.policy_helpers import EXT1, WRIST


def spec(**kw: Any) -> PolicySpec:
    return PolicySpec(model="test", action_horizon=10, action_dim=2, state_dim=3, **kw)


def obs(**extra: Any) -> dict[str, Any]:
    o: dict[str, Any] = {
        EXT1: np.zeros((4, 6, 3), np.uint8),
        WRIST: np.ones((4, 6, 3), np.uint8),
        "observation/state": [1, 2, 3],
    }
    o.update(extra)
    return o


def test_parse_observation_fields_and_defaults() -> None:
    o = parse_observation(
        spec(),
        obs(seed=np.int64(3), session_id="arm", rtc={"prev_actions": np.zeros((4, 2)), "inference_delay": 1}),
    )
    assert o.frame.images[2] is None and o.frame.images[1] is not None  # the optional camera is masked
    assert o.frame.state.dtype == np.float32 and o.frame.state.tolist() == [1, 2, 3]
    assert (o.prompt, o.session_id, o.seed, o.num_steps) == ("", "arm", 3, None)
    assert o.rtc is not None and o.rtc.execute_horizon == 6  # H - K: the previous chunk's remainder
    plain = parse_observation(spec(), obs())
    assert plain.session_id == "default" and plain.rtc is None


def test_history_keeps_its_own_copy_of_the_images() -> None:
    msg = obs()
    assert parse_observation(spec(), msg).frame.images[0] is msg[EXT1]  # no ring: no copy
    kept = parse_observation(spec(image_history=(-1, 0)), msg).frame.images[0]
    assert kept is not msg[EXT1] and np.array_equal(kept, msg[EXT1])


def test_control_frames() -> None:
    assert endpoint_name({"endpoint": "reset"}) == "reset"
    with pytest.raises(ObservationError, match="unknown endpoint 'go'"):
        endpoint_name({"endpoint": "go"})
    assert parse_stream_start(spec(), {"control_hz": 20}) == StreamSettings(20.0, 5)
    with pytest.raises(ObservationError, match="'control_hz' must be > 0 and <= 1000"):
        parse_stream_start(spec(), {"control_hz": 1e6})
    assert session_id_of({}) == "default" and session_id_of({"session_id": "b"}) == "b"
    with pytest.raises(ObservationError, match="'session_id' must be a string of 1 to 128 characters"):
        session_id_of({"session_id": "x" * 129})
