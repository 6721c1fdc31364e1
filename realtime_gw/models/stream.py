"""A request's handle on a stage worker (``Stream``) and the worker's "a slot may be free" notice.

Each stream also keeps the times its deadline is read from (``clock_schedule.StreamTimes``): when its
oldest unread input arrived, when its last step ended, how much audio it has produced.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Generic, Protocol, TypeVar

from realtime_gw.models.clock_schedule import StreamTimes
from realtime_gw.models.contract import END_OF_INPUT, Backend, WorkerFault

S = TypeVar("S")

END = object()
"""Marks the end of a stream's outputs."""


class Worker(Protocol):
    """What a stream needs of its stage worker: to be woken when it has something to run."""

    def wake(self) -> None: ...


class Stream(Generic[S]):
    """One request's handle: push inputs, iterate outputs, cancel."""

    def __init__(self, worker: Worker, request: Any, max_backlog: int) -> None:
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
        self.times = StreamTimes(opened_at=time.monotonic())
        self._outputs: deque[Any] = deque()
        self._readable = asyncio.Event()
        self._error: BaseException | None = None

    # -- caller side -------------------------------------------------------------------------------
    def push(self, item: Any) -> None:
        if self.cancelled or self.finished:
            return
        self.pending.append(item)
        self.times.arrived(time.monotonic())
        self._worker.wake()

    def close_input(self) -> None:
        """No more pushes; the backend receives ``END_OF_INPUT`` as the last input item."""
        if self.input_closed or self.cancelled or self.finished:
            return
        self.input_closed = True
        self.pending.append(END_OF_INPUT)
        self.times.arrived(time.monotonic())
        self.times.input_ended = True
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
            if item is END:
                if self._error is not None:
                    raise self._error
                return
            yield item

    async def collect(self) -> list[Any]:
        return [x async for x in self]

    # -- worker side -------------------------------------------------------------------------------
    def _deliver(
        self, outputs: list[Any], done: bool, error: str | None, fault: type[WorkerFault] = WorkerFault
    ) -> None:
        if self.cancelled:
            return
        self._outputs.extend(outputs)
        if error is not None:
            self._error = fault(error)
        if done or error is not None:
            self.finished = True
            self._outputs.append(END)
        self._readable.set()

    def _runnable(self, backend: Backend[S]) -> bool:
        if self.cancelled or self.finished or self.state is None:
            return False
        if self.pending:
            return True
        if self._outputs and len(self._outputs) >= self._max_backlog:
            return False  # flow control: the consumer is behind
        return backend.has_work(self.state)


class SlotFreed:
    """The notice "a slot may be free": waiters wake at the next ``notify``, one event per generation, so a waiter
    that comes later waits for the next release rather than returning on a stale set event."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> bool:
        """True once notified, False after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()
