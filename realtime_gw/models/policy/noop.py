"""A policy that answers zeros of the right shape: measures the gateway itself (transport, session, worker)."""

from __future__ import annotations

import numpy as np

from realtime_gw.records.policy import PolicyRequest, PolicySpec


class NoopRunner:
    def __init__(self, spec: PolicySpec) -> None:
        self.spec = spec

    def prepare(self, request: PolicyRequest) -> None:
        return None

    def run(self, prepared: list[None], num_steps: int | None) -> list[np.ndarray]:
        shape = (self.spec.action_horizon, self.spec.action_dim)
        return [np.zeros(shape, np.float32) for _ in prepared]
