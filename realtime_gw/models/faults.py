"""Fault injection for reliability tests: wraps a backend and misbehaves once, on purpose.

Spec (config ``fault_injection``, one entry per fault): ``ROLE:KIND@STEP[:SECONDS]`` where ROLE is
``tts``, ``asr``, ``vad`` or ``policy``; KIND is
- ``raise``: the backend raises inside ``step`` (a fault the worker survives: that batch fails);
- ``die``: the worker thread dies (an exception no per-request handler catches; the supervisor
  replaces the thread);
- ``hang``: ``step`` sleeps for SECONDS (past the worker's deadline; the supervisor abandons the
  thread, or kills the child process of a hosted backend);
- ``spin``: ``step`` keeps the CPU busy for SECONDS in C calls that hold the GIL (what pocketsphinx
  does on a long utterance): in a thread it stalls the event loop, in a child process it stalls nothing.
STEP is the 1-based backend step at which it fires, once. For a backend hosted in a child process the
fault is built inside the child (``FaultyFactory``) and fires in its first launch only, so a restart
after the fault runs clean.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from realtime_gw.models import process_backend
from realtime_gw.models.contract import BackendInfo, StepResult

log = logging.getLogger(__name__)

KINDS = ("raise", "die", "hang", "spin")


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

    def describe(self) -> BackendInfo:
        return self.inner.describe()  # type: ignore[no-any-return]

    def step(self, work: list[tuple[Any, list[Any]]]) -> list[StepResult]:
        self.steps += 1
        if self.steps == self.fault.step:
            log.warning("injecting fault %s into %s", self.fault, self.name)
            if self.fault.kind == "raise":
                raise RuntimeError(f"injected fault in {self.name}")
            if self.fault.kind == "die":
                raise InjectedThreadDeath(f"injected thread death in {self.name}")
            if self.fault.kind == "hang":
                time.sleep(self.fault.seconds)
            else:
                hold_the_gil(self.fault.seconds)
        return self.inner.step(work)


def hold_the_gil(seconds: float) -> None:
    """Busy for ``seconds`` in long C calls that never release the GIL (each ``sum`` over a range runs
    to its end without giving other threads a turn)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sum(range(3_000_000))


def wrap(role: str, backend: Any, specs: list[str] | tuple[str, ...]) -> Any:
    for raw in specs:
        fault = FaultSpec.parse(raw)
        if fault.role == role:
            backend = FaultyBackend(backend, fault)
    return backend


@dataclass(frozen=True)
class FaultyFactory:
    """A picklable backend factory that wraps what it builds with the faults for ``role``: the faults
    then live where the backend lives (inside a hosted backend's child process). They fire in the
    child's first launch only (``process_backend.LAUNCH``), so the restarted child serves normally."""

    role: str
    inner: Callable[[], Any]
    specs: tuple[str, ...] = ()

    def __call__(self) -> Any:
        backend = self.inner()
        return wrap(self.role, backend, self.specs) if process_backend.LAUNCH == 0 else backend
