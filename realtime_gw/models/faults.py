"""Fault injection for reliability tests: wraps a backend and misbehaves once, on purpose.

Spec (config ``fault_injection``, one entry per fault): ``ROLE:KIND@STEP[:SECONDS]`` where ROLE is
``tts``, ``asr``, ``vad`` or ``policy``; KIND is
- ``raise``: the backend raises inside ``step`` (a fault the worker survives: that batch fails);
- ``die``: the worker thread dies (an exception no per-request handler catches; the supervisor
  replaces the thread);
- ``hang``: ``step`` blocks for SECONDS (past the worker's deadline; the supervisor abandons it).
STEP is the 1-based backend step at which it fires, once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from realtime_gw.models.runtime import StepResult

log = logging.getLogger(__name__)

KINDS = ("raise", "die", "hang")


class InjectedThreadDeath(BaseException):
    """Not an ``Exception``: nothing but the supervisor catches it, as with a thread that dies."""


@dataclass(frozen=True, slots=True)
class FaultSpec:
    role: str
    kind: str
    step: int
    seconds: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> FaultSpec:
        try:
            role, rest = spec.split(":", 1)
            kind, _, when = rest.partition("@")
            step, _, seconds = when.partition(":")
            parsed = cls(role, kind, int(step), float(seconds or 0.0))
        except ValueError:
            raise ValueError(f"bad fault spec {spec!r}; expected ROLE:KIND@STEP[:SECONDS]") from None
        if parsed.kind not in KINDS or parsed.step < 1:
            raise ValueError(f"bad fault spec {spec!r}; KIND is one of {KINDS}, STEP >= 1")
        return parsed


class FaultyBackend:
    """Delegates everything to ``inner`` except the one step where the fault fires."""

    def __init__(self, inner: Any, fault: FaultSpec) -> None:
        self.inner = inner
        self.fault = fault
        self.name = inner.name
        self.steps = 0

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def open(self, request: Any) -> Any:
        return self.inner.open(request)

    def has_work(self, state: Any) -> bool:
        return self.inner.has_work(state)

    def release(self, state: Any) -> None:
        self.inner.release(state)

    def warmup(self) -> None:
        self.inner.warmup()

    def step(self, work: list[tuple[Any, list[Any]]]) -> list[StepResult]:
        self.steps += 1
        if self.steps == self.fault.step:
            log.warning("injecting fault %s into %s", self.fault, self.name)
            if self.fault.kind == "raise":
                raise RuntimeError(f"injected fault in {self.name}")
            if self.fault.kind == "die":
                raise InjectedThreadDeath(f"injected thread death in {self.name}")
            time.sleep(self.fault.seconds)
        return self.inner.step(work)


def wrap(role: str, backend: Any, specs: list[str]) -> Any:
    for raw in specs:
        fault = FaultSpec.parse(raw)
        if fault.role == role:
            backend = FaultyBackend(backend, fault)
    return backend
