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
from typing import Any

from realtime_gw.config import ConfigError
from realtime_gw.models.contract import BackendInfo, NoFreeSlot, RequestRefused, WorkerFault
from realtime_gw.models.remote.metrics import REMOTE_DELIVERY
from realtime_gw.models.remote.replica import Entry, Replica, free_slots
from realtime_gw.models.remote.routing import replica_order
from realtime_gw.models.remote.settings import settings_mismatch
from realtime_gw.models.remote.wire import Batch, Described, Outbound, RefusalText
from realtime_gw.models.runtime import SlotFreed, Stream

log = logging.getLogger(__name__)

POLL_S = 0.2
"""Longest a poll waits for results: the front-end's heartbeat (well inside ``ray_lease_s``)."""
POLLS = 2
"""Polls in flight per replica: one waits at the actor while the other's answer travels, so results
wait for no round trip."""
ADMIT_ANSWER_S = 5.0
"""Longest a submit-time check waits for a replica (one restarting may warm up for minutes): past it the
check passes, and the open that follows meets the fault or the refusal."""


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
        self.replicas = [Replica(i, a) for i, a in enumerate(actors)]
        self.info = BackendInfo(name=self.name)  # the hosted backend's, as the replicas last gave it
        self.max_backlog, self.ack_every = 64, 16
        self.admits = False
        """The hosted worker checks requests at submit (``check`` asks it)."""
        self.restarts = 0
        self._entries: dict[int, Entry] = {}
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
        first = described[0]
        self.info, self.max_backlog, self.admits = first.info, first.max_backlog, first.admits
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
            entry.answered.set()
        self._entries.clear()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                asyncio.gather(*(r.actor.leave.remote(self.frontend_id) for r in self.replicas)), 2.0
            )

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def submit(self, request: Any) -> Stream[Any]:
        return self._submit(request).stream

    def _submit(self, request: Any) -> Entry:
        order = replica_order(free_slots(self.replicas, self._entries.values()))
        if not order:
            live = sum(r.ready for r in self.replicas)
            why = "every replica is full" if live else "no replica is ready (restarting?)"
            raise NoFreeSlot(f"{self.name}: no free slot ({why})")
        stream: Stream[Any] = Stream(self, request, self.max_backlog)  # type: ignore[arg-type]
        sid = next(self._sids)
        replica = self.replicas[order[0]]
        entry = self._entries[sid] = Entry(sid, stream, replica, tried=[replica])
        self.wake()
        return entry

    async def open_stream(self, request: Any) -> Stream[Any]:
        """``submit``, answered: the stream once a replica holds it (one round trip), or ``NoFreeSlot``
        when every replica is full (by their last reported load, or as each refused it). For a request
        holding a slot for life (a duplex conversation): "full" at once, never a stream failing later."""
        entry = self._submit(request)
        try:
            await entry.answered.wait()
        except BaseException:
            entry.stream.cancel()
            raise
        if isinstance(entry.stream._error, NoFreeSlot):
            raise entry.stream._error
        return entry.stream

    async def check(self, request: Any) -> str | None:
        """Why the hosted worker would refuse ``request`` at submit (its ``admit``, asked of a ready
        replica: they share settings), or None (at once without such a check; a failed call: the open
        that follows meets the fault)."""
        if not self.admits or not (ready := [r for r in self.replicas if r.ready]):
            return None
        try:  # bounded: a replica restarting may warm up for minutes before it answers
            why: str | None = await asyncio.wait_for(ready[0].actor.admit.remote(request), ADMIT_ANSWER_S)
        except Exception as e:
            log.warning("%s replica %d: admit failed: %s", self.name, ready[0].index, e)
            return None
        return why

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

    def _collect(self) -> dict[Replica, tuple[Outbound, list[Entry]]]:
        messages: dict[Replica, tuple[Outbound, list[Entry]]] = {}
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

    async def _send(self, replica: Replica, msg: Outbound, opened: list[Entry]) -> None:
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
        for entry in opened:
            if entry.opened:  # not refused (a refused one is passed on, unopened, or gone)
                entry.answered.set()

    def _next_replica(self, entry: Entry, reason: str) -> None:
        """Refused: the next replica with room, or the end of the stream with ``NoFreeSlot``."""
        entry.stream.pending = entry.taken + entry.stream.pending
        entry.taken, entry.opened, entry.confirmed = [], False, False
        for i in replica_order(free_slots(self.replicas, self._entries.values())):
            replica = self.replicas[i]
            if replica not in entry.tried:
                entry.replica = replica
                entry.tried.append(replica)
                self.wake()
                return
        self._forget(entry.sid)
        entry.stream._deliver([], True, reason)
        entry.stream._error = NoFreeSlot(reason)  # a refusal, not a fault: the transport's refusal path

    def _forget(self, sid: int) -> None:
        if (entry := self._entries.pop(sid, None)) is not None:
            entry.answered.set()
            self._slots_returned()

    def _slots_returned(self) -> None:
        if self._slot_freed is not None:
            self._slot_freed.notify()

    # -- long poll: every result for this front-end, one message per step -------------------------
    async def _poll_loop(self, replica: Replica) -> None:
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

    def _receive(self, replica: Replica, batch: Batch) -> None:
        """Apply answers in the order the actor gave them (``Replica.arrived``)."""
        lease_lost, ready = replica.arrived(batch)
        if lease_lost:
            self._replica_failed(
                replica, f"{self.name}: this front-end's lease on replica {replica.index} expired"
            )
        for answer in ready:
            self._apply(replica, answer)

    def _apply(self, replica: Replica, batch: Batch) -> None:
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

    def _describe(self, replica: Replica) -> None:
        """Describe a restarted replica again, in a call of its own (the poll loop goes on): its backend's
        description (voices, policy spec, warm-up report) may have changed; its settings must still agree."""
        if replica.describing:
            return
        replica.describing = True

        async def describe() -> None:
            if (d := await replica.describe(self.name)) is None:
                return
            mine = self.settings
            why = None if mine is None else settings_mismatch(self.role, mine, d.settings, self.namespace)
            if why is None:  # replicas agree on settings: the freshest description stands for all
                self.info = d.info
            replica.take(d, why, self.name)

        self._call(describe(), f"{self.name}-describe-{replica.index}")

    def _replica_failed(self, replica: Replica, reason: str) -> None:
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
