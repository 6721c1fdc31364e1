"""The Ray actor hosting one stage worker for every front-end of the cluster.

``StageActor`` builds the ordinary ``StageWorker`` for its role (``registry.build_stage``) inside an
async Ray actor, so streams of all front-ends share its batches, slots and flow control. Its streams
are ``_Relay`` s: instead of buffering results for a local reader, each step's results go to the
outbox of the front-end that opened the stream, and that front-end's pending long poll
(``next_batch``) returns them all in one message. A front-end that stops polling for ``ray_lease_s``
is dead: its streams are cancelled and their slots come back.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from realtime_gw.config import GatewayConfig
from realtime_gw.models.contract import END_OF_INPUT, Backend, NoFreeSlot, RequestRefused, WorkerFault
from realtime_gw.models.remote.settings import stage_settings
from realtime_gw.models.remote.wire import Batch, Described, Load, Outbound, RefusalText
from realtime_gw.models.runtime import StageWorker, Stream

log = logging.getLogger(__name__)

EXPIRED_KEEP_LEASES = 10
"""How long (in leases) an expired front-end's id is kept to tell it ``lost``: enough for a stalled one
to come back; one that never does must not stay forever (its client also sees the new record)."""


class _Frontend:
    """One front-end's streams on this actor and the results waiting for its next poll."""

    def __init__(self, record: int) -> None:
        self.record = record
        self.seq = 0
        self.streams: dict[int, _Relay] = {}
        self.outbox: list[tuple[int, list[Any], bool, str | None, float]] = []
        self.posted = asyncio.Event()
        self.seen = time.monotonic()

    def post(self, sid: int, outputs: list[Any], done: bool, error: str | None) -> None:
        self.outbox.append((sid, outputs, done, error, time.time()))
        if done or error is not None:
            self.streams.pop(sid, None)
        self.posted.set()


class _Relay(Stream[Any]):
    """A stream whose results go straight to its front-end's outbox (not buffered here). It advances
    only while fewer than ``max_backlog`` of its outputs are unread (``posted - taken``), the window a
    local stream's own buffer gives."""

    frontend: _Frontend | None = None
    sid = 0
    posted = 0
    taken = 0
    _early: tuple[list[Any], bool, str | None] | None = None

    def bind(self, frontend: _Frontend, sid: int) -> None:
        self.frontend, self.sid = frontend, sid
        frontend.streams[sid] = self
        if self._early is not None:  # refused inside ``submit`` (the worker's cost bound)
            frontend.post(sid, *self._early)

    def _deliver(
        self, outputs: list[Any], done: bool, error: str | None, fault: type[WorkerFault] = WorkerFault
    ) -> None:
        if self.cancelled:
            return
        if error is not None and issubclass(fault, RequestRefused):
            error = RefusalText(error)
        if done or error is not None:
            self.finished = True
        self.posted += len(outputs)
        if self.frontend is None:
            self._early = (outputs, done, error)
        else:
            self.frontend.post(self.sid, outputs, done, error)

    def _runnable(self, backend: Backend[Any]) -> bool:
        return self.posted - self.taken < self._max_backlog and super()._runnable(backend)


class StageActor:
    """Decorated with ``ray.remote`` where it is created (``routing.stage_actors``); this module never
    imports Ray, so it is testable as a plain object."""

    def __init__(
        self, build: Callable[[str, GatewayConfig], StageWorker], role: str, config: GatewayConfig
    ) -> None:
        """``build``: ``registry.build_stage`` (passed in, so this package never imports the registry
        that imports it)."""
        logging.basicConfig(level=config.log_level.upper())
        # This process holds only the stage: its event loop, its worker thread and Ray's own threads
        # pass the GIL around ten times as often as Python's default 5 ms, so a step's results leave
        # without waiting out a busy thread's interval (docs/benchmarks-log.md).
        sys.setswitchinterval(0.0005)
        self.role = role
        self.config = config
        self.lease_s = config.ray_lease_s
        self.incarnation = uuid.uuid4().hex
        self.worker: StageWorker = build(role, config)
        self.worker.stream_type = _Relay
        self.frontends: dict[str, _Frontend] = {}
        self.expired: dict[str, float] = {}
        """Front-ends whose lease ran out while they held streams -> when (monotonic)."""
        self._records = itertools.count(1)
        self._started: asyncio.Task[None] | None = None
        self._reaper: asyncio.Future[None] | None = None

    async def _ready(self) -> None:
        """Started on the first call (an async actor's loop runs only once a call arrives): the warm-up,
        then the reaper of silent front-ends."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        await self.worker.start(warmup=self.config.warmup)
        self._reaper = asyncio.ensure_future(self._reap())
        log.info("stage actor %s (%s) ready", self.role, self.worker.name)

    # -- the front-ends' calls ---------------------------------------------------------------------
    async def describe(self) -> Described:
        await self._ready()
        return Described(
            self.incarnation,
            self.worker.name,
            self.worker.max_backlog,
            self.worker.describe(),
            stage_settings(self.role, self.config),
            admits=self.worker.admit is not None,
        )

    async def admit(self, request: Any) -> str | None:
        """Why the hosted worker would refuse ``request`` at submit (its ``admit``: the check needs what
        only the actor holds, e.g. PersonaPlex's tokenizer and voice store), or None. A front-end asks
        before it gives up what the request replaces (a session's new prompt: the old conversation goes
        on when the new one does not fit)."""
        await self._ready()
        admit = self.worker.admit
        return None if admit is None else admit(request)

    async def send(self, frontend_id: str, msg: Outbound) -> list[tuple[int, str]]:
        """Apply a front-end's changes; answers the opens refused for want of a slot (the front-end
        tries its next replica)."""
        await self._ready()
        frontend = self._frontend(frontend_id)
        refused: list[tuple[int, str]] = []
        for sid, request, inputs in msg.opens:
            try:
                stream = self.worker.submit(request)
            except NoFreeSlot as e:
                refused.append((sid, str(e)))
                continue
            assert isinstance(stream, _Relay)
            stream.bind(frontend, sid)
            _push(stream, inputs)
        for sid, items in msg.inputs:
            if (stream := frontend.streams.get(sid)) is not None:
                _push(stream, items)
        for sid in msg.cancels:
            if (stream := frontend.streams.pop(sid, None)) is not None:
                stream.cancel()
        for sid, taken in msg.acks:
            if (stream := frontend.streams.get(sid)) is not None:
                stream.taken = max(stream.taken, taken)
        if msg.acks:
            self.worker.wake()
        return refused

    async def next_batch(self, frontend_id: str, timeout_s: float) -> Batch:
        """Every result produced for this front-end since its last poll; waits up to ``timeout_s`` for
        one. Each poll renews the front-end's lease. Two polls may wait at once (the front-end keeps
        one here while the other's answer travels): whichever wakes first takes the results."""
        await self._ready()
        lost = self.expired.pop(frontend_id, None) is not None
        frontend = self._frontend(frontend_id)
        if lost:  # "lost" means nothing of the front-end is left here: not even what it opened since
            _cancel_all(frontend)
            frontend.outbox.clear()
        deadline = time.monotonic() + timeout_s
        while not frontend.outbox and (left := deadline - time.monotonic()) > 0:
            frontend.posted.clear()
            try:
                await asyncio.wait_for(frontend.posted.wait(), left)
            except asyncio.TimeoutError:
                break
        results, frontend.outbox = frontend.outbox, []
        frontend.seq += 1
        return Batch(self.incarnation, frontend.record, frontend.seq, self.load(), results, lost)

    async def ping(self) -> str:
        """Answers at once, warm or not: a front-end whose call failed learns the restarted actor is up
        without a call of its own waiting out Ray's grace for a dead actor's calls."""
        return self.incarnation

    async def leave(self, frontend_id: str) -> None:
        """A front-end shutting down in order: its streams end now, not at its lease's end."""
        if (frontend := self.frontends.pop(frontend_id, None)) is not None:
            _cancel_all(frontend)

    def load(self) -> Load:
        w = self.worker
        queue = sum(1 for f in self.frontends.values() for s in f.streams.values() if s.state is None)
        return Load(
            ready=w.ready,
            free_slots=max(0, w.max_active - w.active_count),
            active=w.active_count,
            queue=queue,
            max_active=w.max_active,
            frontends=len(self.frontends),
        )

    def streams_of(self, frontend_id: str) -> int:
        """Streams a front-end holds here (tests: a dead front-end's go away)."""
        frontend = self.frontends.get(frontend_id)
        return len(frontend.streams) if frontend is not None else 0

    # -- internals ---------------------------------------------------------------------------------
    def _frontend(self, frontend_id: str) -> _Frontend:
        frontend = self.frontends.get(frontend_id)
        if frontend is None:
            frontend = self.frontends[frontend_id] = _Frontend(next(self._records))
        frontend.seen = time.monotonic()
        return frontend

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 8)
            self._reap_once(time.monotonic())

    def _reap_once(self, now: float) -> None:
        for frontend_id, frontend in list(self.frontends.items()):
            if now - frontend.seen > self.lease_s:
                log.warning("front-end %s silent for %.1f s: ending its streams", frontend_id, self.lease_s)
                del self.frontends[frontend_id]
                if frontend.streams:
                    self.expired[frontend_id] = now
                _cancel_all(frontend)
        keep_s = EXPIRED_KEEP_LEASES * self.lease_s
        for frontend_id, since in list(self.expired.items()):
            if now - since > keep_s:
                del self.expired[frontend_id]


def _push(stream: Stream[Any], items: list[Any]) -> None:
    for item in items:
        if item is END_OF_INPUT:
            stream.close_input()
        else:
            stream.push(item)


def _cancel_all(frontend: _Frontend) -> None:
    for stream in frontend.streams.values():
        stream.cancel()
    frontend.streams.clear()
