"""A stream that must keep up with the session clock. Pure: the clock is passed in.

GPT-Live's output audio runs on real time whatever the voice does: silence fills the gaps between its
replies (``live_wire.py``). It keeps a position on its stream, started at a moment of the session
clock, and asks how many whole frames it lacks to be back on time.
"""

from __future__ import annotations


class StreamClock:
    def __init__(self, frame_ms: float, max_fill: int) -> None:
        self.frame_ms = frame_ms
        self.max_fill = max_fill
        """At most this many frames at once: a stalled task catches up, it does not flood."""
        self.t0: float | None = None
        """When the stream began, on the session clock (seconds); None: not started."""
        self.position_ms = 0.0
        """What the stream has carried so far."""

    @property
    def started(self) -> bool:
        return self.t0 is not None

    def start(self, now: float) -> None:
        self.t0 = now

    def advance(self, ms: float) -> float:
        """The stream carried ``ms`` more; its position before them."""
        at = self.position_ms
        self.position_ms += ms
        return at

    def frames_behind(self, now: float, slack_ms: float = 0.0) -> int:
        """Whole frames the stream lacks to be within ``slack_ms`` of the clock (0 before the start)."""
        if self.t0 is None:
            return 0
        behind = (now - self.t0) * 1000 - slack_ms - self.position_ms
        return max(0, min(int(behind // self.frame_ms), self.max_fill))
