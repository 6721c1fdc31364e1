"""The device clock's decisions as plain logic: stream deadlines, and which ready step runs next."""

from __future__ import annotations

import pytest

from realtime_gw.models.clock_schedule import (
    FRAME_S,
    DeadlineFirst,
    Pacing,
    PendingStep,
    StepDeadlines,
    StreamTimes,
    pacing_of,
    stream_awaited,
    stream_due,
)


def test_roles_are_paced_by_listener_or_by_input() -> None:
    assert pacing_of("tts") is Pacing.OUTPUT
    assert {pacing_of(r) for r in ("asr", "vad", "turn", "policy")} == {Pacing.INPUT}


def test_a_reply_without_audio_is_due_one_frame_after_its_text_and_awaited() -> None:
    t = StreamTimes(opened_at=10.0)
    t.arrived(10.2)
    assert stream_due(t, Pacing.OUTPUT) == pytest.approx(10.2 + FRAME_S)
    assert stream_awaited(t, Pacing.OUTPUT)


def test_a_speaking_stream_is_due_when_its_audio_runs_out() -> None:
    t = StreamTimes(opened_at=0.0)
    t.arrived(0.0)
    t.waiting_since = None  # the step took the text
    t.stepped(1.0, 0.08)  # first frame at 1.0
    t.stepped(1.01, 0.08)
    t.stepped(1.02, 0.08)  # three frames made: playback runs out at 1.24
    assert stream_due(t, Pacing.OUTPUT) == pytest.approx(1.24)
    assert not stream_awaited(t, Pacing.OUTPUT)


def test_a_stream_that_waited_for_text_is_not_due_before_a_frame_after_it() -> None:
    t = StreamTimes(opened_at=0.0, first_output_at=1.0, output_s=0.16)
    t.arrived(5.0)  # the responder was slow: playback ran out at 1.16
    assert stream_due(t, Pacing.OUTPUT) == pytest.approx(5.0 + FRAME_S)
    ahead = StreamTimes(opened_at=0.0, first_output_at=1.0, output_s=2.0)
    ahead.arrived(1.5)  # more text while 1.5 s of audio is still buffered
    assert stream_due(ahead, Pacing.OUTPUT) == pytest.approx(3.0)


def test_an_input_is_due_one_frame_after_it_arrived() -> None:
    t = StreamTimes(opened_at=0.0)
    t.arrived(2.0)
    t.arrived(2.05)  # only the oldest unread input counts
    assert stream_due(t, Pacing.INPUT) == pytest.approx(2.0 + FRAME_S)
    assert not stream_awaited(t, Pacing.INPUT)


def test_a_stream_with_work_left_is_due_one_frame_after_its_last_step() -> None:
    t = StreamTimes(opened_at=0.0)
    t.stepped(3.0, 0.0)
    assert stream_due(t, Pacing.INPUT) == pytest.approx(3.0 + FRAME_S)
    t.input_ended = True  # the user stopped: the reply waits for this transcript
    assert stream_awaited(t, Pacing.INPUT)


def test_a_step_is_due_when_its_earliest_stream_is() -> None:
    assert StepDeadlines([1.0, 0.5, 2.0]).due == 0.5
    assert StepDeadlines([]).due == float("inf")


def step(stage: str, due: float, ready_at: float = 0.0, awaited: bool = False) -> PendingStep:
    return PendingStep(stage=stage, due=due, awaited=awaited, ready_at=ready_at)


def test_earliest_deadline_runs_first() -> None:
    policy = DeadlineFirst()
    pending = [step("asr", 1.08, ready_at=1.0), step("tts", 1.05, ready_at=1.01), step("vad", 1.2)]
    assert policy.choose(pending, now=1.02).stage == "tts"
    assert [s.passes for s in pending] == [1, 0, 1]


def test_an_awaited_step_counts_a_frame_sooner() -> None:
    """A finished turn's flush step (due a frame after its last step) goes before a TTS frame due a
    little earlier, but not before one that is about to run out."""
    policy = DeadlineFirst()
    flush = step("asr", due=1.05, ready_at=0.2, awaited=True)
    assert policy.choose([step("tts", 1.0, 0.1), flush], now=0.9) is flush
    flush = step("asr", due=1.05, ready_at=0.2, awaited=True)
    assert policy.choose([step("tts", 0.95, 0.1), flush], now=0.9).stage == "tts"


def test_ties_go_to_the_step_that_waited_longest() -> None:
    policy = DeadlineFirst()
    assert policy.choose([step("asr", 1.0, 0.2), step("tts", 1.0, 0.1)], 0.5).stage == "tts"


def test_nothing_ready_nothing_chosen_and_a_lone_step_runs_even_before_it_is_due() -> None:
    policy = DeadlineFirst()
    assert policy.choose([], now=0.0) is None
    assert policy.choose([step("tts", due=9.0)], now=0.0).stage == "tts"  # work-conserving


def test_a_due_step_passed_over_too_often_runs_next() -> None:
    policy = DeadlineFirst(max_passes=2)
    starved = step("tts", due=1.0)
    for now in (1.1, 1.2):
        assert policy.choose([starved, step("asr", due=0.5)], now).stage == "asr"
    assert starved.passes == 2
    assert policy.choose([starved, step("asr", due=0.5)], now=1.3) is starved


def test_a_step_not_yet_due_is_never_forced_ahead() -> None:
    policy = DeadlineFirst(max_passes=1)
    early = step("tts", due=5.0, ready_at=0.0)
    early.passes = 10
    assert policy.choose([early, step("asr", due=1.0)], now=1.0).stage == "asr"


COST_S = {"asr": 0.03, "tts": 0.03, "vad": 0.01}


def run_frame(pending: list[PendingStep], order: str) -> list[str]:
    """Run ready steps to the end, one at a time (costs ``COST_S``), earliest deadline first or first
    come first served; the stages whose step ended past its deadline."""
    policy, now, late = DeadlineFirst(), 0.0, []
    pending = list(pending)
    while pending:
        chosen = policy.choose(pending, now) if order == "edf" else min(pending, key=lambda s: s.ready_at)
        assert chosen is not None
        pending.remove(chosen)
        now += COST_S[chosen.stage]
        if now > chosen.due:
            late.append(chosen.stage)
    return late


def test_a_short_tts_buffer_goes_before_input_steps_that_came_first() -> None:
    """One frame: the microphone's ASR and VAD steps arrived first, then a TTS step whose stream's
    audio runs out in 35 ms. Served in arrival order the reply's audio underruns; deadline first, all
    three meet their deadlines (TTS 30 ms, ASR 60 ms, VAD 70 ms)."""

    def frame() -> list[PendingStep]:
        return [
            step("asr", due=0.080, ready_at=0.000),
            step("vad", due=0.081, ready_at=0.001),
            step("tts", due=0.035, ready_at=0.002),
        ]

    assert run_frame(frame(), "fifo") == ["tts"]
    assert run_frame(frame(), "edf") == []
