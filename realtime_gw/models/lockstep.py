"""The speech-to-speech stage's 80 ms lockstep, as plain logic: when its batched step is due, and which
frame of each conversation's input that step takes. No torch, no threads, no event loop: tested by
feeding it times and frames (``tests/models/test_lockstep.py``); the stage worker
(``runtime.StageWorker`` with a ``Lockstep``) and the Moshi backend (``take_frame``) run it.

**The clock.** A duplex model listens and speaks in real time, so every live conversation is stepped
once per frame, all of them in one batched step, and the step for frame n is due at ``t0 + n * frame``
(t0: when the first conversation joined). Each deadline is the previous one plus a frame, never "the end
of the last step plus a frame", so the time a step takes or a late wake-up does not shift the ones after
it (no drift). A step that starts late (the last one ran over, the loop woke late) runs at once, and how
late is measured; when the clock is a whole frame or more behind (a stall, a step longer than two
frames), the frames missed are skipped and counted, never run back to back to catch up: that burst would
run every conversation faster than real time, and each of its listeners would hear a rush after the gap.
The clock stops when the last conversation leaves; the next one starts it again.

**The VAD steps on the same clock, to batch** (``stop_when_idle``, one 32 ms window per tick): calls
deliver 20 ms of audio at a time, each at its own phase, so a worker that steps whenever a stream has input
runs many network calls of one or two rows. On the clock, every stream's windows completed since the last
tick go into one call; a window waits at most one tick for it (less when the step runs on time). Nothing
is made up: only streams with input are stepped, and the clock stops whenever none has any, so the first
window after a pause is scored at once.

**A frame's lateness is against this clock.** The step of frame n has its frame to run in: its audio is
due when the next step is (``due + frame``), and ``frame_lateness`` is how long after that it was ready.
So a step that starts late (the last one ran over, the worker's thread was busy, a prompt's prefill ran
before it) makes its frame late by as much as a step that runs long, and the frame after a stall is late
by the whole gap its listeners heard (the step is timed from the oldest frame not yet run, the first of
those skipped).

**A user's audio that is late gets silence; it is not waited for.** At its tick each conversation
takes its oldest waiting frame; with none waiting (the client's audio is late, or it sends only while
the user speaks) the model hears one frame of silence, as a phone line's packet-loss concealment would:
waiting would stall that conversation's voice (the model speaks as it listens), and the batch never waits
for its slowest member. A frame that comes after its tick is still heard, at the next tick, so a late
client leaves its audio waiting one frame longer, and a client ahead of real time (a burst, a faster
clock) leaves more waiting. That wait is bounded without losing words: while more than ``allowance``
frames wait, a *quiet* frame at the head is dropped (silence taken out of a pause, as adaptive jitter
buffers do), so the user's audio returns to within ``allowance`` of real time at their next pause; a
frame with speech in it is not dropped, unless more than ``MAX_BEHIND_FRAMES`` wait (a client sending
faster than real time, which a duplex model cannot hear faster): then the oldest go, speech or not, so
a conversation's memory, its step and its silence switches stay within two seconds of real time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from realtime_gw.records.s2s import S2sAudio, S2sSilence


@dataclass(frozen=True, slots=True)
class Tick:
    """One step of the clock as it starts."""

    late_s: float
    """How long after its deadline it started (0: on time)."""
    skipped: int
    """Whole frames missed just before it (never run)."""
    due: float
    """When the oldest frame not yet run was due: this step's deadline, or with frames skipped, the first
    skipped one's (what its listeners waited from)."""


class Lockstep:
    """The stage's clock: deadlines ``t0 + n * frame_s``, one step each."""

    def __init__(self, frame_s: float = 0.08, stop_when_idle: bool = False) -> None:
        self.frame_s = frame_s
        self.stop_when_idle = stop_when_idle
        """The worker stops the clock whenever it has nothing to step, not only when no stream is live: a
        stage that steps only the streams with input (VAD) batches on the clock while input flows, and the
        first input after a pause is stepped at once (a pause is no missed ticks). The speech-to-speech
        clock keeps running: its ticks step every conversation, input or not."""
        self.again = False
        """A ``stop_when_idle`` clock's last step left streams with input out (the batch cap): the next step
        runs at once, in the same tick (``cut_short``), not a tick later."""
        self.origin: float | None = None
        """t0: the first deadline of the current run (None: stopped, no conversation)."""
        self.frame = 0
        """The frame number of the next step."""

    @property
    def running(self) -> bool:
        return self.origin is not None

    @property
    def due(self) -> float | None:
        """When the next step is due (None: stopped)."""
        return None if self.origin is None else self.origin + self.frame * self.frame_s

    def start(self, now: float) -> None:
        """A conversation is live: a stopped clock starts, its first step due at once."""
        if self.origin is None:
            self.origin, self.frame = now, 0

    def stop(self) -> None:
        """No conversation is live."""
        self.origin, self.again = None, False

    def wait_s(self, now: float) -> float:
        """How long until the next step is due (0: due now or overdue; a stopped clock starts now)."""
        self.start(now)
        due = self.due
        assert due is not None
        return 0.0 if self.again else max(0.0, due - now)

    def begin(self, now: float) -> Tick:
        """A step starts at ``now``: it is the step of the latest frame already due; the frames before it
        that were missed are skipped. The next step is due a frame after its deadline."""
        due = self.due
        assert due is not None, "the clock is stopped"
        if self.again:  # the rest of the tick before (the batch cap): late by the step that ran before it
            self.again = False
            return Tick(late_s=max(0.0, now - (due - self.frame_s)), skipped=0, due=due - self.frame_s)
        behind = max(0.0, now - due)
        skipped = int(behind // self.frame_s)
        self.frame += skipped + 1
        return Tick(late_s=behind - skipped * self.frame_s, skipped=skipped, due=due)


def went_idle(clock: Lockstep | None) -> None:
    """Its worker has nothing to step: a ``stop_when_idle`` clock stops, so the next input is stepped at
    once and the clock restarts there."""
    if clock is not None and clock.stop_when_idle:
        clock.stop()


def cut_short(clock: Lockstep | None, cut: bool) -> None:
    """A step of a ``stop_when_idle`` clock left streams with input out (``max_batch``): they step at once,
    in the same tick, so a window waits at most a tick however many streams there are (while the worker
    keeps up). A speech-to-speech clock steps every conversation each tick: nothing to carry."""
    if clock is not None and clock.stop_when_idle:
        clock.again = cut


def frame_lateness(due: float, ready: float, frame_s: float) -> float:
    """How late the frame of a step due at ``due`` (``Tick.due``) was when its audio was ``ready``: it had
    its frame to run, so it was due with the next step (0: on time)."""
    return max(0.0, ready - due - frame_s)


@dataclass(frozen=True, slots=True)
class Taken:
    """What one conversation's step takes from its input."""

    pcm: bytes | None
    """The frame it hears (None: nothing to step: input ended, or not in lockstep and none waiting)."""
    concealed: bool = False
    """No frame was waiting: ``pcm`` is silence in its place."""
    dropped: int = 0
    """Quiet frames taken out of the head of its input to bring it back within the allowance."""


MAX_BEHIND_FRAMES = 25
"""Frames (2 s at 80 ms) a conversation's input may hold waiting; past it the oldest are dropped."""


def take_frame(
    pending: deque[S2sAudio | S2sSilence],
    waiting: int,
    silence: bytes,
    allowance: int,
    quiet: Callable[[bytes], bool],
    on_switch: Callable[[bool], None],
    conceal: bool = True,
    limit: int = MAX_BEHIND_FRAMES,
) -> Taken:
    """The frame a conversation's step hears, from its ``pending`` input (audio frames and silence
    switches in arrival order; switches before the frame are applied through ``on_switch``; ``waiting``:
    how many of its items are audio frames, kept by the caller so that a step does not count them): its
    oldest frame, after dropping quiet head frames while more than ``allowance`` frames wait and any
    while more than ``limit`` wait; ``silence`` when none waits and ``conceal`` (the
    lockstep; else None)."""
    dropped = 0
    while pending:
        item = pending.popleft()
        if isinstance(item, S2sSilence):
            on_switch(item.silent)
            continue
        waiting -= 1  # the frames behind this one
        if waiting >= limit or (waiting >= allowance and quiet(item.pcm)):
            dropped += 1
            continue
        return Taken(item.pcm, dropped=dropped)
    return Taken(silence if conceal else None, concealed=conceal, dropped=dropped)
