"""The speech-to-speech stage's 80 ms lockstep, fed times and frames: deadlines that do not drift, late
steps measured, missed frames skipped (never run in a burst), and each conversation's input at its tick
(its oldest frame; silence when none came; quiet frames dropped when it fell behind, speech never)."""

from __future__ import annotations

from collections import deque

import pytest

from realtime_gw.models.lockstep import (
    MAX_BEHIND_FRAMES,
    Lockstep,
    Taken,
    frame_lateness,
    take_frame,
    went_idle,
)
from realtime_gw.records.s2s import S2sAudio, S2sSilence

F = 0.08
SILENCE = b"\0\0" * 4
SPEECH = [bytes([i + 1]) * 8 for i in range(6)]
QUIET = [bytes([0x80 + i]) * 8 for i in range(6)]


def is_quiet(pcm: bytes) -> bool:
    return pcm[0] >= 0x80 or pcm == SILENCE


def run(clock: Lockstep, starts: list[float]) -> list[tuple[float, int]]:
    """Steps that start at ``starts`` (each when its worker got to it): (late_s, skipped) each."""
    out = []
    for t in starts:
        assert clock.wait_s(t) == 0.0, "a step never starts before it is due"
        tick = clock.begin(t)
        out.append((round(tick.late_s, 6), tick.skipped))
    return out


def test_deadlines_are_the_first_plus_whole_frames_whatever_the_steps_take() -> None:
    clock = Lockstep(F)
    assert clock.wait_s(10.0) == 0.0 and clock.due == 10.0  # the first conversation: its step at once
    clock.begin(10.03)  # a slow wake-up and a slow step...
    assert clock.due == pytest.approx(10.08)  # ...move nothing: the next is due a frame after the first deadline
    assert clock.wait_s(10.05) == pytest.approx(0.03)
    for n in range(2, 1000):  # a long call: no drift
        clock.begin(clock.due + 0.004)  # type: ignore[operator]
        assert clock.due == pytest.approx(10.0 + n * F)


def test_a_late_step_runs_at_once_and_the_next_stays_on_its_deadline() -> None:
    clock = Lockstep(F)
    clock.start(0.0)
    # step 1 ran over its frame by 30 ms: step 2 starts 30 ms late, step 3 is on time again
    assert run(clock, [0.0, 0.11, 0.16]) == [(0.0, 0), (0.03, 0), (0.0, 0)]


def test_a_batching_clock_stops_when_idle_and_the_next_input_steps_at_once() -> None:
    vad = Lockstep(0.032, stop_when_idle=True)  # the VAD's window clock
    vad.start(0.0)
    vad.begin(0.0)
    assert vad.wait_s(0.01) == pytest.approx(0.022)  # input flowing: the next step waits for its tick
    went_idle(vad)  # a tick found no stream with input
    assert not vad.running
    assert vad.wait_s(5.0) == 0.0 and vad.due == 5.0  # the first window after the pause: at once...
    assert run(vad, [5.0]) == [(0.0, 0)]  # ...and the pause is no missed ticks
    assert vad.due == pytest.approx(5.032)
    s2s = Lockstep(F)  # its ticks step every conversation, input or not: its clock keeps running
    s2s.start(0.0)
    went_idle(s2s)
    assert s2s.running
    went_idle(None)  # a worker with no clock


def test_missed_frames_are_skipped_not_made_up_in_a_burst() -> None:
    clock = Lockstep(F)
    clock.start(0.0)
    late, skipped = run(clock, [0.0, 0.35])[1]  # a 350 ms stall: frames at 0.08, 0.16, 0.24 passed
    assert skipped == 3 and late == pytest.approx(0.03)  # this step is the 0.32 frame's
    assert clock.due == pytest.approx(0.40)
    assert clock.wait_s(0.36) == pytest.approx(0.04)  # no catch-up step right after it


def frames_late(clock: Lockstep, steps: list[tuple[float, float]]) -> list[float]:
    """Steps that start and end at the given times (the worker's thread): each frame's lateness, ms."""
    out = []
    for start, end in steps:
        tick = clock.begin(start)
        out.append(round(frame_lateness(tick.due, end, F) * 1000, 3))
    return out


def test_a_frame_is_late_by_what_delayed_it_not_only_by_its_own_step() -> None:
    """Its audio is due a frame after its tick: a long step, a late start after a step that ran over, and
    a start delayed by a busy thread all count; a short step that started late is on time."""
    clock = Lockstep(F)
    clock.start(0.0)
    late = frames_late(clock, [
        (0.0, 0.05),  # on time
        (0.08, 0.19),  # ran 110 ms: 30 ms late
        (0.19, 0.25),  # only 60 ms, but it could start only when the last one ended: 10 ms late
        (0.24, 0.30),  # on its tick again
        (0.36, 0.39),  # the thread was busy: it started 40 ms late and ran 30 ms, on time
        (0.43, 0.50),  # started 30 ms late (busy) and ran 70 ms: 20 ms late
    ])  # fmt: skip
    assert late == [0.0, 30.0, 10.0, 0.0, 0.0, 20.0]


def test_the_frame_after_a_stall_is_late_by_the_whole_gap() -> None:
    """The frames in the stall are skipped; the next one is timed from the first of them (when its
    listeners' audio stopped), not from its own later tick."""
    clock = Lockstep(F)
    clock.start(0.0)
    tick = clock.begin(0.0)
    assert tick.due == 0.0
    tick = clock.begin(0.35)  # frames due at 0.08, 0.16, 0.24 passed
    assert tick.skipped == 3 and tick.due == pytest.approx(0.08)
    assert frame_lateness(tick.due, 0.37, F) == pytest.approx(0.21)
    tick = clock.begin(0.40)
    assert tick.due == pytest.approx(0.40) and frame_lateness(tick.due, 0.43, F) == 0.0


def test_the_clock_stops_with_the_last_conversation_and_starts_with_the_next() -> None:
    clock = Lockstep(F)
    clock.start(0.0)
    clock.begin(0.0)
    clock.stop()
    assert not clock.running and clock.due is None
    assert clock.wait_s(7.3) == 0.0 and clock.due == 7.3  # a fresh start: no frames owed since


def take(pending: deque[S2sAudio | S2sSilence], allowance: int = 2, conceal: bool = True) -> tuple[Taken, list[bool]]:
    switches: list[bool] = []
    waiting = sum(isinstance(i, S2sAudio) for i in pending)
    return take_frame(pending, waiting, SILENCE, allowance, is_quiet, switches.append, conceal), switches


def test_each_tick_takes_the_oldest_frame_and_applies_the_switches_before_it() -> None:
    pending: deque[S2sAudio | S2sSilence] = deque([S2sSilence(True), S2sAudio(SPEECH[0]), S2sSilence(False), S2sAudio(SPEECH[1])])
    taken, switches = take(pending)
    assert taken == Taken(SPEECH[0]) and switches == [True]
    taken, switches = take(pending)
    assert taken == Taken(SPEECH[1]) and switches == [False] and not pending


def test_a_frame_not_there_at_its_tick_is_heard_as_silence_and_the_late_one_next() -> None:
    pending: deque[S2sAudio | S2sSilence] = deque()
    assert take(pending)[0] == Taken(SILENCE, concealed=True)
    pending.append(S2sAudio(SPEECH[0]))  # it came after its tick: heard at the next, not dropped
    assert take(pending)[0] == Taken(SPEECH[0])
    # a switch alone is applied at the tick, which still hears silence
    pending.append(S2sSilence(True))
    taken, switches = take(pending)
    assert taken.concealed and switches == [True]
    # outside the lockstep (or once the input ended) nothing is made up
    assert take(deque(), conceal=False)[0] == Taken(None)


def test_quiet_frames_are_dropped_while_the_input_is_behind_speech_never() -> None:
    pending: deque[S2sAudio | S2sSilence] = deque(S2sAudio(p) for p in [QUIET[0], QUIET[1], SPEECH[0], QUIET[2], SPEECH[1]])
    # five waiting, two allowed: the two quiet frames at the head go, the speech is heard
    assert take(pending)[0] == Taken(SPEECH[0], dropped=2)
    # two waiting now: within the allowance, the quiet frame is heard
    assert take(pending)[0] == Taken(QUIET[2])
    assert take(pending)[0] == Taken(SPEECH[1])
    # speech far behind is never dropped: it waits its turn
    speech: deque[S2sAudio | S2sSilence] = deque(S2sAudio(p) for p in SPEECH)
    assert [take(speech)[0].pcm for _ in SPEECH] == SPEECH


def test_a_client_far_ahead_of_real_time_loses_its_oldest_frames_speech_too() -> None:
    """Past MAX_BEHIND_FRAMES waiting, the oldest go whatever they hold: memory and step stay bounded."""
    pending: deque[S2sAudio | S2sSilence] = deque(S2sAudio(SPEECH[i % len(SPEECH)]) for i in range(MAX_BEHIND_FRAMES + 5))
    taken, _ = take(pending)
    assert taken.dropped == 5 and taken.pcm == SPEECH[5 % len(SPEECH)]
    assert sum(isinstance(i, S2sAudio) for i in pending) == MAX_BEHIND_FRAMES - 1
    assert take(pending)[0].dropped == 0  # within the bound: speech waits its turn again
