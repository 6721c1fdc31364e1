"""One worker step's deadline and its turn on the device: the part of ``StageWorker`` that reads the
step's deadline from its streams, waits for the device clock (when its device has one), runs the
iteration on the worker's thread, and afterwards counts the streams whose deadline the step missed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from prometheus_client import Histogram

from realtime_gw.models.clock_schedule import Pacing, StepDeadlines, stream_awaited, stream_due
from realtime_gw.models.contract import Iteration, IterationResult, StepResult
from realtime_gw.models.device_clock import DeviceClock, Ticket, count_deadlines
from realtime_gw.models.stream import Stream
from realtime_gw.protocols.audio import OUTPUT_RATE

STEP_CPU_SECONDS = Histogram(
    "realtime_gw_worker_step_cpu_seconds",
    "CPU time the worker's thread spent in one backend step (vs the step's wall time: the rest is the "
    "device, a child process, or waiting for the GIL)",
    ["worker"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)


class StepRun:
    """One iteration of a worker, from its deadline to its misses."""

    def __init__(
        self,
        worker: str,
        batch: list[Stream[Any]],
        opening: list[Stream[Any]],
        pacing: Pacing,
        clock: DeviceClock | None,
        it: Iteration,
    ) -> None:
        """``batch``: the open streams this step advances (their inputs just taken); ``opening``: the
        requests it opens (those that join the step are advanced too)."""
        self.worker = worker
        self.pacing = pacing
        streams = batch + opening
        self.deadlines = StepDeadlines([stream_due(s.times, pacing) for s in streams])
        self._due_of = {id(s): d for s, d in zip(streams, self.deadlines.dues, strict=True)}
        self._opening = {id(s) for s in opening}
        awaited = any(stream_awaited(s.times, pacing) for s in streams)
        for s in batch:
            s.times.waiting_since = None  # their inputs are taken; the next push starts a new wait
        self.clock = clock if (it.open or it.work) else None
        self.ticket: Ticket | None = (
            self.clock.enter(worker, self.deadlines.due, awaited) if self.clock is not None else None
        )
        self.ended = 0.0
        self.cpu_s = 0.0

    def run(self, iterate: Callable[[Iteration], IterationResult], it: Iteration) -> IterationResult:
        """On the worker's thread: wait for the device (if its clock is shared), run, pass it on."""
        if self.clock is not None and self.ticket is not None:
            self.clock.hold(self.ticket)
        cpu = time.thread_time()
        try:
            return iterate(it)
        finally:
            self.cpu_s = time.thread_time() - cpu
            self.ended = time.monotonic()
            if self.clock is not None and self.ticket is not None:
                self.clock.leave(self.ticket)

    async def wait(self, running: Future[IterationResult], timeout_s: float) -> IterationResult:
        """The step's result. Its deadline (``timeout_s``) runs from when it got the device, not while it
        waited behind other stages' steps; past it, ``asyncio.TimeoutError``."""
        done = asyncio.wrap_future(running)
        limit = timeout_s
        while True:
            finished, _ = await asyncio.wait({done}, timeout=limit)
            if finished:
                return done.result()
            if self.ticket is None:
                raise asyncio.TimeoutError
            started = self.ticket.started_at
            limit = timeout_s if started is None else started + timeout_s - time.monotonic()
            if limit <= 0:
                raise asyncio.TimeoutError

    def abandon(self) -> None:
        """The step hung: its device goes to the next stage (the hung thread's own leave is a no-op)."""
        if self.clock is not None and self.ticket is not None:
            self.clock.leave(self.ticket)

    def withdraw(self, running: Future[IterationResult]) -> None:
        """The worker stops waiting for the step (stopping, or its thread died): give up its place if it
        was never granted, or its grant if its thread never began it (a step that runs leaves itself)."""
        if self.clock is None or self.ticket is None:
            return
        if not self.ticket.held or running.cancel():
            self.clock.leave(self.ticket)

    def settle(self, device: str, stepped: list[Stream[Any]], results: list[StepResult]) -> None:
        """After the step: each stepped stream's times move on; the misses are counted."""
        missed = 0
        for s, r in zip(stepped, results, strict=True):
            missed += self.ended > self._due_of[id(s)]
            if id(s) in self._opening:  # opened and stepped: what it was given is taken
                s.times.waiting_since = self.ended if s.pending else None
            pcm = 0
            if self.pacing is Pacing.OUTPUT:  # TTS frames: 24 kHz PCM16
                pcm = sum(len(o.pcm) for o in r.outputs if isinstance(getattr(o, "pcm", None), bytes))
            s.times.stepped(self.ended, pcm / (2.0 * OUTPUT_RATE))
        if stepped:
            count_deadlines(self.worker, device, len(stepped), missed)
            STEP_CPU_SECONDS.labels(self.worker).observe(self.cpu_s)
