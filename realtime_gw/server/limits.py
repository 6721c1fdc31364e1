"""Per-session bounds in time: how fast input may arrive, how long a session may idle or last.

Pure (the clock is passed in), so the rules are tested without sockets; the connections ask them and
do the waiting or the closing.
"""

from __future__ import annotations

from dataclasses import dataclass

from realtime_gw.protocols.audio import OUTPUT_RATE

REALTIME_AUDIO_BYTES_PER_S = OUTPUT_RATE * 2
"""Input audio is counted in decoded bytes at 24 kHz PCM16 (the highest input rate)."""


class InputBudget:
    """A token bucket over input bytes: ``rate`` bytes per second after a burst of ``burst`` bytes.
    Spending past it is allowed once (a frame is already read) and answered with how long to stop
    reading, so a fast client is slowed, never refused."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.level = burst
        self.at = now

    @classmethod
    def for_audio(cls, rate_factor: float, burst_s: float, now: float) -> InputBudget | None:
        """Realtime input audio at ``rate_factor`` times real time after ``burst_s`` seconds; None = off."""
        if rate_factor <= 0:
            return None
        return cls(REALTIME_AUDIO_BYTES_PER_S * rate_factor, REALTIME_AUDIO_BYTES_PER_S * burst_s, now)

    def spend(self, n: int, now: float) -> float:
        """Take ``n`` bytes; the seconds to wait before reading more (0 while within the budget)."""
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now
        self.level -= n
        return 0.0 if self.level >= 0 else -self.level / self.rate


@dataclass
class Lifetime:
    """A session's idle timeout (no client event for ``idle_s``) and maximum duration (``max_s``);
    0 disables either."""

    idle_s: float
    max_s: float
    started: float
    last_input: float = 0.0

    def __post_init__(self) -> None:
        self.last_input = self.started

    def touch(self, now: float) -> None:
        """A client event arrived."""
        self.last_input = now

    def expired(self, now: float) -> str | None:
        """None while the session may go on, else why it ends (for the error event and close reason)."""
        if self.max_s and now - self.started >= self.max_s:
            return f"session reached its maximum duration of {self.max_s:g} s"
        if self.idle_s and now - self.last_input >= self.idle_s:
            return f"session was idle for {self.idle_s:g} s (no client event)"
        return None


class InputGate:
    """When a connection's reader may take the next client frame: not while its outbox is above
    ``high`` (until it is back at ``low``), nor while ``max_pending`` events it read wait to be
    handled. One burst then queues at most ``max_pending`` events' replies above ``high``, so a
    client that reads is slowed by backpressure, never closed for a full outbox."""

    def __init__(self, outbox_bound: int, max_pending: int) -> None:
        self.high = max(1, outbox_bound // 2)
        self.low = self.high // 2
        self.max_pending = max_pending
        self.paused = False
        self.pending = 0

    def blocked(self, queued: int) -> bool:
        """Whether to wait (``queued``: events now in the outbox)."""
        if self.paused:
            self.paused = queued > self.low
        elif queued >= self.high:
            self.paused = True
        return self.paused or self.pending >= self.max_pending

    def may_resume(self, queued: int) -> bool:
        """Worth waking a waiting reader (the outbox drained to ``low``)."""
        return self.paused and queued <= self.low
