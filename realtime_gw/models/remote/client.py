"""The front-end's side of a remote stage: a ``StageWorker`` look-alike whose work runs in Ray actors.

``RemoteStage.submit(request)`` returns an ordinary ``runtime.Stream`` at once, so sessions and the
transport cannot tell a remote stage from a local one. The stream goes to the ready replica with the
most free slots (as last reported) and stays there; one that answers "no free slot" passes it on to
the next, and when none is left the stream ends with ``NoFreeSlot`` (the transport's refusal path).

Per replica, two loops carry every stream of this front-end: a sender (one ``send`` call with all
opens, inputs, cancels and flow-control changes since the last one) and a long poll (``next_batch``:
all results since the last poll, at most one message per worker step). A replica that dies (the call
fails, or it answers from a new incarnation after Ray restarted it) fails the streams it held with
``WorkerFault``; new streams go to the live replicas meanwhile. A restarted replica is described again
(its backend's description, its settings checked) before new streams go to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Gauge, Histogram

from realtime_gw.config import ConfigError
from realtime_gw.models.contract import BackendInfo, NoFreeSlot, RequestRefused, WorkerFault
from realtime_gw.models.remote.routing import replica_order
from realtime_gw.models.remote.settings import settings_mismatch
from realtime_gw.models.remote.wire import Batch, Described, Load, Outbound, RefusalText
from realtime_gw.models.runtime import SlotFreed, Stream

log = logging.getLogger(__name__)

POLL_S = 0.2
"""Longest a poll waits for results: the front-end's heartbeat (well inside ``ray_lease_s``)."""
POLLS = 2
"""Polls in flight per replica: one waits at the actor while the other's answer travels, so results
wait for no round trip."""
RETRY_S = 0.2
"""Pause between pings to a replica that failed (Ray is restarting it)."""
PING_S = 0.5
"""How long a ping to a failed replica is waited for before the next is sent. A call made while Ray
restarts the actor fails only after Ray's grace for a dead actor's calls (1.5-2 s measured here), even
when the new actor is up by then; a call made once it is up answers in milliseconds."""
PINGS = 8
"""Pings before the next poll is sent anyway (~6 s)."""

REMOTE_READY = Gauge(
    "realtime_gw_remote_worker_ready", "Remote replica warmed up and reachable", ["worker", "replica"]
)
REMOTE_FREE = Gauge(
    "realtime_gw_remote_worker_free_slots", "Free slots of a remote replica", ["worker", "replica"]
)
REMOTE_ACTIVE = Gauge(
    "realtime_gw_remote_worker_active_requests",
    "Requests a remote replica holds (all front-ends)",
    ["worker", "replica"],
)
REMOTE_QUEUE = Gauge(
    "realtime_gw_remote_worker_queue_depth",
    "Requests waiting to be opened on a remote replica",
    ["worker", "replica"],
)
REMOTE_FRONTENDS = Gauge(
    "realtime_gw_remote_worker_frontends", "Front-ends using a remote replica", ["worker", "replica"]
)
REMOTE_DELIVERY = Histogram(
    "realtime_gw_remote_delivery_seconds",
    "A remote worker step's results: handed over in the actor -> in this front-end's stream (wall clocks:"
    " across machines this includes their offset)",
    ["worker"],
    buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25),
)
REMOTE_FAULTS = Gauge(
    "realtime_gw_remote_worker_faults",
    "Replica deaths/restarts seen by this front-end",
    ["worker", "replica"],
)


@dataclass(eq=False)
class _Entry:
    """One of this front-end's streams, as the sender sees it."""

    sid: int
    stream: Stream[Any]
    replica: _Replica
    tried: list[_Replica] = field(default_factory=list)
    opened: bool = False
    """Its open was sent (the replica may still refuse it)."""
    confirmed: bool = False
    """The replica accepted it: its slot shows in the replica's reported load."""
    taken: list[Any] = field(default_factory=list)
    """Inputs sent with the open: given back to the stream if the replica refuses it."""
    received: int = 0
    """Outputs delivered to the stream; ``received - backlog`` of them its reader has taken."""
    acked: int = 0
    """What the replica was last told the reader has taken."""


@dataclass(eq=False)
class _Replica:
    index: int
    actor: Any
    incarnation: str | None = None
    record: tuple[str, int] | None = None
    """(incarnation, record) of the answers being applied; ``seq`` orders them."""
    old_records: set[tuple[str, int]] = field(default_factory=set)
    expected: int | None = 1
    """The next ``seq`` to apply; None after a failed poll (its answer never comes): the next to arrive."""
    early: dict[int, Batch] = field(default_factory=dict)
    """Answers that arrived before an earlier one of the same record."""
    load: Load | None = None
    ready: bool = False
    faults: int = 0
    described: str | None = None
    """The incarnation whose ``describe`` this front-end holds; streams go only to that one."""
    mismatch: str | None = None
    """Why that incarnation's settings differ from this front-end's (None: they agree)."""
    describing: bool = False

    def update_ready(self, stage: str) -> None:
        """Ready: warmed up as last reported, and this incarnation described with settings that agree."""
        ready = (
            self.load is not None
            and self.load.ready
            and self.incarnation is not None
            and self.incarnation == self.described
            and self.mismatch is None
        )
        if ready and not self.ready:
            log.info("%s: replica %d ready (incarnation %s)", stage, self.index, str(self.described)[:8])
        self.ready = ready
        self.export(stage)

    def export(self, stage: str) -> None:
        labels = (stage, str(self.index))
        load = self.load or Load()
        REMOTE_READY.labels(*labels).set(1 if self.ready else 0)
        REMOTE_FREE.labels(*labels).set(load.free_slots if self.ready else 0)
        REMOTE_ACTIVE.labels(*labels).set(load.active)
        REMOTE_QUEUE.labels(*labels).set(load.queue)
        REMOTE_FRONTENDS.labels(*labels).set(load.frontends)
        REMOTE_FAULTS.labels(*labels).set(self.faults)

    async def describe(self, stage: str) -> Described | None:
        """The actor's description, or None when the call fails (it died again: its next incarnation's
        first answer asks anew)."""
        try:
            d: Described = await self.actor.describe.remote()
            return d
        except Exception as e:
            log.warning("%s replica %d: describe failed: %s", stage, self.index, e)
            return None

    async def until_reachable(self) -> None:
        """Until the actor answers a ping, or ``PINGS`` went unanswered in time: polls resume as soon as
        its restart is up (a poll itself cannot be abandoned on a timeout: its answer takes this
        front-end's results), and a live actor too slow for ``PING_S`` is polled all the same."""
        for _ in range(PINGS):
            await asyncio.sleep(RETRY_S)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.actor.ping.remote(), PING_S)
                return

    async def cancel(self, frontend_id: str, sids: list[int]) -> None:
        with contextlib.suppress(Exception):
            await self.actor.send.remote(frontend_id, Outbound(cancels=sids))


class RemoteStage:
    """What ``registry.Workers`` holds for a stage served by Ray actors (``StageWorker``'s interface)."""

    def __init__(
        self, role: str, actors: list[Any], settings: dict[str, Any] | None = None, namespace: str = ""
    ) -> None:
        """``settings``: this front-end's ``settings.stage_settings`` for ``role``; ``start`` refuses
        actors built from others (None: not checked)."""
        self.role = role
        self.settings = settings
        self.namespace = namespace
        self.name = f"remote-{role}"
        self.frontend_id = uuid.uuid4().hex
        self.replicas = [_Replica(i, a) for i, a in enumerate(actors)]
        self.info = BackendInfo(name=self.name)  # the hosted backend's, as the replicas last gave it
        self.max_backlog, self.ack_every = 64, 16
        self.restarts = 0
        self._entries: dict[int, _Entry] = {}
        self._sids = itertools.count(1)
        self._wake: asyncio.Event | None = None
        self._slot_freed: SlotFreed | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._calls: set[asyncio.Task[None]] = set()
        """One-off calls of their own (cancels of failed streams, describes of restarted replicas)."""

    # -- StageWorker's interface -------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return any(r.ready for r in self.replicas)

    @property
    def max_active(self) -> int:
        return sum(r.load.max_active for r in self.replicas if r.load is not None)

    @property
    def active_count(self) -> int:
        return len(self._entries)

    def describe(self) -> BackendInfo:
        return self.info

    async def start(self, warmup: bool = True) -> None:
        """Join every replica (creating it warms it up: ``warmup`` is the actor's config's)."""
        self._wake, self._slot_freed = asyncio.Event(), SlotFreed()
        described: list[Described] = await asyncio.gather(*(r.actor.describe.remote() for r in self.replicas))
        for r, d in zip(self.replicas, described, strict=True):
            r.described = d.incarnation
            if self.settings is not None:
                why = settings_mismatch(self.role, self.settings, d.settings, self.namespace)
                if why is not None:
                    raise ConfigError(why)
        self.info, self.max_backlog = described[0].info, described[0].max_backlog
        # Reads are acknowledged a quarter window at a time: a stream never waits on an ack while a
        # quarter of its window is left, and there is one ack per quarter window, not per output.
        self.ack_every = max(1, self.max_backlog // 4)
        # A first poll that does not wait: each replica's load, so ``ready`` and routing hold at once.
        batches = await asyncio.gather(
            *(r.actor.next_batch.remote(self.frontend_id, 0.0) for r in self.replicas)
        )
        for replica, batch in zip(self.replicas, batches, strict=True):
            self._receive(replica, batch)
        self._tasks = [asyncio.create_task(self._send_loop(), name=f"{self.name}-send")]
        self._tasks += [
            asyncio.create_task(self._poll_loop(r), name=f"{self.name}-poll-{r.index}")
            for r in self.replicas
            for _ in range(POLLS)
        ]

    async def stop(self) -> None:
        for task in [*self._tasks, *self._calls]:
            task.cancel()
        for entry in list(self._entries.values()):
            entry.stream.cancel()
        self._entries.clear()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                asyncio.gather(*(r.actor.leave.remote(self.frontend_id) for r in self.replicas)), 2.0
            )

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def submit(self, request: Any) -> Stream[Any]:
        order = replica_order(self._free_slots())
        if not order:
            live = sum(r.ready for r in self.replicas)
            why = "every replica is full" if live else "no replica is ready (restarting?)"
            raise NoFreeSlot(f"{self.name}: no free slot ({why})")
        stream: Stream[Any] = Stream(self, request, self.max_backlog)  # type: ignore[arg-type]
        sid = next(self._sids)
        replica = self.replicas[order[0]]
        self._entries[sid] = _Entry(sid, stream, replica, tried=[replica])
        self.wake()
        return stream

    async def slot_freed(self, timeout: float) -> bool:
        assert self._slot_freed is not None, "remote stage not started"
        return await self._slot_freed.wait(timeout)

    # -- sender: one call per replica with everything since the last ------------------------------
    async def _send_loop(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            messages = self._collect()
            if messages:
                await asyncio.gather(*(self._send(r, m, opened) for r, (m, opened) in messages.items()))

    def _collect(self) -> dict[_Replica, tuple[Outbound, list[_Entry]]]:
        messages: dict[_Replica, tuple[Outbound, list[_Entry]]] = {}
        for sid, e in list(self._entries.items()):
            s = e.stream
            if s.finished and not s.cancelled:
                continue  # its end came from the replica; the entry left with it
            msg, opened = messages.setdefault(e.replica, (Outbound(), []))
            if s.cancelled:
                self._forget(sid)
                if e.opened:
                    msg.cancels.append(sid)
                continue
            if not e.opened:
                e.opened, e.taken, s.pending = True, s.pending, []
                msg.opens.append((sid, s.request, e.taken))
                opened.append(e)
            elif s.pending:
                msg.inputs.append((sid, s.pending))
                s.pending = []
            taken = e.received - s.backlog
            if taken - e.acked >= self.ack_every:
                msg.acks.append((sid, taken))
                e.acked = taken
        return {r: (m, o) for r, (m, o) in messages.items() if m}

    async def _send(self, replica: _Replica, msg: Outbound, opened: list[_Entry]) -> None:
        try:
            refused = await replica.actor.send.remote(self.frontend_id, msg)
        except Exception as e:  # the replica died: its poll loop fails what it held
            log.warning("%s replica %d: send failed: %s", self.name, replica.index, e)
            refused = [(en.sid, f"{self.name}: replica {replica.index} unreachable") for en in opened]
        for entry in opened:
            entry.confirmed = True
        for sid, reason in refused:
            if (entry := self._entries.get(sid)) is not None:
                self._next_replica(entry, reason)

    def _next_replica(self, entry: _Entry, reason: str) -> None:
        """Refused: the next replica with room, or the end of the stream with ``NoFreeSlot``."""
        entry.stream.pending = entry.taken + entry.stream.pending
        entry.taken, entry.opened, entry.confirmed = [], False, False
        for i in replica_order(self._free_slots()):
            replica = self.replicas[i]
            if replica not in entry.tried:
                entry.replica = replica
                entry.tried.append(replica)
                self.wake()
                return
        self._forget(entry.sid)
        entry.stream._deliver([], True, reason)
        entry.stream._error = NoFreeSlot(reason)  # a refusal, not a fault: the transport's refusal path

    def _free_slots(self) -> list[int | None]:
        """Each replica's free slots as last reported, less the streams sent its way since (None: not
        ready)."""
        unconfirmed = {r.index: 0 for r in self.replicas}
        for e in self._entries.values():
            if not e.confirmed:
                unconfirmed[e.replica.index] += 1
        return [
            r.load.free_slots - unconfirmed[r.index] if r.ready and r.load is not None else None
            for r in self.replicas
        ]

    def _forget(self, sid: int) -> None:
        if self._entries.pop(sid, None) is not None:
            self._slots_returned()

    def _slots_returned(self) -> None:
        if self._slot_freed is not None:
            self._slot_freed.notify()

    # -- long poll: every result for this front-end, one message per step -------------------------
    async def _poll_loop(self, replica: _Replica) -> None:
        while True:
            try:
                batch: Batch = await replica.actor.next_batch.remote(self.frontend_id, POLL_S)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if replica.ready or replica.incarnation is not None:
                    self._replica_failed(
                        replica, f"{self.name}: worker replica {replica.index} died ({type(e).__name__})"
                    )
                    replica.incarnation = None
                replica.expected = None
                await replica.until_reachable()
                continue
            self._receive(replica, batch)

    def _receive(self, replica: _Replica, batch: Batch) -> None:
        """Apply answers in the order the actor gave them (two polls' answers may cross)."""
        record = (batch.incarnation, batch.record)
        if record != replica.record:
            if record in replica.old_records:
                return  # a late answer from before a restart or an expired lease: its streams are gone
            old, replica.record, replica.expected, replica.early = replica.record, record, 1, {}
            if old is not None:
                replica.old_records.add(old)
                if old[0] == batch.incarnation:
                    # A new record of the same incarnation: the actor dropped this front-end when its
                    # lease ran out, and every stream it held there (``batch.lost`` says so too, but
                    # only while the actor still remembers the front-end: not after a long stall).
                    self._replica_failed(
                        replica, f"{self.name}: this front-end's lease on replica {replica.index} expired"
                    )
        if replica.expected is None:
            replica.expected = batch.seq
        if batch.seq < replica.expected:  # crossed a failed poll's resync: nothing to wait for
            self._apply(replica, batch)
            return
        replica.early[batch.seq] = batch
        while (ready := replica.early.pop(replica.expected, None)) is not None:
            replica.expected += 1
            self._apply(replica, ready)

    def _apply(self, replica: _Replica, batch: Batch) -> None:
        if replica.incarnation not in (None, batch.incarnation):
            self._replica_failed(replica, f"{self.name}: worker replica {replica.index} restarted")
        replica.incarnation = batch.incarnation
        if replica.described != batch.incarnation:
            self._describe(replica)
        now = time.time()
        delivery = REMOTE_DELIVERY.labels(self.name)
        for sid, outputs, done, error, posted_at in batch.results:
            delivery.observe(max(0.0, now - posted_at))
            entry = self._entries.get(sid)
            if entry is None or entry.replica is not replica:
                continue  # cancelled here meanwhile
            fault = RequestRefused if isinstance(error, RefusalText) else WorkerFault
            entry.stream._deliver(outputs, done, error, fault)
            entry.received += len(outputs)
            if done or error is not None:
                self._forget(sid)
        replica.load = batch.load
        replica.update_ready(self.name)
        if batch.load.free_slots:
            self._slots_returned()  # maybe freed by another front-end: waiters try again

    def _describe(self, replica: _Replica) -> None:
        """Describe a restarted replica again, in a call of its own (the poll loop goes on): its backend's
        description (voices, policy spec, warm-up report) may have changed; its settings must still agree."""
        if replica.describing:
            return
        replica.describing = True

        async def describe() -> None:
            try:
                d = await replica.describe(self.name)
            finally:
                replica.describing = False
            if d is not None:
                self._described(replica, d)

        self._call(describe(), f"{self.name}-describe-{replica.index}")

    def _described(self, replica: _Replica, d: Described) -> None:
        mine = self.settings
        why = None if mine is None else settings_mismatch(self.role, mine, d.settings, self.namespace)
        if why is not None:  # not a crash of this front-end: that replica is left out until it changes
            log.error("%s: replica %d not used: %s", self.name, replica.index, why)
        else:  # replicas agree on settings: the freshest description stands for all
            self.info = d.info
        replica.described, replica.mismatch = d.incarnation, why
        replica.update_ready(self.name)

    def _replica_failed(self, replica: _Replica, reason: str) -> None:
        log.error("%s; failing its streams", reason)
        replica.ready = False
        replica.faults += 1
        self.restarts += 1
        failed: list[int] = []
        for entry in [e for e in self._entries.values() if e.replica is replica]:
            if entry.opened:
                self._forget(entry.sid)
                entry.stream._deliver([], True, reason)
                failed.append(entry.sid)
            else:
                self._next_replica(entry, reason)  # not sent yet: another replica may take it
        if failed:
            # Cancelled there too (a no-op unless it opened them after the restart or lost lease: they would
            # hold their slots for good), in a call of its own: one to a restarting replica waits for it.
            self._call(replica.cancel(self.frontend_id, failed), f"{self.name}-cancel-{replica.index}")
        replica.export(self.name)

    def _call(self, call: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(call, name=name)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
