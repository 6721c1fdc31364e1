"""The generic stage worker: one loop serves every model.

The asyncio side (``StageWorker._schedule``) only decides which requests run in the next step; the
worker's own thread only executes ``backend.open/step/release``. All backend state is touched on that
thread alone, one step at a time, so backends need no locks.

Backend contract (see ``Backend``):
- ``open(request) -> state``: allocate per-request state (a slot). Raise ``NoFreeSlot`` when full.
- ``step(work) -> results``: advance every state in ``work`` by one iteration. ``work`` is a list of
  ``(state, inputs)`` where ``inputs`` are the items pushed to that request since its last step.
  Returns one ``StepResult`` per state, in order.
- ``release(state)``: free the slot. Called exactly once per opened state (finish, cancel or fault).
- ``has_work(state) -> bool``: whether the state can advance without new input (a generating stream).
- ``warmup()``: one real inference, so ``/readyz`` means the model really runs.

``Stream.close_input`` delivers ``END_OF_INPUT`` as a final input item.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from prometheus_client import Counter, Gauge, Histogram

log = logging.getLogger(__name__)

S = TypeVar("S")

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
WORKER_REJECTED = Counter("realtime_gw_worker_rejected_total", "Requests refused with no free slot", ["worker"])
WORKER_ERRORS = Counter("realtime_gw_worker_errors_total", "Backend faults", ["worker"])
WORKER_RESTARTS = Counter(
    "realtime_gw_worker_restarts_total", "Worker threads replaced by the supervisor (crash or hang)", ["worker"]
)


class NoFreeSlot(RuntimeError):
    """The worker is full; the caller should tell its client instead of waiting."""


class WorkerFault(RuntimeError):
    """The backend raised while serving this request."""


@dataclass(slots=True)
class StepResult:
    outputs: list[Any] = field(default_factory=list)
    done: bool = False
    error: str | None = None


class Backend(Protocol[S]):
    name: str

    def open(self, request: Any) -> S: ...

    def step(self, work: list[tuple[S, list[Any]]]) -> list[StepResult]: ...

    def release(self, state: S) -> None: ...

    def has_work(self, state: S) -> bool: ...

    def warmup(self) -> None: ...


_END = object()


class _EndOfInput:
    def __repr__(self) -> str:
        return "END_OF_INPUT"


END_OF_INPUT: Any = _EndOfInput()
"""Pushed by ``Stream.close_input``; backends treat it as 'no more input will come'."""


class Stream(Generic[S]):
    """One request's handle: push inputs, iterate outputs, cancel."""

    def __init__(self, worker: StageWorker, request: Any, max_backlog: int) -> None:
        self._worker = worker
        self.request = request
        self.state: S | None = None
        self.pending: list[Any] = []
        self.input_closed = False
        self.cancelled = False
        self.finished = False
        self.steps = 0
        """Backend steps this request has had; 0 = still waiting for its first output."""
        self.last_step = 0
        """The worker iteration that last advanced it (for round-robin order)."""
        self._max_backlog = max_backlog
        self._outputs: deque[Any] = deque()
        self._readable = asyncio.Event()
        self._error: BaseException | None = None

    # -- caller side -------------------------------------------------------------------------------
    def push(self, item: Any) -> None:
        if self.cancelled or self.finished:
            return
        self.pending.append(item)
        self._worker.wake()

    def close_input(self) -> None:
        """No more pushes; the backend receives ``END_OF_INPUT`` as the last input item."""
        if self.input_closed or self.cancelled or self.finished:
            return
        self.input_closed = True
        self.pending.append(END_OF_INPUT)
        self._worker.wake()

    def cancel(self) -> None:
        if self.cancelled or self.finished:
            return
        self.cancelled = True
        self._outputs.clear()
        self._readable.set()
        self._worker.wake()

    @property
    def backlog(self) -> int:
        return len(self._outputs)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[Any]:
        while True:
            while not self._outputs:
                if self.cancelled:
                    return
                self._readable.clear()
                await self._readable.wait()
            item = self._outputs.popleft()
            self._worker.wake()  # backlog shrank: a paused stream may run again
            if item is _END:
                if self._error is not None:
                    raise self._error
                return
            yield item

    async def collect(self) -> list[Any]:
        return [x async for x in self]

    # -- worker side -------------------------------------------------------------------------------
    def _deliver(self, outputs: list[Any], done: bool, error: str | None) -> None:
        if self.cancelled:
            return
        self._outputs.extend(outputs)
        if error is not None:
            self._error = WorkerFault(error)
        if done or error is not None:
            self.finished = True
            self._outputs.append(_END)
        self._readable.set()

    def _runnable(self, backend: Backend[S]) -> bool:
        if self.cancelled or self.finished or self.state is None:
            return False
        if self.pending:
            return True
        if self._outputs and len(self._outputs) >= self._max_backlog:
            return False  # flow control: the consumer is behind
        return backend.has_work(self.state)


class StageWorker:
    """Queue in, per-request result streams out, one batched backend step per iteration."""

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
    ) -> None:
        self.backend = backend
        self.name = backend.name
        self.device = device
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_active = max_active
        self.max_backlog = max_backlog
        self.step_timeout_s = step_timeout_s
        self.restarts = 0
        self.ready = False
        self._opening: deque[Stream[Any]] = deque()
        self._active: list[Stream[Any]] = []
        self._wake_event: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"worker-{self.name}")
        self._rr = 0  # iteration counter, for round-robin order
        self._last_batch = 0

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self, warmup: bool = True) -> None:
        self._wake_event = asyncio.Event()
        loop = asyncio.get_running_loop()
        if warmup:
            await loop.run_in_executor(self._thread, self.backend.warmup)
        self.ready = True
        self._task = asyncio.create_task(self._schedule(), name=f"worker-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            # Cancel until it is done: before Python 3.12, asyncio.wait_for returns the inner result and
            # drops a cancel that lands just as the step completes, and the loop would then wait forever.
            while not self._task.done():
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=0.01)
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for s in list(self._active) + list(self._opening):
            s.cancel()
        await asyncio.get_running_loop().run_in_executor(self._thread, self._release_all)
        self._thread.shutdown(wait=False, cancel_futures=True)

    def wake(self) -> None:
        if self._wake_event is not None:
            self._wake_event.set()

    # -- submission --------------------------------------------------------------------------------
    def submit(self, request: Any) -> Stream[Any]:
        """Start a request. Raises ``NoFreeSlot`` at once when the worker is full."""
        if len(self._active) + len(self._opening) >= self.max_active:
            WORKER_REJECTED.labels(self.name).inc()
            raise NoFreeSlot(f"{self.name}: no free slot ({self.max_active} requests active)")
        stream: Stream[Any] = Stream(self, request, self.max_backlog)
        self._opening.append(stream)
        WORKER_QUEUE.labels(self.name).set(len(self._opening))
        self.wake()
        return stream

    @property
    def active_count(self) -> int:
        return len(self._active) + len(self._opening)

    # -- the loop: decide on the event loop, execute on the worker thread --------------------------
    async def _schedule(self) -> None:
        assert self._wake_event is not None
        loop = asyncio.get_running_loop()
        while True:
            to_open = [s for s in self._opening if not s.cancelled]
            self._opening.clear()
            to_release = [s for s in self._active if s.cancelled or s.finished]
            if to_release:
                self._active = [s for s in self._active if not (s.cancelled or s.finished)]
            runnable = [s for s in self._active if s._runnable(self.backend)]
            if not (to_open or to_release or runnable):
                self._wake_event.clear()
                await self._wake_event.wait()
                continue
            waiting = len(runnable) + len(to_open)
            if self.max_wait_s and waiting < self.max_batch and self._last_batch > 1 and not to_release:
                # Give concurrent sessions a moment to join this step (bounded batching delay) — only
                # when the last step was shared; a lone client never pays the window.
                self._wake_event.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake_event.wait(), self.max_wait_s)
                to_open += [s for s in self._opening if not s.cancelled]
                self._opening.clear()
                runnable = [s for s in self._active if s._runnable(self.backend)]
            batch = self._pick(runnable)
            work = []
            for s in batch + to_open:
                # Inputs are taken here, on the loop thread that pushes them; new requests get theirs
                # back below if they could not join this step.
                work.append((s, s.pending))
                s.pending = []
            self._wake_event.clear()
            try:
                opened, work, results = await asyncio.wait_for(
                    loop.run_in_executor(self._thread, self._execute, to_open, work, to_release),
                    self.step_timeout_s,
                )
            except asyncio.TimeoutError:
                await self._restart(f"{self.name}: step exceeded {self.step_timeout_s:g} s", to_open, abandon=True)
                continue
            except BaseException as e:  # the thread died outside per-request handling
                if isinstance(e, asyncio.CancelledError):
                    raise
                log.exception("worker %s thread failed", self.name)
                await self._restart(f"{self.name}: worker failed ({type(e).__name__})", to_open, abandon=False)
                continue
            for s, err, unused_inputs in opened:
                if err is None:
                    self._active.append(s)
                    s.pending = unused_inputs + s.pending
                else:
                    s._deliver([], True, err)
            for (s, _), r in zip(work, results, strict=True):
                s._deliver(r.outputs, r.done, r.error)
            self._last_batch = len(work)
            WORKER_ACTIVE.labels(self.name).set(len(self._active))
            WORKER_QUEUE.labels(self.name).set(len(self._opening))

    async def _restart(self, reason: str, opening: list[Stream[Any]], abandon: bool) -> None:
        """Supervisor: fail every request in flight, replace the worker thread, warm up again.

        A hung thread cannot be killed; it is abandoned (its late results are never read) and its
        states are dropped rather than released on a thread that may still be using them."""
        WORKER_ERRORS.labels(self.name).inc()
        WORKER_RESTARTS.labels(self.name).inc()
        self.restarts += 1
        self.ready = False
        log.error("%s; restarting the worker", reason)
        failed = self._active + opening
        self._active = []
        for s in failed:
            s._deliver([], True, reason)
        old = self._thread
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"worker-{self.name}")
        old.shutdown(wait=False, cancel_futures=True)
        loop = asyncio.get_running_loop()
        if not abandon:
            await loop.run_in_executor(self._thread, self._release_states, [s.state for s in failed])
        for s in failed:
            s.state = None
        try:
            await asyncio.wait_for(loop.run_in_executor(self._thread, self.backend.warmup), self.step_timeout_s)
            self.ready = True
        except Exception:
            log.exception("worker %s: warm-up after restart failed; it stays not ready", self.name)
        WORKER_ACTIVE.labels(self.name).set(0)

    def _release_states(self, states: list[Any]) -> None:
        for state in states:
            if state is None:
                continue
            try:
                self.backend.release(state)
            except Exception:
                log.exception("worker %s release failed", self.name)

    def _pick(self, runnable: list[Stream[Any]]) -> list[Stream[Any]]:
        """Requests still waiting for their first output go first (time to first audio), then the
        least recently advanced: a long stream never starves a new one."""
        self._rr += 1
        chosen = sorted(runnable, key=lambda s: (s.steps > 0, s.last_step))[: self.max_batch]
        for s in chosen:
            s.steps += 1
            s.last_step = self._rr
        return chosen

    def _execute(
        self,
        to_open: list[Stream[Any]],
        work: list[tuple[Stream[Any], list[Any]]],
        to_release: list[Stream[Any]],
    ) -> tuple[
        list[tuple[Stream[Any], str | None, list[Any]]], list[tuple[Stream[Any], list[Any]]], list[StepResult]
    ]:
        """Runs on the worker thread: releases first (frees slots), then opens, then one step.

        ``work`` ends with the new requests and their inputs; a new request joins this very step when
        it can run and the batch has room (one-shot requests answer in one iteration, not two)."""
        for s in to_release:
            self._release(s)
        fresh = {id(s): inputs for s, inputs in work[len(work) - len(to_open) :]}
        work = work[: len(work) - len(to_open)]
        opened: list[tuple[Stream[Any], str | None, list[Any]]] = []
        for s in to_open:
            inputs = fresh[id(s)]
            try:
                s.state = self.backend.open(s.request)
            except NoFreeSlot as e:
                WORKER_REJECTED.labels(self.name).inc()
                opened.append((s, str(e), []))
                continue
            except Exception as e:  # bad request content: fail this request only
                log.warning("worker %s open failed: %s", self.name, e)
                opened.append((s, f"{self.name}: {e}", []))
                continue
            if len(work) < self.max_batch and (inputs or self.backend.has_work(s.state)):
                work.append((s, inputs))
                s.steps += 1
                opened.append((s, None, []))
            else:
                opened.append((s, None, inputs))
        results: list[StepResult] = []
        if work:
            t0 = time.perf_counter()
            try:
                results = self.backend.step([(s.state, inputs) for s, inputs in work])
            except Exception as e:
                log.exception("worker %s step raised", self.name)
                WORKER_ERRORS.labels(self.name).inc()
                results = [StepResult(done=True, error=f"{self.name}: {e}") for _ in work]
            WORKER_STEP_SECONDS.labels(self.name).observe(time.perf_counter() - t0)
            WORKER_BATCH.labels(self.name).observe(len(work))
            for (s, _), r in zip(work, results, strict=True):
                if r.done or r.error is not None:
                    self._release(s)
        return opened, work, results

    def _release(self, s: Stream[Any]) -> None:
        if s.state is None:
            return
        state, s.state = s.state, None
        try:
            self.backend.release(state)
        except Exception:
            log.exception("worker %s release failed", self.name)

    def _release_all(self) -> None:
        for s in self._active:
            self._release(s)
        self._active.clear()
