"""The device clock: one per device, shared by every stage worker on it, so their steps run one at a
time in deadline order instead of time-slicing the device from several threads.

A worker with a ready step ``enter``s it (on the event loop, with the step's deadline); its own thread
then ``hold``s until the clock grants it the device, runs the iteration and ``leave``s, which grants the
next ready step at once, thread to thread, without a hop through the event loop. Which step is next is
``clock_schedule.DeadlineFirst``'s pure decision. ``leave`` is idempotent and also withdraws a step
that was never granted (a worker stopping, a supervisor abandoning a hung step), so a hung stage holds
its device only until its own supervisor gives up on it.

The deadline counters are kept per stage and device whether or not a clock runs, so a gateway with the
clock off reports the same miss rate (``realtime_gw_stage_deadline_misses_total`` over
``realtime_gw_stage_frames_total``). They live here, not in ``server/metrics.py``: the workers count
them, and models do not import the server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import Counter, Histogram

from realtime_gw.models.clock_schedule import DeadlineFirst, PendingStep

STAGE_FRAMES = Counter(
    "realtime_gw_stage_frames_total",
    "Stream steps with a deadline (one stream advanced by one step), per stage and device",
    ["stage", "device"],
)
STAGE_MISSES = Counter(
    "realtime_gw_stage_deadline_misses_total",
    "Stream steps that ended after their 80 ms frame deadline (docs/architecture.md, device clock)",
    ["stage", "device"],
)
CLOCK_WAIT = Histogram(
    "realtime_gw_device_clock_wait_seconds",
    "Time a ready step waited for its device clock to grant it the device",
    ["stage", "device"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)

CLOCK_HANDOFF = Histogram(
    "realtime_gw_device_clock_handoff_seconds",
    "From a grant to the granted thread starting its step: the device idles meanwhile (the thread waking, "
    "and taking the GIL from the event loop and the other stages' threads)",
    ["device"],
    buckets=(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05),
)


def normalize_device(device: str) -> str:
    """One name per device: ``cuda`` is the current CUDA device, 0 unless the process chose another."""
    device = str(device)
    return "cuda:0" if device == "cuda" else device


def clocked(device: str, setting: Iterable[str]) -> bool:
    """Whether ``device`` is one of those the ``device_clock`` setting names (``cuda`` names every CUDA
    device, ``cuda:1`` one of them, ``cpu`` the CPU)."""
    device = normalize_device(device)
    for name in setting:
        name = name.strip()
        if (name == "cuda" and device.startswith("cuda")) or normalize_device(name) == device:
            return True
    return False


class Ticket:
    """One step's place at the clock."""

    __slots__ = ("step", "granted", "held", "closed", "granted_at", "started_at")

    def __init__(self, step: PendingStep) -> None:
        self.step = step
        self.granted = threading.Event()
        self.held = False
        self.closed = False
        self.granted_at: float | None = None
        self.started_at: float | None = None
        """When its thread began the step (after the grant); None: still waiting."""


class DeviceClock:
    """Grants one device to one stage step at a time, earliest deadline first."""

    def __init__(
        self, device: str, policy: DeadlineFirst | None = None, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.device = normalize_device(device)
        self.policy = policy or DeadlineFirst()
        self._now = now
        self._lock = threading.Lock()
        self._pending: list[Ticket] = []
        self._holder: Ticket | None = None
        self.granted_order: list[str] = []
        """Stages in the order they were granted, last ``_KEEP`` (tests, diagnostics)."""

    def enter(self, stage: str, due: float, awaited: bool) -> Ticket:
        """A ready step of ``stage`` (any thread); granted at once when the device is free."""
        ticket = Ticket(PendingStep(stage=stage, due=due, awaited=awaited, ready_at=self._now()))
        with self._lock:
            self._pending.append(ticket)
            if self._holder is None:
                self._grant_next()
        return ticket

    def hold(self, ticket: Ticket) -> None:
        """On the step's thread: block until the device is this step's (or the ticket was withdrawn)."""
        ticket.granted.wait()
        ticket.started_at = self._now()
        if ticket.held and ticket.granted_at is not None:
            CLOCK_HANDOFF.labels(self.device).observe(max(0.0, ticket.started_at - ticket.granted_at))

    def leave(self, ticket: Ticket) -> None:
        """The step ended (or will not run under the clock): pass the device on. Idempotent."""
        with self._lock:
            if ticket.closed:
                return
            ticket.closed = True
            if ticket is self._holder:
                self._holder = None
                self._grant_next()
            elif ticket in self._pending:
                self._pending.remove(ticket)
                ticket.granted.set()  # a thread already waiting runs unclocked rather than forever

    @property
    def busy(self) -> bool:
        return self._holder is not None

    def _grant_next(self) -> None:
        now = self._now()
        step = self.policy.choose([t.step for t in self._pending], now)
        if step is None:
            return
        ticket = next(t for t in self._pending if t.step is step)
        self._pending.remove(ticket)
        self._holder, ticket.held, ticket.granted_at = ticket, True, now
        self.granted_order = [*self.granted_order[-_KEEP + 1 :], step.stage]
        CLOCK_WAIT.labels(step.stage, self.device).observe(max(0.0, now - step.ready_at))
        ticket.granted.set()


_KEEP = 64


def count_deadlines(stage: str, device: str, frames: int, missed: int) -> None:
    STAGE_FRAMES.labels(stage, normalize_device(device)).inc(frames)
    STAGE_MISSES.labels(stage, normalize_device(device)).inc(missed)  # a zero too: the series exists


def share_clocks(workers: Iterable[Any], setting: Iterable[str]) -> dict[str, DeviceClock]:
    """One clock per device the setting names, attached to every local worker on it (``clock``)."""
    setting = list(setting)
    clocks: dict[str, DeviceClock] = {}
    for w in workers:
        device = getattr(w, "device", None)
        if device is None or not hasattr(w, "clock") or not clocked(device, setting):
            continue
        key = normalize_device(device)
        w.clock = clocks.setdefault(key, DeviceClock(key))
    return clocks
