"""The generic stage worker: one loop serves every model.

The asyncio side (``StageWorker._schedule``) only decides which requests run in the next step; the
worker's own thread only executes the iteration (``contract.run_iteration``: release, open, one
batched ``step``), or hands it to a hosted backend's child process. All backend state is touched on
that thread (or in that child) alone, one step at a time, so backends need no locks. The backend
contract and the iteration records live in ``models/contract.py``.

A worker with a ``Lockstep`` (speech-to-speech; the VAD, to batch) steps on its clock, not whenever inputs
are ready: each tick, every live stream (VAD: with input) is in one batched step (``models/lockstep.py``).

``Stream.close_input`` delivers ``END_OF_INPUT`` as a final input item. Workers sharing a device may share
its clock (``device_clock``): then each step waits for its turn on the device, earliest deadline first.

``stop`` releases each state exactly once, never while a step that uses it runs: on the worker's thread,
after the step under way (``still_held``), and a step abandoned earlier gives its states back when it
returns (``release_now``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from realtime_gw.models.clock_schedule import Pacing
from realtime_gw.models.contract import (
    END_OF_INPUT,
    Backend,
    BackendInfo,
    HostedBackend,
    Iteration,
    IterationResult,
    NoFreeSlot,
    RequestRefused,
    StepResult,
    WorkerFault,
    is_hosted,
    run_iteration,
    unreleased,
)
from realtime_gw.models.device_clock import DeviceClock
from realtime_gw.models.lockstep import Lockstep, Tick, cut_short, went_idle
from realtime_gw.models.step_timing import StepRun
from realtime_gw.models.stream import SlotFreed, Stream

__all__ = [
    "END_OF_INPUT",
    "Backend",
    "HostedBackend",
    "Iteration",
    "IterationResult",
    "NoFreeSlot",
    "RequestRefused",
    "SlotFreed",
    "StageWorker",
    "StepResult",
    "Stream",
    "WorkerFault",
]

log = logging.getLogger(__name__)

WORKER_ACTIVE = Gauge("realtime_gw_worker_active_requests", "Requests holding backend state", ["worker"])
WORKER_QUEUE = Gauge("realtime_gw_worker_queue_depth", "Requests waiting to be opened", ["worker"])
WORKER_BATCH = Histogram(
    "realtime_gw_worker_batch_size",
    "States advanced per backend step",
    ["worker"],
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64),
)
WORKER_STEP_SECONDS = Histogram(
    "realtime_gw_worker_step_seconds",
    "Wall time of one backend step",
    ["worker"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
WORKER_REJECTED = Counter(
    "realtime_gw_worker_rejected_total", "Requests refused with no free slot", ["worker"]
)
WORKER_ERRORS = Counter("realtime_gw_worker_errors_total", "Backend faults", ["worker"])
TICK_LATENESS = Histogram(
    "realtime_gw_worker_tick_lateness_seconds",
    "Lockstep workers: how long after its deadline each step started",
    ["worker"],
    buckets=(0.0, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08),
)
TICKS_SKIPPED = Counter(
    "realtime_gw_worker_skipped_ticks_total",
    "Lockstep workers: frames whose step never ran (the clock was a whole frame or more behind)",
    ["worker"],
)
WORKER_RESTARTS = Counter(
    "realtime_gw_worker_restarts_total",
    "Worker threads replaced by the supervisor (crash or hang)",
    ["worker"],
)


def take_opening(opening: list[Stream[Any]], freed: SlotFreed) -> list[Stream[Any]]:
    """Empty ``opening`` (the requests waiting to open): those not cancelled meanwhile. The cancelled
    ones' places are free, and a ``slot_freed`` waiter hears it."""
    to_open = [s for s in opening if not s.cancelled]
    if len(to_open) < len(opening):
        freed.notify()
    opening.clear()
    return to_open


class StageWorker:
    """Queue in, per-request result streams out, one batched backend step per iteration. It admits at
    most ``max_active`` requests, and never more than a backend with fixed slots holds (its ``describe``)."""

    stream_type: type[Stream[Any]] = Stream
    """What ``submit`` hands out; a Ray stage actor (``models/remote/actor.py``) relays its streams'
    results to the front-ends that opened them instead of buffering them here."""

    def __init__(
        self,
        backend: Backend[Any],
        *,
        device: str = "cpu",
        max_batch: int = 8,
        max_wait_ms: float = 0.0,
        max_active: int = 64,
        max_backlog: int = 64,
        step_timeout_s: float = 30.0,
        restart_timeout_s: float = 120.0,
        admit: Callable[[Any], str | None] | None = None,
        pacing: Pacing = Pacing.INPUT,
        lockstep: Lockstep | None = None,
    ) -> None:
        self.backend = backend
        self.name = backend.name
        self.device = device
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_active = max_active
        self.max_backlog = max_backlog
        self.step_timeout_s = step_timeout_s
        self.restart_timeout_s = restart_timeout_s
        self.admit = admit
        """Per-request cost bound, checked at submit: the reason a request is refused, or None."""
        self.pacing = pacing  # how its streams' deadlines are read (clock_schedule)
        self.lockstep = lockstep
        self.clock: DeviceClock | None = None  # its device's clock, if shared (device_clock.share_clocks)
        self.restarts = 0
        self.ready = False
        self.hosted = is_hosted(backend)
        self._iterate: Callable[[Iteration], IterationResult] = (
            backend.iterate if self.hosted else lambda it: run_iteration(backend, it)  # type: ignore[attr-defined]
        )
        self._opening: deque[Stream[Any]] = deque()
        self._launching: list[Stream[Any]] = []  # being opened by the iteration under way
        self._active: list[Stream[Any]] = []
        self._stranded = 0  # slots an abandoned step (a hung thread) may hold until it returns
        self._orphans: list[Any] = []
        """States no stream owns any more (left by an abandoned step), released at the next iteration."""
        self._step: tuple[Future[IterationResult], Iteration] | None = None  # the step being awaited
        self._wake_event = asyncio.Event()  # bound to a loop at its first wait, in ``_schedule``
        self._slot_freed = SlotFreed()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._closed = False  # stopped, its final release queued: orphans go back at once
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"worker-{self.name}")
        self._rr = 0  # iteration counter, for round-robin order
        self._last_batch = 0

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self, warmup: bool = True) -> None:
        loop = asyncio.get_running_loop()
        if self.hosted:  # its child runs from the start, warm or not: nothing spawns on the event loop later
            await loop.run_in_executor(self._thread, self.backend.start)  # type: ignore[attr-defined]
        if warmup:
            await loop.run_in_executor(self._thread, self.backend.warmup)
        self.max_active = min(self.max_active, self.backend.describe().slots or self.max_active)
        self.ready = True
        self._task = asyncio.create_task(self._schedule(), name=f"worker-{self.name}")

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._task is not None:
            # Cancel until it is done: before Python 3.12, asyncio.wait_for returns the inner result and
            # drops a cancel that lands just as the step completes, and the loop would then wait forever.
            while not self._task.done():
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=0.01)
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for s in self._active + self._launching + list(self._opening):
            s.cancel()
        held = [s.state for s in self._active if s.state is not None] + self._orphans
        self._active, self._orphans = [], []
        if self.hosted:
            # Not on the worker's thread: a step may still hold it; ending the child ends that step too,
            # and the states die with the child.
            await asyncio.to_thread(self.backend.close)  # type: ignore[attr-defined]
        else:
            await release_at_stop(self._thread, self._iterate, self._step, held, self.step_timeout_s)
        self._closed = True
        self._orphans = release_now(self._thread, self._iterate, self._orphans, self._stranded)

    def wake(self) -> None:
        self._wake_event.set()

    def describe(self) -> BackendInfo:
        """The backend's own description (after ``start``: with its warm-up report)."""
        return self.backend.describe()

    # -- submission --------------------------------------------------------------------------------
    def submit(self, request: Any) -> Stream[Any]:
        """Start a request. Raises ``NoFreeSlot`` at once when the worker is full; a request over the
        worker's cost bound (``admit``) gets a stream that fails with the reason (``RequestRefused``)."""
        if self.active_count >= self.max_active:
            WORKER_REJECTED.labels(self.name).inc()
            raise NoFreeSlot(f"{self.name}: no free slot ({self.max_active} requests active)")
        stream: Stream[Any] = self.stream_type(self, request, self.max_backlog)
        if self.admit is not None and (refusal := self.admit(request)) is not None:
            stream._deliver([], True, refusal, RequestRefused)
            return stream
        self._opening.append(stream)
        WORKER_QUEUE.labels(self.name).set(len(self._opening))
        self.wake()
        return stream

    @property
    def active_count(self) -> int:
        """Every slot the backend may hold (admission counts these, so it never admits what the backend
        refuses); states released next need none: an iteration releases before it opens."""
        return len(self._active) + len(self._launching) + len(self._opening) + self._stranded

    async def slot_freed(self, timeout: float) -> bool:
        """Wait until a request leaves the worker (a slot may be free), at most ``timeout`` seconds."""
        return await self._slot_freed.wait(timeout)

    # -- the loop: decide on the event loop, execute on the worker thread --------------------------
    async def _schedule(self) -> None:
        while True:
            await tick_due(self.lockstep, bool(self._active or self._opening))
            to_open = self._launching = take_opening(self._opening, self._slot_freed)
            to_release = [s for s in self._active if s.cancelled or s.finished]
            if to_release:
                self._active = [s for s in self._active if not (s.cancelled or s.finished)]
                self._slot_freed.notify()
            runnable = [s for s in self._active if s._runnable(self.backend)]
            if not (to_open or to_release or runnable or self._orphans):
                went_idle(self.lockstep)
                self._wake_event.clear()
                await self._wake_event.wait()
                continue
            waiting = len(runnable) + len(to_open)
            if self.max_wait_s and waiting < self.max_batch and self._last_batch > 1 and not to_release:
                # bounded batching delay, only when the last step was shared: a lone client never pays it
                self._wake_event.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake_event.wait(), self.max_wait_s)
                to_open += take_opening(self._opening, self._slot_freed)
                runnable = [s for s in self._active if s._runnable(self.backend)]
            self._rr += 1
            batch = pick(runnable, self.max_batch, self._rr)
            cut_short(self.lockstep, len(batch) < len(runnable))
            # Inputs are taken here, on the loop thread that pushes them; new requests get theirs back
            # below if they could not join this step.
            released = [s.state for s in to_release if s.state is not None] + self._orphans
            opened, work = [(s.request, s.pending) for s in to_open], [(s.state, s.pending) for s in batch]
            it = Iteration(release=released, open=opened, work=work, max_batch=self.max_batch)
            self._orphans = []
            for s in to_release:
                s.state = None
            for s in batch + to_open:
                s.pending = []
            self._wake_event.clear()
            if self.lockstep is not None and (batch or to_open):
                it.due = tick_started(self.name, self.lockstep).due
            step = StepRun(self.name, batch, to_open, self.pacing, self.clock, it)
            running: Future[IterationResult] = self._thread.submit(step.run, self._iterate, it)
            self._step = (running, it)  # if the worker stops now, its states go back after this step
            try:
                result = await step.wait(running, self.step_timeout_s)
            except asyncio.TimeoutError:
                step.abandon()
                reason = f"{self.name}: step exceeded {self.step_timeout_s:g} s"
                await self._restart(reason, to_open, abandoned=(running, it))
                continue
            except BaseException as e:  # the thread (or the child process) died outside per-request handling
                step.withdraw(running)
                if isinstance(e, asyncio.CancelledError):
                    raise
                log.exception("worker %s failed", self.name)
                await self._restart(
                    f"{self.name}: worker failed ({type(e).__name__})", to_open, abandoned=None
                )
                continue
            self._apply(result, batch, to_open, it, step)

    def _apply(
        self,
        result: IterationResult,
        batch: list[Stream[Any]],
        to_open: list[Stream[Any]],
        it: Iteration,
        step: StepRun,
    ) -> None:
        """Route an iteration's outcome to its streams (on the event loop)."""
        self._step = None
        if result.step_seconds is not None:
            WORKER_STEP_SECONDS.labels(self.name).observe(result.step_seconds)
        if result.step_failed:
            WORKER_ERRORS.labels(self.name).inc()
        stepped = list(batch)
        self._launching = []
        for s, o, (_, taken) in zip(to_open, result.opened, it.open, strict=True):
            if o.error is not None:
                if o.no_slot:
                    WORKER_REJECTED.labels(self.name).inc()
                s._deliver([], True, o.error)
                self._slot_freed.notify()
                continue
            s.state = o.state
            self._active.append(s)
            if o.joined:
                s.steps += 1
                stepped.append(s)
            else:
                s.pending = taken + s.pending  # it could not join this step
        if stepped:
            WORKER_BATCH.labels(self.name).observe(len(stepped))
        step.settle(self.device, stepped, result.results)
        for s, r in zip(stepped, result.results, strict=True):
            if r.done or r.error is not None:
                s.state = None  # released next to the backend, in the same iteration: its slot is free now
            s._deliver(r.outputs, r.done, r.error)
        if len(held := [s for s in self._active if s.state is not None]) < len(self._active):
            self._active = held
            self._slot_freed.notify()
        self._last_batch = len(stepped)
        WORKER_ACTIVE.labels(self.name).set(len(self._active))
        WORKER_QUEUE.labels(self.name).set(len(self._opening))

    async def _restart(
        self,
        reason: str,
        opening: list[Stream[Any]],
        abandoned: tuple[Future[IterationResult], Iteration] | None,
    ) -> None:
        """Supervisor: fail every request in flight, give every slot back, warm up again.

        A hosted backend is reset: its child process is killed (a hung step with it) and started
        afresh, so every state it held is gone and every slot is free. A thread cannot be killed: a hung
        one is abandoned, the states it is using are released when (if) its step returns, and there is
        no new warm-up meanwhile (it would compete with the hung step for slots)."""
        self._step = None  # its states go back here, or when it returns (abandoned)
        WORKER_ERRORS.labels(self.name).inc()
        WORKER_RESTARTS.labels(self.name).inc()
        self.restarts += 1
        self.ready = False
        t_fault = asyncio.get_running_loop().time()
        log.error("%s; restarting the worker", reason)
        failed = self._active + opening
        self._active, self._launching = [], []
        for s in failed:
            s._deliver([], True, reason)
        held = [s.state for s in failed if s.state is not None]
        for s in failed:
            s.state = None
        old = self._thread
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"worker-{self.name}")
        old.shutdown(wait=False, cancel_futures=True)
        loop = asyncio.get_running_loop()
        rewarm = True
        if self.hosted:
            self._orphans = []  # they died with the child
            reset: Callable[[], None] = self.backend.reset  # type: ignore[attr-defined]
        elif abandoned is None:
            reset = lambda: self._iterate(Iteration(release=held))  # noqa: E731
        else:
            running, it = abandoned
            in_step = {id(st) for st, _ in it.work}
            now = [st for st in held if id(st) not in in_step]
            self._stranded += len(it.work) + len(it.open)
            reset = lambda: self._iterate(Iteration(release=now))  # noqa: E731
            running.add_done_callback(lambda f: _call_soon(loop, self._adopt_orphans, f, it))
            rewarm = False
        try:
            # Starting a child and warming it up is not a step: it has its own, longer bound.
            await asyncio.wait_for(loop.run_in_executor(self._thread, reset), self.restart_timeout_s)
            if rewarm:
                warmup = loop.run_in_executor(self._thread, self.backend.warmup)
                await asyncio.wait_for(warmup, self.restart_timeout_s)
            self.ready = True
            log.warning("worker %s: ready again %.1f s after the fault", self.name, loop.time() - t_fault)
        except Exception:
            log.exception("worker %s: restart failed; it stays not ready", self.name)
            if self.hosted:  # a child stuck in its warm-up: end it; the next request starts a fresh one
                await asyncio.to_thread(self.backend.close)  # type: ignore[attr-defined]
        WORKER_ACTIVE.labels(self.name).set(0)
        self._slot_freed.notify()

    def _adopt_orphans(self, running: Future[IterationResult], it: Iteration) -> None:
        """An abandoned step finally returned: the states it still holds go back at the next iteration."""
        self._stranded -= len(it.work) + len(it.open)
        self._orphans += left_open(running, it)
        if self._closed:  # stopped: no iteration comes
            self._orphans = release_now(self._thread, self._iterate, self._orphans, self._stranded)
        self._slot_freed.notify()
        self.wake()


def left_open(running: Future[IterationResult], it: Iteration) -> list[Any]:
    """The states an ended step leaves open: never run (cancelled before its thread began it), those it
    was to release and to step; died, those it was stepping (``run_iteration`` freed those it opened);
    returned, those its iteration did not finish (it released the rest)."""
    if running.cancelled():
        return list(it.release) + [st for st, _ in it.work]
    if running.exception() is not None:
        return [st for st, _ in it.work]
    return unreleased(it, running.result())


def still_held(step: tuple[Future[IterationResult], Iteration] | None, held: list[Any]) -> list[Any]:
    """On the worker's thread as it stops, after the step under way then (``step``, if any) ended: what
    is left to release, each state once: ``held`` (the open streams' states and the orphans) except
    those the step was using, and what the step left open."""
    if step is None:
        return held
    running, it = step
    in_step = {id(st) for st, _ in it.work}
    return [st for st in held if id(st) not in in_step] + left_open(running, it)


async def release_at_stop(
    thread: ThreadPoolExecutor,
    iterate: Callable[[Iteration], IterationResult],
    step: tuple[Future[IterationResult], Iteration] | None,
    held: list[Any],
    timeout_s: float,
) -> None:
    """A stopping worker's last release (``still_held``), queued on its one thread, so it runs after the
    step under way (if any) returns. Waited for ``timeout_s`` at most: past it, a hung step keeps the
    thread, and the release still runs (it is not cancelled) if the step returns."""
    final = thread.submit(lambda: iterate(Iteration(release=still_held(step, held))))
    await asyncio.wait({asyncio.wrap_future(final)}, timeout=timeout_s)


def release_now(
    thread: ThreadPoolExecutor,
    iterate: Callable[[Iteration], IterationResult],
    orphans: list[Any],
    stranded: int,
) -> list[Any]:
    """A stopped worker's orphans go back on its thread at once (no iteration comes; what is queued there
    runs first); the thread ends once no abandoned step may return any more. The orphans left: none."""
    if orphans:
        thread.submit(iterate, Iteration(release=orphans))
    if not stranded:
        thread.shutdown(wait=False)
    return []


async def tick_due(lockstep: Lockstep | None, live: bool) -> None:
    """Sleep until the lockstep's next step is due (none: at once); with no stream ``live``, its clock stops."""
    if lockstep is None:
        return
    if not live:
        lockstep.stop()
        return
    await asyncio.sleep(lockstep.wait_s(time.monotonic()))


def tick_started(worker: str, lockstep: Lockstep) -> Tick:
    """A step of the lockstep starts now: how late it starts is counted; its ``due`` goes to the backend
    with the iteration (its frames' lateness is measured from the same deadline)."""
    tick = lockstep.begin(time.monotonic())
    TICK_LATENESS.labels(worker).observe(tick.late_s)
    TICKS_SKIPPED.labels(worker).inc(tick.skipped)
    return tick


def pick(runnable: list[Stream[Any]], max_batch: int, iteration: int) -> list[Stream[Any]]:
    """Requests still waiting for their first output go first (time to first audio), then the least
    recently advanced: a long stream never starves a new one."""
    chosen = sorted(runnable, key=lambda s: (s.steps > 0, s.last_step))[:max_batch]
    for s in chosen:
        s.steps += 1
        s.last_step = iteration
    return chosen


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing left to give back
        loop.call_soon_threadsafe(fn, *args)
