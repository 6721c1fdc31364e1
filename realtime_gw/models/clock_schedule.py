"""What a device clock decides, as plain logic: when each stream's next step is due, and which stage's
ready step runs next on a shared device. No torch, no threads, no event loop: tested by feeding it
pending steps and times (``tests/models/test_clock_schedule.py``); ``device_clock.py`` is the thin
runner around it.

Deadlines come from what the sessions wait for, on the 80 ms frame of the voice pipeline:

- **Output-paced streams** (TTS): the client plays a stream's audio from its first frame on, so the
  step that makes the next frame is due when the audio made so far runs out:
  ``first output + audio seconds produced``. A stream that has produced nothing is due one frame after
  its input (text) arrived: the listener is waiting for the first audio. A stream far ahead of playback
  (its buffer long) is due far ahead, so it yields to one whose buffer is short. (Never sooner than a
  frame after its latest text arrived: a stream that waited for text is late by its responder, not by
  the device.)
- **Input-paced streams** (ASR, VAD, turn detection, policy): a stream that is ready must be stepped
  within one frame of becoming ready (its oldest unread input arrived, or its previous step ended while
  it still had work), else it falls behind the microphone: one frame per step is what keeps these
  models real time. Once its input has ended (the user stopped: the turn's transcript is what the reply
  waits for) its steps are *awaited*.

A step is due when its earliest stream is. Among the ready steps of a device the earliest due runs
first (earliest-deadline-first, which on one machine minimizes the largest lateness), an awaited step
counted one frame sooner: a reply's first audio, or the flush steps of a finished turn (a dozen steps in
a row before the transcript, each otherwise due only a frame after the last), are what a user is waiting
for now, while a frame due later is slack. Ties go to the step that has waited longest. A step that is
already due and has been passed over ``max_passes`` times runs next whatever the others' deadlines, so no
stage starves when the device is overloaded and every deadline is past.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

FRAME_S = 0.08
"""The voice pipeline's frame: 80 ms of audio (1920 samples at 24 kHz)."""


class Pacing(Enum):
    OUTPUT = "output"
    """Due when the audio it has made runs out (TTS)."""
    INPUT = "input"
    """Due one frame after it became ready (ASR, VAD, turn detection, policy)."""


def pacing_of(role: str) -> Pacing:
    """TTS streams are paced by their listeners; every other stage by its input."""
    return Pacing.OUTPUT if role == "tts" else Pacing.INPUT


@dataclass(slots=True)
class StreamTimes:
    """What a stage worker records of one stream (monotonic seconds) to know when it is due."""

    opened_at: float
    waiting_since: float | None = None
    """When its oldest input not yet handed to the backend arrived; None: none waiting."""
    stepped_at: float | None = None
    """When its last step ended."""
    first_output_at: float | None = None
    output_s: float = 0.0
    """Seconds of audio it has produced (output-paced streams)."""
    input_ended: bool = False
    """Its input is complete (``close_input``): what remains is awaited."""

    def arrived(self, now: float) -> None:
        """An input arrived (only the oldest unread one counts)."""
        if self.waiting_since is None:
            self.waiting_since = now

    def stepped(self, now: float, output_s: float) -> None:
        """One step of it ended at ``now`` having produced ``output_s`` seconds of audio."""
        if output_s > 0 and self.first_output_at is None:
            self.first_output_at = now
        self.output_s += output_s
        self.stepped_at = now


def stream_due(times: StreamTimes, pacing: Pacing, frame_s: float = FRAME_S) -> float:
    """When ``times``'s next step must have ended (read before the step takes its inputs)."""
    if pacing is Pacing.OUTPUT and times.first_output_at is not None:
        runs_out = times.first_output_at + times.output_s
        if times.waiting_since is None:
            return runs_out
        # Not before a frame after its text came: a stream that sat waiting for text (a slow
        # responder) is late by the responder, not by the device.
        return max(runs_out, times.waiting_since + frame_s)
    ready = times.waiting_since
    if ready is None:
        ready = times.stepped_at if times.stepped_at is not None else times.opened_at
    return ready + frame_s


def stream_awaited(times: StreamTimes, pacing: Pacing) -> bool:
    """Someone waits on this stream's next result now: a reply's first audio, or a finished turn's
    transcript."""
    if pacing is Pacing.OUTPUT:
        return times.first_output_at is None
    return times.input_ended


@dataclass(slots=True)
class PendingStep:
    """One stage's next step, ready to run on the device."""

    stage: str
    due: float
    awaited: bool
    ready_at: float
    passes: int = 0
    """Times another step was chosen while this one waited."""


@dataclass(slots=True)
class DeadlineFirst:
    """The choice among a device's ready steps (one per stage at most: a worker has one step in flight)."""

    max_passes: int = 3
    """A due step passed over this many times runs next (starvation bound)."""

    awaited_lead_s: float = FRAME_S
    """How much sooner an awaited step counts than its deadline."""

    def order_key(self, step: PendingStep) -> tuple[float, float]:
        return (step.due - (self.awaited_lead_s if step.awaited else 0.0), step.ready_at)

    def choose(self, pending: list[PendingStep], now: float) -> PendingStep | None:
        """The step to run now (None when nothing is ready); every other one counts one more pass.
        Work-conserving: a ready step runs even if it is not due yet."""
        if not pending:
            return None
        starved = [s for s in pending if s.passes >= self.max_passes and s.due <= now]
        if starved:
            chosen = min(starved, key=lambda s: (-s.passes, *self.order_key(s)))
        else:
            chosen = min(pending, key=self.order_key)
        for s in pending:
            if s is not chosen:
                s.passes += 1
        return chosen


@dataclass(slots=True)
class StepDeadlines:
    """The deadlines of one step's streams (in the order the step takes them)."""

    dues: list[float]

    @property
    def due(self) -> float:
        return min(self.dues) if self.dues else float("inf")
