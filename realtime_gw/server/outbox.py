"""The outbound scheduler of one realtime connection: which event goes on the wire next, and when.

Pure (no asyncio, no I/O; the clock is passed in), so pacing, purge and delivery are tested with a
fake clock. The connection's writer task only asks ``next_due(now)``, sleeps for the answer or
writes the event it got, and posts the notices that come with it.

- Two lanes. *Control* events (``response_id`` None: acks, VAD events, errors) leave at once, never
  stuck behind paced audio. *Media* events of responses keep their order; audio deltas are paced to
  ``audio_lead_ms`` ahead of real-time playback at the client (0 = as fast as produced).
- ``server_event_seq`` is stamped when an event is taken, so it is monotonic on the wire across lanes.
- ``purge(response_id)`` drops a cancelled response's unsent audio and the transcript that goes with it.
- Delivery is a notice, not a poll: ``await_delivery`` records a waiter, and the ``AudioDelivered``
  comes back from the call that takes (or purges) the response's last queued frame.
- Backpressure: ``has_room`` is False while ``high_water`` audio frames are queued (the TTS pump
  waits). Bound: a push beyond ``max_items`` raises ``OutboxFull`` (the client is not reading).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from realtime_gw.protocols import realtime as rt
from realtime_gw.sessions.events import AudioDelivered, PlaybackStarted

AUDIO_HIGH_WATER = 25
"""Queued audio frames (2 s) above which TTS output is not pulled (backpressure)."""

Notice = AudioDelivered | PlaybackStarted
"""What the outbox tells the session (through its mailbox)."""


class OutboxFull(Exception):
    """More events are waiting than the bound allows: the client is not reading."""


@dataclass(slots=True)
class _Item:
    event: rt.ServerEvent
    response_id: str | None
    audio_ms: float
    purgeable: bool
    """Audio and its transcript: unheard, so dropped when the response is cancelled."""


@dataclass(slots=True)
class Outgoing:
    """An event to write now (``server_event_seq`` already stamped), with what its taking observed."""

    event: rt.ServerEvent
    response_id: str | None = None
    notices: list[Notice] = field(default_factory=list)
    ttfa_s: float | None = None
    """First audio of a response: seconds since its ``response.created`` was queued."""
    lateness_s: float | None = None
    """Audio: how late it leaves relative to its playback slot at the client (>= 0)."""


@dataclass(slots=True)
class _Playback:
    t0: float
    """When the response's first frame left: its playback starts then at the client."""
    sent_ms: float = 0.0
    message: str = ""
    """The message item whose audio plays (a response that called MCP tools speaks in several)."""


class Outbox:
    def __init__(self, max_items: int, audio_lead_ms: float, high_water: int = AUDIO_HIGH_WATER) -> None:
        self.max_items = max_items
        self.lead_s = audio_lead_ms / 1000.0
        self.high_water = high_water
        self.seq = 0
        self._control: deque[_Item] = deque()
        self._media: deque[_Item] = deque()
        self._audio: Counter[str] = Counter()
        """Queued audio frames per response."""
        self._created: dict[str, float] = {}
        """When each live response's ``response.created`` was queued (for time to first audio)."""
        self._playback: dict[str, _Playback] = {}
        self._waiters: dict[str, list[int]] = {}
        """Epochs waiting for ``AudioDelivered`` of a response."""

    # -- state ------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._control) + len(self._media)

    @property
    def queued_audio(self) -> int:
        return self._audio.total()

    @property
    def has_room(self) -> bool:
        """False while the TTS pump should stop pulling frames."""
        return self.queued_audio < self.high_water

    # -- producer side ----------------------------------------------------------------------------------
    def push(self, event: rt.ServerEvent, response_id: str | None = None, audio_ms: float = 0.0, *, now: float) -> None:
        if len(self) >= self.max_items:
            raise OutboxFull(f"{len(self)} events waiting")
        if isinstance(event, rt.ResponseCreatedEvent):
            self._created[event.response.id] = now
        purgeable = isinstance(event, (rt.ResponseAudioDeltaEvent, rt.ResponseAudioTranscriptDeltaEvent))
        item = _Item(event, response_id, audio_ms, purgeable)
        if response_id is None:
            self._control.append(item)
            return
        self._media.append(item)
        if audio_ms:
            self._audio[response_id] += 1

    def purge(self, response_id: str) -> list[Notice]:
        """Drop the unsent audio (and the transcript that goes with it) of a cancelled response."""
        self._media = deque(o for o in self._media if not (o.response_id == response_id and o.purgeable))
        self._audio.pop(response_id, None)
        return self._delivered(response_id)

    def purge_all_audio(self) -> list[Notice]:
        notices: list[Notice] = []
        for response_id in list(self._audio):
            notices += self.purge(response_id)
        return notices

    def await_delivery(self, response_id: str, epoch: int) -> list[Notice]:
        """``AudioDelivered`` now when none of the response's audio is queued, else once its last
        queued frame is taken (or purged)."""
        self._waiters.setdefault(response_id, []).append(epoch)
        return self._delivered(response_id)

    # -- consumer side ----------------------------------------------------------------------------------
    def next_due(self, now: float) -> Outgoing | float | None:
        """The event to write now, or the seconds to wait before the next one is due, or None when
        nothing is queued. A push or purge can change the answer: ask again after one."""
        if self._control:
            item = self._control.popleft()
            return self._take(item, Outgoing(item.event))
        if not self._media:
            return None
        item = self._media[0]
        out = Outgoing(item.event, item.response_id)
        if item.audio_ms:
            assert item.response_id is not None
            playback = self._playback.get(item.response_id)
            message = getattr(item.event, "item_id", "")
            if playback is None:  # the response's first frame: its playback starts now
                playback = self._playback[item.response_id] = _Playback(now, message=message)
                started = self._created.pop(item.response_id, None)
                out.ttfa_s = None if started is None else now - started
                out.notices.append(PlaybackStarted(item.response_id, now))
            elif message != playback.message:
                # a later message of the response (it went on after MCP calls): after the pause, its
                # audio plays from now (or right after what is still playing), not on the old clock
                playback.t0 = max(now, playback.t0 + playback.sent_ms / 1000.0)
                playback.sent_ms, playback.message = 0.0, message
            due = playback.t0 + playback.sent_ms / 1000.0  # when this frame starts playing at the client
            if self.lead_s and now < due - self.lead_s:
                return due - self.lead_s - now
            out.lateness_s = max(0.0, now - due)
            playback.sent_ms += item.audio_ms
        self._media.popleft()
        return self._take(item, out)

    def _take(self, item: _Item, out: Outgoing) -> Outgoing:
        # Numbered as taken, so the sequence is monotonic on the wire across both lanes.
        self.seq += 1
        item.event.server_event_seq = self.seq
        if isinstance(item.event, rt.ResponseDoneEvent):
            rid = item.event.response.id
            self._playback.pop(rid, None)  # its audio is all out
            self._created.pop(rid, None)
        if item.audio_ms and item.response_id is not None:
            self._audio[item.response_id] -= 1
            if self._audio[item.response_id] <= 0:
                del self._audio[item.response_id]
                out.notices += self._delivered(item.response_id)
        return out

    def _delivered(self, response_id: str) -> list[Notice]:
        if self._audio.get(response_id) or response_id not in self._waiters:
            return []
        return [AudioDelivered(response_id, epoch) for epoch in self._waiters.pop(response_id)]
