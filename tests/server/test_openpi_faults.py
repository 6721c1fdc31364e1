"""Internal faults (text frame + 1011), tracebacks on request, idle timeout, session limit; no-op policy."""

from __future__ import annotations

import time

import numpy as np
import pytest
import websockets.sync.client as ws_client
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed, InvalidStatus

from realtime_gw.config import GatewayConfig
from realtime_gw.models.policy.factory import policy_spec
from realtime_gw.models.policy.noop import NoopRunner
from realtime_gw.records.policy import PolicyRequest
from tests.server.openpi_harness import droid_obs, serve, wait_for


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


def test_several_keys_per_key_slots_and_origins() -> None:
    config = GatewayConfig(
        policy="noop",
        api_keys=["key-one", "key-two"],
        max_sessions_per_key=1,
        allowed_origins=["https://ok.example"],
    )
    with serve(config, _runner(config)) as gw:
        one = WebsocketClientPolicy(host="127.0.0.1", port=gw.port, api_key="key-one")
        with pytest.raises(InvalidStatus) as refused:
            WebsocketClientPolicy(host="127.0.0.1", port=gw.port, api_key="key-one")
        assert refused.value.response.status_code == 503
        assert b"session limit for this API key reached (1)" in refused.value.response.body
        two = WebsocketClientPolicy(host="127.0.0.1", port=gw.port, api_key="key-two")  # its own slot
        assert two.infer(droid_obs(5))["actions"].shape == (10, 8)
        two._ws.close()
        one._ws.close()
        assert wait_for(lambda: not gw.gateway.access.sessions)  # every slot returned

        url = f"ws://127.0.0.1:{gw.port}/v1/realtime/robot/openpi"
        bearer = {"Authorization": "Bearer key-two"}
        with ws_client.connect(url, additional_headers=bearer, origin="https://ok.example") as conn:  # type: ignore[arg-type]
            assert "policy_server_config" in msgpack_numpy.unpackb(conn.recv())
        with pytest.raises(InvalidStatus) as refused:
            ws_client.connect(url, additional_headers=bearer, origin="https://evil.example")  # type: ignore[arg-type]
        assert refused.value.response.status_code == 403
        assert wait_for(lambda: gw.gateway.sessions["openpi"] == 0 and not gw.gateway.access.sessions)


@pytest.mark.parametrize("fault", ["policy:die@2", "policy:hang@2:1.0"])
def test_worker_restart_fails_the_robot_in_flight_and_frees_every_slot(fault: str) -> None:
    """The runtime's supervisor replaces a dead or hung policy thread; the robot gets the stock 1011."""
    config = GatewayConfig(policy="noop", fault_injection=[fault], worker_step_timeout_s=0.5)
    with serve(config, _runner(config)) as gw:
        policy = WebsocketClientPolicy(host="127.0.0.1", port=gw.port)
        assert policy.infer(droid_obs(1))["actions"].shape == (10, 8)  # step 1
        with pytest.raises(RuntimeError, match="internal server error: WorkerFault: policy"):
            policy.infer(droid_obs(1))  # step 2: the fault
        with pytest.raises(ConnectionClosed):
            policy._ws.recv(timeout=5)
        assert wait_for(lambda: gw.worker.ready and gw.worker.restarts == 1)
        # a hung thread's slot comes back when its step returns (an abandoned thread cannot be killed)
        assert wait_for(lambda: gw.worker.backend._used == 0)  # type: ignore[attr-defined]
        again = WebsocketClientPolicy(host="127.0.0.1", port=gw.port)
        assert again.infer(droid_obs(2))["actions"].shape == (10, 8)
        again._ws.close()
        assert wait_for(lambda: gw.gateway.sessions["openpi"] == 0 and gw.worker.backend._used == 0)  # type: ignore[attr-defined]
