"""The messages between a front-end (``client.RemoteStage``) and a stage actor (``actor.StageActor``).

Two calls per front-end carry everything, whatever the number of streams: ``send`` (every open, input,
cancel and flow-control change since the last one) and ``next_batch`` (a long poll answered with every
result the worker's steps produced for that front-end since the last poll: one message per step when
the front-end keeps up). Plain dataclasses: Ray pickles them (numpy arrays out of band).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from realtime_gw.models.contract import BackendInfo


class RefusalText(str):
    """A result's error that is the worker's refusal of the request (its ``admit``): the front-end's
    stream raises ``RequestRefused`` for it, as a local worker's would, not ``WorkerFault``."""


@dataclass(slots=True)
class Outbound:
    """A front-end's changes since its last ``send``; ``sid`` s are the front-end's own stream ids."""

    opens: list[tuple[int, Any, list[Any]]] = field(default_factory=list)
    """(sid, request, inputs pushed so far)"""
    inputs: list[tuple[int, list[Any]]] = field(default_factory=list)
    cancels: list[int] = field(default_factory=list)
    acks: list[tuple[int, int]] = field(default_factory=list)
    """(sid, outputs its reader has taken so far): flow control. The worker advances a stream only
    while fewer than its ``max_backlog`` outputs are unread (in flight or buffered at the front-end),
    as a local worker does with its own buffer."""

    def __bool__(self) -> bool:
        return bool(self.opens or self.inputs or self.cancels or self.acks)


@dataclass(slots=True)
class Load:
    """A replica's state as every front-end sees it (``/metrics``, routing, ``/readyz``)."""

    ready: bool = False
    free_slots: int = 0
    active: int = 0
    queue: int = 0
    max_active: int = 0
    frontends: int = 0


@dataclass(slots=True)
class Batch:
    """One long poll's answer."""

    incarnation: str
    """Changes when Ray restarts the actor: every stream the front-end had there is gone."""
    record: int
    """Which record of this front-end the actor answers from (a new one after a lease expired)."""
    seq: int
    """1, 2, ... per record: a front-end keeps two polls in flight and applies their answers in order."""
    load: Load
    results: list[tuple[int, list[Any], bool, str | None, float]] = field(default_factory=list)
    """(sid, outputs, done, error, posted_at) in the order the worker produced them; ``posted_at`` is
    the actor's wall clock when the step handed them over (the hop's delay is measured from it)."""
    lost: bool = False
    """The front-end's lease had expired: its streams there were ended."""


@dataclass(slots=True)
class Described:
    """What a front-end learns about the hosted stage when it joins."""

    incarnation: str
    name: str
    max_backlog: int
    info: BackendInfo
    """The hosted backend's own description (after its warm-up), as a local worker's ``describe``."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The stage's config fields the actor was built with (``settings.stage_settings``: no secrets);
    a front-end whose own differ refuses to start."""
    admits: bool = False
    """The hosted worker checks each request at submit (its ``admit``: PersonaPlex's prompt budget);
    a front-end may ask it first (``StageActor.admit``)."""
