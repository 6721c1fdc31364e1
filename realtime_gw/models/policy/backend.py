"""The policy stage-worker backend: action-chunk requests, batched across robots.

``open`` prepares a request's tensors (image resize, tokens, seeded noise) on the worker thread. Then:

- **phased** (a runner with slots, ``PhasedRunner``: the fast PI0 sampler): a request is a prefix and
  denoising steps. Each worker step admits the new requests into free slots and runs their prefixes,
  then advances every admitted request by up to ``phase_steps`` denoising steps, all in one batched
  step whatever step each is at. A robot arriving mid-chunk waits for one worker step of the others,
  not their whole chunks; a request with no free slot waits (not an error) until one is released.
- **one-shot** (transformers' own ``sample_actions``, the no-op policy): a request finishes in one step;
  every ready request of the same ``num_steps`` goes through ONE runner call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from realtime_gw.models.contract import BackendInfo, warmup_seconds
from realtime_gw.models.runtime import NoFreeSlot, StepResult
from realtime_gw.records.policy import PolicyRequest, PolicySpec


class PolicyRunner(Protocol):
    """Model-specific half: prepare one request, run a batch of prepared requests."""

    spec: PolicySpec

    def prepare(self, request: PolicyRequest) -> Any: ...

    def run(self, prepared: list[Any], num_steps: int | None) -> list[np.ndarray]:
        """One (action_horizon, action_dim) float32 array per prepared request, in order."""
        ...


class PhasedRunner(PolicyRunner, Protocol):
    """A runner whose chunks live in fixed slots and advance step by step (``FastPi0Runner``)."""

    def admit(self, entries: list[tuple[Any, int]]) -> list[int | None]: ...

    def advance(self, slots: list[int], max_steps: int) -> dict[int, np.ndarray]: ...

    def free(self, slot: int) -> None: ...

    def reset_slots(self) -> None: ...


def is_phased(runner: object) -> bool:
    return all(callable(getattr(runner, m, None)) for m in ("admit", "advance", "free", "reset_slots"))


@dataclass(slots=True)
class PolicyState:
    prepared: Any
    num_steps: int | None
    done: bool = False
    slot: int | None = None
    """Phased runners: the slot holding this chunk; None until admitted."""


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

    def __init__(self, runner: PolicyRunner, slots: int = 128, phase_steps: int = 0) -> None:
        self.runner = runner
        self.spec = runner.spec
        self.slots = slots
        """Requests in flight (admitted to a runner slot or waiting for one)."""
        self.phased = is_phased(runner)
        self.phase_steps = phase_steps if phase_steps > 0 else 1 << 30
        """Denoising steps per worker step (phased runners); 0 = the whole chunk in one step."""
        self._used = 0
        self._warmup_s: float | None = None

    @property
    def one_shot(self) -> bool:
        """Whether a chunk completes in the worker step that starts it (then a batching window pays)."""
        return not self.phased or self.phase_steps >= self.spec.num_inference_steps

    @property
    def warmup_report(self) -> dict[str, Any]:
        """The warm-up's time and the runner's start-up report (graphs, what is compiled), for ``/readyz``."""
        report = {} if self._warmup_s is None else {"seconds": self._warmup_s}
        return report | dict(getattr(self.runner, "warmup_report", None) or {})

    def describe(self) -> BackendInfo:
        return BackendInfo(
            name=self.name, slots=self.slots, policy_spec=self.spec, warmup_report=self.warmup_report
        )

    def open(self, request: Any) -> PolicyState:
        if not isinstance(request, PolicyRequest):
            raise TypeError(f"policy backend needs a PolicyRequest, got {type(request).__name__}")
        if self._used >= self.slots:
            raise NoFreeSlot(f"policy: no free slot ({self.slots} requests in flight)")
        state = PolicyState(self.runner.prepare(request), request.num_steps)
        self._used += 1
        return state

    def step(self, work: list[tuple[PolicyState, list[Any]]]) -> list[StepResult]:
        if self.phased:
            return self._step_phased(work)
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

    def _step_phased(self, work: list[tuple[PolicyState, list[Any]]]) -> list[StepResult]:
        runner: PhasedRunner = self.runner  # type: ignore[assignment]
        waiting = [state for state, _ in work if state.slot is None]
        if waiting:
            default = self.spec.num_inference_steps
            slots = runner.admit([(s.prepared, s.num_steps or default) for s in waiting])
            for state, slot in zip(waiting, slots, strict=True):
                state.slot = slot
        running = [state.slot for state, _ in work if state.slot is not None]
        finished = runner.advance(running, self.phase_steps) if running else {}
        results = []
        for state, _ in work:
            actions = finished.get(state.slot) if state.slot is not None else None
            state.done = actions is not None
            results.append(StepResult(outputs=[actions], done=True) if actions is not None else StepResult())
        return results

    def release(self, state: PolicyState) -> None:
        if state.slot is not None:
            self.runner.free(state.slot)  # type: ignore[attr-defined]
            state.slot = None
        state.prepared = None
        self._used -= 1

    def has_work(self, state: PolicyState) -> bool:
        return not state.done

    def warmup(self) -> None:
        start = time.perf_counter()
        # The runtime warms up only when no request holds a slot: at start, and after a supervisor
        # restart, which may drop a hung step's states without releasing them.
        self._used = 0
        if self.phased:
            self.runner.reset_slots()  # type: ignore[attr-defined]
        capture = getattr(self.runner, "warmup", None)
        if capture is not None:
            capture()  # e.g. CUDA graphs for every batch bucket, before the first robot
        state = self.open(dummy_request(self.spec))
        try:
            while not state.done:
                self.step([(state, [])])
        finally:
            self.release(state)
        self._warmup_s = warmup_seconds(start)
