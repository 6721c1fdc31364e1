"""The in-process openpi policy object (``LocalPolicy``): the session's rules, run call by call."""

from __future__ import annotations

import numpy as np
import pytest

from realtime_gw.models.policy.noop import NoopRunner
from realtime_gw.records.policy import PolicyRequest, PolicySpec
from realtime_gw.server.openpi_local import LocalPolicy
from tests.server.openpi_harness import droid_obs


class ExplodingRunner(NoopRunner):
    """Zeros, except that the prompt 'explode' makes the model step raise."""

    def prepare(self, request: PolicyRequest) -> str:  # type: ignore[override]
        return request.prompt

    def run(self, prepared: list, num_steps: int | None) -> list[np.ndarray]:  # type: ignore[override]
        if "explode" in prepared:
            raise RuntimeError("CUDA error: an illegal memory access")
        return super().run(prepared, num_steps)


def local() -> LocalPolicy:
    return LocalPolicy(
        ExplodingRunner(PolicySpec(model="noop", action_horizon=10, action_dim=8, state_dim=8))
    )


def test_replies_errors_and_no_streaming() -> None:
    policy = local()
    assert policy.metadata["policy_server_config"]["action_horizon"] == 10
    reply = policy.infer(droid_obs(1))
    assert reply["actions"].shape == (10, 8) and "infer_ms" in reply["server_timing"]
    with pytest.raises(ValueError, match="'observation/state' must have length 8, got length 3"):
        policy.infer(droid_obs(1, **{"observation/state": np.zeros(3)}))
    with pytest.raises(ValueError, match="request/reply only"):
        policy.infer({"endpoint": "stream_start", "control_hz": 10})
    assert policy.infer({"endpoint": "reset"}) == {"status": "reset successful"}


def test_a_model_fault_does_not_leave_the_policy_waiting_forever() -> None:
    """Regression: a runner exception left the session 'in flight', so every later call raised."""
    policy = local()
    with pytest.raises(RuntimeError, match="illegal memory access"):
        policy.infer(droid_obs(1, prompt="explode"))
    assert policy.infer(droid_obs(2))["actions"].shape == (10, 8)
