"""Full-duplex turn state: what the client has heard, and what user speech over assistant speech means.

Pure. ``Playback`` estimates how much of an assistant item the client has played, from the moment its
first frame left the server and from the client's ``playback.ack``s. ``OverlapPolicy`` classifies user
speech that overlaps assistant speech: a short backchannel ("uh-huh") is dropped, a long one barges in,
anything between is listened to without interrupting; speech that starts inside the echo-guard window
of an assistant turn is treated as the assistant's own echo and never interrupts. ``Playbacks`` is the
ledger of the newest assistant items' playback, by response id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Decision(str, Enum):
    DROP = "drop"
    LISTEN = "listen"
    BARGE_IN = "barge_in"


@dataclass(slots=True)
class DuplexSettings:
    overlap_short_ack_ms: int = 700
    overlap_barge_in_ms: int = 1200
    echo_guard_ms: int = 400


@dataclass(slots=True)
class Playback:
    """One assistant item's audio on its way to the client's speaker."""

    response_id: str
    item_id: str
    audio_ms: float = 0.0
    """Audio generated so far."""
    started_at: float | None = None
    """When its first frame left the server (session clock, seconds)."""
    acked_ms: float = 0.0
    acked_at: float | None = None
    acks: list[tuple[float, float]] = field(default_factory=list)
    """The ledger: (session time, played_ms) per accepted ack."""
    finished: bool = False
    later_items: list[tuple[str, float]] = field(default_factory=list)
    """The messages of the response's later model rounds (it went on after MCP calls): each item
    and where its audio starts in the response's audio."""

    def items(self) -> list[tuple[str, float]]:
        """Its message items and where each one's audio starts, in order."""
        return [(self.item_id, 0.0), *self.later_items]

    def add_item(self, item_id: str, at_ms: float, now: float) -> None:
        """The response speaks again, in a new message, after a pause (its MCP calls ran). A client
        that has played everything sent so far hears the new audio from ``now``, not from where the
        first frame's clock says."""
        if self.started_at is not None and self.played_ms(now) >= at_ms - 1e-6:
            self.started_at = now - at_ms / 1000.0
            if self.acked_at is not None:
                self.acked_ms, self.acked_at = max(self.acked_ms, at_ms), now
        self.later_items.append((item_id, at_ms))

    def played_ms(self, now: float) -> float:
        """What the client has heard by ``now``: its acks if any, else the real-time clock since the
        first frame; never more than was generated."""
        if self.started_at is None:
            return 0.0
        estimate = (now - self.started_at) * 1000.0
        if self.acked_at is not None:
            estimate = min(estimate, self.acked_ms + (now - self.acked_at) * 1000.0)
        return max(0.0, min(estimate, self.audio_ms))

    def audible(self, now: float) -> bool:
        """The assistant is speaking: its audio has started and is not yet all played."""
        return self.started_at is not None and (not self.finished or self.played_ms(now) < self.audio_ms - 1e-6)

    def ack(self, played_ms: float, now: float) -> float:
        """Record an ack; acks only move forward. Returns the ledger's played_ms."""
        if played_ms >= self.acked_ms or self.acked_at is None:
            self.acked_ms = max(self.acked_ms, played_ms)
            self.acked_at = now
            self.acks.append((now, self.acked_ms))
        return self.acked_ms


MAX_TRACKED_PLAYBACKS = 16
"""Responses whose playback can still be acked."""


class Playbacks:
    """The ``playback.ack`` ledger: each audio response's ``Playback``, newest last, bounded."""

    def __init__(self, limit: int = MAX_TRACKED_PLAYBACKS) -> None:
        self.limit = limit
        self._by_response: dict[str, Playback] = {}

    def open(self, response_id: str, item_id: str) -> Playback:
        playback = self._by_response[response_id] = Playback(response_id, item_id)
        while len(self._by_response) > self.limit:
            del self._by_response[next(iter(self._by_response))]
        return playback

    def get(self, response_id: str) -> Playback | None:
        return self._by_response.get(response_id)

    def __getitem__(self, response_id: str) -> Playback:
        return self._by_response[response_id]

    def latest(self) -> Playback | None:
        return next(reversed(self._by_response.values()), None)

    def audible(self, now: float) -> Playback | None:
        """The newest playback, if the client is still hearing it."""
        playback = self.latest()
        return playback if playback is not None and playback.audible(now) else None

    def of_item(self, item_id: str) -> tuple[Playback, float] | None:
        """The playback an item's audio is in, and where its audio starts in that playback's."""
        for p in self._by_response.values():
            for each, start_ms in p.items():
                if each == item_id:
                    return p, start_ms
        return None


@dataclass(slots=True)
class Overlap:
    """User speech that began while the assistant was speaking."""

    start_ms: float
    """On the input-audio timeline."""
    echo: bool
    decided: Decision | None = None


class OverlapPolicy:
    def __init__(self, settings: DuplexSettings) -> None:
        self.settings = settings

    def begin(self, start_ms: float, assistant_turn_ms: float) -> Overlap:
        """``assistant_turn_ms``: how long the assistant had been audible when the speech began."""
        return Overlap(start_ms, echo=assistant_turn_ms < self.settings.echo_guard_ms)

    def during(self, overlap: Overlap, position_ms: float) -> Decision | None:
        """While the user keeps talking: barge in once the speech is long enough."""
        long_enough = position_ms - overlap.start_ms >= self.settings.overlap_barge_in_ms
        if overlap.decided is None and not overlap.echo and long_enough:
            overlap.decided = Decision.BARGE_IN
            return Decision.BARGE_IN
        return None

    def end(self, overlap: Overlap, end_ms: float) -> Decision | None:
        """When the speech stops (if nothing was decided yet)."""
        if overlap.decided is not None:
            return None
        length = end_ms - overlap.start_ms
        decision = Decision.DROP if overlap.echo or length < self.settings.overlap_short_ack_ms else Decision.LISTEN
        overlap.decided = decision
        return decision
