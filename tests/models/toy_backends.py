"""Toy backends for stage-worker tests, importable by name so a child process can build them too."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from realtime_gw.models.contract import BackendInfo
from realtime_gw.models.runtime import END_OF_INPUT, NoFreeSlot, StepResult


@dataclass
class Req:
    n: int | None = 3
    """Outputs to generate; None = forever."""
    boom: bool = False
    """The backend's step raises when this request is in the batch."""
    full: bool = False
    """The backend's open raises NoFreeSlot."""


@dataclass(eq=False)
class St:
    req: Req
    made: int = 0
    inputs: list[Any] = field(default_factory=list)
    slot: int | None = None


class Toy:
    """Counts up to ``req.n``; one output per step; echoes pushed inputs as outputs."""

    name = "toy"
    voices = ("toy-voice",)
    warmup_report: dict[str, Any] = {}

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.opened: list[St] = []
        self.released: list[St] = []
        self.threads: set[int] = set()

    def open(self, request: Req) -> St:
        self.threads.add(threading.get_ident())
        if request.full:
            raise NoFreeSlot("toy: full")
        st = St(request)
        self.opened.append(st)
        return st

    def step(self, work: list[tuple[St, list[Any]]]) -> list[StepResult]:
        self.threads.add(threading.get_ident())
        self.batches.append(len(work))
        if any(st.req.boom for st, _ in work):
            raise RuntimeError("kaboom")
        results = []
        for st, inputs in work:
            st.inputs += inputs
            if inputs:
                results.append(StepResult(outputs=list(inputs), done=inputs[-1] is END_OF_INPUT))
                continue
            st.made += 1
            results.append(StepResult(outputs=[st.made], done=st.req.n is not None and st.made >= st.req.n))
        return results

    def release(self, state: St) -> None:
        self.threads.add(threading.get_ident())
        self.released.append(state)

    def has_work(self, state: St) -> bool:
        return state.req.n is None or state.made < state.req.n

    def warmup(self) -> None:
        pass

    def describe(self) -> BackendInfo:
        return BackendInfo(name=self.name, voices=self.voices, warmup_report=self.warmup_report)


class SlotToy(Toy):
    """``Toy`` with a fixed pool of slots, like pocketsphinx's decoders: a full pool refuses ``open``,
    and ``warmup`` takes every slot for one step, as pocketsphinx's does."""

    name = "slot-toy"

    def __init__(self, slots: int = 2, step_s: float = 0.0) -> None:
        super().__init__()
        self.slots = slots
        self.free = list(range(slots))
        self.step_s = step_s
        """How long each step takes (a busy decoder), so requests arrive while one runs."""

    def describe(self) -> BackendInfo:
        info = super().describe()
        return BackendInfo(name=info.name, slots=self.slots, voices=info.voices, warmup_report=info.warmup_report)

    def step(self, work: list[tuple[St, list[Any]]]) -> list[StepResult]:
        time.sleep(self.step_s)
        return super().step(work)

    def open(self, request: Req) -> St:
        if not self.free:
            raise NoFreeSlot(f"{self.name}: no free slot")
        st = super().open(request)
        st.slot = self.free.pop()
        return st

    def release(self, state: St) -> None:
        super().release(state)
        assert state.slot is not None and state.slot not in self.free, "slot released twice"
        self.free.append(state.slot)

    def warmup(self) -> None:
        states = [self.open(Req(n=1)) for _ in range(len(self.free))]
        try:
            self.step([(st, []) for st in states])
        finally:
            for st in states:
                self.release(st)


class GatedSlotToy(SlotToy):
    """``SlotToy`` whose ``open`` waits for ``gate``: the iteration opening a request is still under way
    while the test submits more."""

    name = "gated-slot-toy"

    def __init__(self, slots: int = 2) -> None:
        super().__init__(slots)
        self.gate = threading.Event()
        self.opening = threading.Event()

    def open(self, request: Req) -> St:
        self.opening.set()
        self.gate.wait(5.0)
        return super().open(request)


class WarmingToy(SlotToy):
    """``SlotToy`` whose warm-up fills its report, as a real backend's does."""

    name = "warming-toy"

    def warmup(self) -> None:
        super().warmup()
        self.warmup_report = {"warm_batches": len(self.batches)}


class TimedToy(Toy):
    """``Toy`` whose step takes ``delay_s`` (a device step's length) and logs ``(name, start, end)`` into a
    log it may share with other backends, to see whether steps of two stages overlapped."""

    def __init__(self, name: str, log: list[tuple[str, float, float]], delay_s: float = 0.01) -> None:
        super().__init__()
        self.name = name
        self.log = log
        self.delay_s = delay_s

    def step(self, work: list[tuple[St, list[Any]]]) -> list[StepResult]:
        start = time.monotonic()
        time.sleep(self.delay_s)
        results = super().step(work)
        self.log.append((self.name, start, time.monotonic()))
        return results


class BlockingToy(Toy):
    """``Toy`` whose step number ``block_at`` (1 = the first) waits for ``go``, with ``stepping`` set
    while it waits; it counts each state's releases and notes any release of a state while a step that
    uses it runs."""

    name = "blocking-toy"

    def __init__(self, block_at: int) -> None:
        super().__init__()
        self.block_at = block_at
        self.stepping = threading.Event()
        self.go = threading.Event()
        self.in_step: set[int] = set()
        self.releases: dict[int, int] = {}
        self.released_mid_step: list[St] = []

    def step(self, work: list[tuple[St, list[Any]]]) -> list[StepResult]:
        self.in_step = {id(st) for st, _ in work}
        try:
            if len(self.batches) + 1 == self.block_at:
                self.stepping.set()
                self.go.wait(5.0)
            return super().step(work)
        finally:
            self.in_step = set()

    def release(self, state: St) -> None:
        if id(state) in self.in_step:
            self.released_mid_step.append(state)
        self.releases[id(state)] = self.releases.get(id(state), 0) + 1
        super().release(state)
