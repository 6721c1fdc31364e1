"""A front-end's view of each replica of a remote stage (``client.RemoteStage``): its streams there
(``Entry``), what the replica last reported (``Replica``: load, incarnation, description, the order of its
answers) and the free slots a new stream may go to."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from realtime_gw.models.remote.metrics import (
    REMOTE_ACTIVE,
    REMOTE_FAULTS,
    REMOTE_FREE,
    REMOTE_FRONTENDS,
    REMOTE_QUEUE,
    REMOTE_READY,
)
from realtime_gw.models.remote.wire import Batch, Described, Load, Outbound
from realtime_gw.models.runtime import Stream

log = logging.getLogger(__name__)

RETRY_S = 0.2
"""Pause between pings to a replica that failed (Ray is restarting it)."""
PING_S = 0.5
"""How long a ping to a failed replica is waited for before the next is sent. A call made while Ray
restarts the actor fails only after Ray's grace for a dead actor's calls (1.5-2 s measured here), even
when the new actor is up by then; a call made once it is up answers in milliseconds."""
PINGS = 8
"""Pings before the next poll is sent anyway (~6 s)."""


@dataclass(eq=False)
class Entry:
    """One of this front-end's streams, as the sender sees it."""

    sid: int
    stream: Stream[Any]
    replica: Replica
    tried: list[Replica] = field(default_factory=list)
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
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    """A replica accepted its open, or it ended before one did (``RemoteStage.open_stream`` waits)."""


@dataclass(eq=False)
class Replica:
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

    def arrived(self, batch: Batch) -> tuple[bool, list[Batch]]:
        """Whether ``batch`` shows the actor dropped this front-end (its lease ran out), and the answers
        to apply now, in the actor's order (two polls' answers may cross)."""
        record, lease_lost = (batch.incarnation, batch.record), False
        if record != self.record:
            if record in self.old_records:
                return (
                    False,
                    [],
                )  # a late answer from before a restart or an expired lease: its streams are gone
            old, self.record, self.expected, self.early = self.record, record, 1, {}
            if old is not None:
                self.old_records.add(old)
                # A new record of the same incarnation: the actor dropped this front-end when its lease ran
                # out, and every stream it held there (``batch.lost`` says so too, but only while the actor
                # still remembers the front-end: not after a long stall).
                lease_lost = old[0] == batch.incarnation
        if self.expected is None:
            self.expected = batch.seq
        if batch.seq < self.expected:  # crossed a failed poll's resync: nothing to wait for
            return lease_lost, [batch]
        self.early[batch.seq] = batch
        ready = []
        while (answer := self.early.pop(self.expected, None)) is not None:
            self.expected += 1
            ready.append(answer)
        return lease_lost, ready

    def take(self, d: Described, mismatch: str | None, stage: str) -> None:
        """This incarnation's description; ``mismatch``: why its settings differ from the front-end's
        (not a crash of the front-end: the replica is left out until it changes)."""
        if mismatch is not None:
            log.error("%s: replica %d not used: %s", stage, self.index, mismatch)
        self.described, self.mismatch = d.incarnation, mismatch
        self.update_ready(stage)

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
        first answer asks anew). Ends the ``describing`` its caller set."""
        try:
            d: Described = await self.actor.describe.remote()
            return d
        except Exception as e:
            log.warning("%s replica %d: describe failed: %s", stage, self.index, e)
            return None
        finally:
            self.describing = False

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


def free_slots(replicas: list[Replica], entries: Iterable[Entry]) -> list[int | None]:
    """Each replica's free slots as last reported, less the streams sent its way since (None: not
    ready)."""
    unconfirmed = {r.index: 0 for r in replicas}
    for e in entries:
        if not e.confirmed:
            unconfirmed[e.replica.index] += 1
    return [
        r.load.free_slots - unconfirmed[r.index] if r.ready and r.load is not None else None for r in replicas
    ]
