"""Internal faults (text frame + 1011), tracebacks on request, idle timeout, session limit; no-op policy."""

from __future__ import annotations

import time

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed, InvalidStatus

from realtime_gw.config import GatewayConfig
from realtime_gw.models.policy_noop import NoopRunner
from realtime_gw.models.policy_pi0 import policy_spec
from realtime_gw.models.policy_types import PolicyRequest
from tests.server.test_openpi_harness import droid_obs, serve, wait_for


class ExplodingRunner(NoopRunner):
    """Zeros, except that the prompt 'explode' makes the model step raise."""

    def prepare(self, request: PolicyRequest) -> str:  # type: ignore[override]
        return request.prompt

    def run(self, prepared: list, num_steps: int | None) -> list[np.ndarray]:  # type: ignore[override]
        if "explode" in prepared:
            raise RuntimeError("CUDA error: an illegal memory access\nwas encountered")
        return super().run(prepared, num_steps)


def _runner(config: GatewayConfig) -> ExplodingRunner:
    return ExplodingRunner(policy_spec(config, model="noop", action_horizon=10))


@pytest.mark.parametrize("tracebacks", [False, True])
def test_internal_fault_sends_text_then_closes_1011(tracebacks: bool) -> None:
    config = GatewayConfig(policy="noop", openpi_tracebacks=tracebacks)
    with serve(config, _runner(config)) as gw:
        bystander = WebsocketClientPolicy(host="127.0.0.1", port=gw.port)
        policy = WebsocketClientPolicy(host="127.0.0.1", port=gw.port)
        assert policy.infer(droid_obs(1))["actions"].shape == (10, 8)
        with pytest.raises(RuntimeError) as err:
            policy.infer(droid_obs(1, prompt="explode"))
        text = str(err.value).removeprefix("Error in inference server:\n")
        if tracebacks:
            assert text.startswith("Traceback (most recent call last)") and "WorkerFault" in text
        else:
            assert (
                text
                == "internal server error: WorkerFault: policy: CUDA error: an illegal memory access was encountered"
            )
        with pytest.raises(ConnectionClosed) as closed:
            policy._ws.recv(timeout=5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011
        # Other robots are unaffected.
        assert bystander.infer(droid_obs(2))["actions"].shape == (10, 8)
        bystander._ws.close()
        assert wait_for(lambda: gw.gateway.sessions["openpi"] == 0)


def test_idle_timeout_and_session_limit() -> None:
    config = GatewayConfig(policy="noop", openpi_idle_timeout_s=0.5, openpi_max_sessions=2)
    with serve(config, _runner(config)) as gw:
        first = WebsocketClientPolicy(host="127.0.0.1", port=gw.port)
        second = WebsocketClientPolicy(host="127.0.0.1", port=gw.port)
        with pytest.raises(InvalidStatus) as refused:
            WebsocketClientPolicy(host="127.0.0.1", port=gw.port)
        assert refused.value.response.status_code == 503
        assert b"OpenPI session limit reached (2)" in refused.value.response.body

        # Activity keeps a connection alive past the timeout; silence ends it.
        for _ in range(4):
            time.sleep(0.2)
            second.infer(droid_obs(3))
        with pytest.raises(ConnectionClosed) as closed:
            first._ws.recv(timeout=5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
        assert "idle for 0.5 s" in closed.value.rcvd.reason
        second._ws.close()
        assert wait_for(lambda: gw.gateway.sessions["openpi"] == 0)
        third = WebsocketClientPolicy(host="127.0.0.1", port=gw.port)  # slots are free again
        assert third.infer(droid_obs(4))["actions"].shape == (10, 8)
        third._ws.close()
