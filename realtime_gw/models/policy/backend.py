"""The policy stage-worker backend: one-shot action-chunk requests, batched across robots.

Each request is a state that finishes after one step. ``open`` prepares a request's tensors (image
resize, tokens, seeded noise) on the worker thread; ``step`` runs every ready request of the same
``num_steps`` through ONE runner call, so concurrent robots share one ``sample_actions`` forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from realtime_gw.models.runtime import NoFreeSlot, StepResult
from realtime_gw.records.policy import PolicyRequest, PolicySpec


class PolicyRunner(Protocol):
    """Model-specific half: prepare one request, run a batch of prepared requests."""

    spec: PolicySpec

    def prepare(self, request: PolicyRequest) -> Any: ...

    def run(self, prepared: list[Any], num_steps: int | None) -> list[np.ndarray]:
        """One (action_horizon, action_dim) float32 array per prepared request, in order."""
        ...


@dataclass(slots=True)
class PolicyState:
    prepared: Any
    num_steps: int | None
    done: bool = False


def dummy_request(spec: PolicySpec) -> PolicyRequest:
    """A valid all-zeros observation (used by warm-up)."""
    h, w = spec.image_size
    return PolicyRequest(
        images=[np.zeros((h, w, 3), np.uint8)] * spec.image_slots,
        state=np.zeros((len(spec.state_history), spec.state_dim), np.float32),
        prompt="warm up",
        seed=0,
    )


class PolicyBackend:
    name = "policy"

    def __init__(self, runner: PolicyRunner, slots: int = 128) -> None:
        self.runner = runner
        self.spec = runner.spec
        self.slots = slots
        self._used = 0

    def open(self, request: Any) -> PolicyState:
        if not isinstance(request, PolicyRequest):
            raise TypeError(f"policy backend needs a PolicyRequest, got {type(request).__name__}")
        if self._used >= self.slots:
            raise NoFreeSlot(f"policy: no free slot ({self.slots} requests in flight)")
        state = PolicyState(self.runner.prepare(request), request.num_steps)
        self._used += 1
        return state

    def step(self, work: list[tuple[PolicyState, list[Any]]]) -> list[StepResult]:
        results: list[StepResult | None] = [None] * len(work)
        # Requests asking for different denoising step counts cannot share one flow-matching loop.
        groups: dict[int | None, list[int]] = {}
        for i, (state, _) in enumerate(work):
            groups.setdefault(state.num_steps, []).append(i)
        for num_steps, idx in groups.items():
            actions = self.runner.run([work[i][0].prepared for i in idx], num_steps)
            for i, a in zip(idx, actions, strict=True):
                work[i][0].done = True
                results[i] = StepResult(outputs=[a], done=True)
        return [r for r in results if r is not None]

    def release(self, state: PolicyState) -> None:
        state.prepared = None
        self._used -= 1

    def has_work(self, state: PolicyState) -> bool:
        return not state.done

    def warmup(self) -> None:
        # The runtime warms up only when no request holds a slot: at start, and after a supervisor
        # restart, which may drop a hung step's states without releasing them.
        self._used = 0
        capture = getattr(self.runner, "warmup", None)
        if capture is not None:
            capture()  # e.g. CUDA graphs for every batch bucket, before the first robot
        state = self.open(dummy_request(self.spec))
        try:
            self.step([(state, [])])
        finally:
            self.release(state)
