"""``Outbox``: the realtime socket's outbound scheduler, driven by a fake clock (no sockets, no loop)."""

from __future__ import annotations

import pytest

from realtime_gw.protocols import realtime as rt
from realtime_gw.server.outbox import Outbox, OutboxFull, Outgoing
from realtime_gw.sessions.events import AudioDelivered, PlaybackStarted

FRAME_MS = 80.0


def ref(response_id: str) -> dict[str, object]:
    return {"response_id": response_id, "item_id": "item_1", "output_index": 0, "content_index": 0}


def created(response_id: str) -> rt.ResponseCreatedEvent:
    return rt.ResponseCreatedEvent(response=rt.Response(id=response_id))


def done(response_id: str) -> rt.ResponseDoneEvent:
    return rt.ResponseDoneEvent(response=rt.Response(id=response_id, status="completed"))


def audio(response_id: str, seq: int) -> rt.ResponseAudioDeltaEvent:
    return rt.ResponseAudioDeltaEvent(**ref(response_id), delta=b"\0\0", seq=seq)  # type: ignore[arg-type]


def transcript(response_id: str, text: str) -> rt.ResponseAudioTranscriptDeltaEvent:
    return rt.ResponseAudioTranscriptDeltaEvent(**ref(response_id), delta=text)  # type: ignore[arg-type]


def control(n: int) -> rt.ErrorEvent:
    return rt.error_event(f"control {n}")


def push_response(box: Outbox, rid: str, frames: int, now: float = 0.0) -> None:
    box.push(created(rid), rid, now=now)
    for i in range(frames):
        box.push(transcript(rid, f"w{i}"), rid, now=now)
        box.push(audio(rid, i), rid, FRAME_MS, now=now)


def drain(box: Outbox, now: float) -> list[Outgoing]:
    """Everything due at ``now``."""
    out = []
    while isinstance(due := box.next_due(now), Outgoing):
        out.append(due)
    return out


def test_audio_is_paced_to_the_lead_ahead_of_playback() -> None:
    box = Outbox(max_items=1000, audio_lead_ms=400)
    push_response(box, "r1", frames=20, now=0.0)
    sent = drain(box, now=1.0)
    frames = [o for o in sent if isinstance(o.event, rt.ResponseAudioDeltaEvent)]
    # the first frame starts playback at t=1.0; frames up to 400 ms ahead of it may go: 0..400 ms
    assert [f.event.seq for f in frames] == [0, 1, 2, 3, 4, 5]  # type: ignore[attr-defined]
    assert frames[0].ttfa_s == pytest.approx(1.0)
    assert frames[0].notices == [PlaybackStarted("r1", 1.0)]
    assert all(f.lateness_s == 0.0 for f in frames)
    # the next frame plays at 1.48 s, so it is due at 1.08 s
    wait = box.next_due(1.0)
    assert wait == pytest.approx(0.08)
    assert box.next_due(1.05) == pytest.approx(0.03)
    [late] = [o for o in drain(box, now=1.2) if isinstance(o.event, rt.ResponseAudioDeltaEvent)][:1]
    assert late.lateness_s == 0.0 and late.notices == []


def test_zero_lead_sends_as_fast_as_produced_and_measures_lateness() -> None:
    box = Outbox(max_items=1000, audio_lead_ms=0)
    push_response(box, "r1", frames=3, now=0.0)
    first = [o for o in drain(box, now=0.0) if isinstance(o.event, rt.ResponseAudioDeltaEvent)]
    assert len(first) == 3 and box.next_due(0.0) is None
    push_response(box, "r2", frames=2, now=0.0)
    box.next_due(1.0)  # response.created
    box.next_due(1.0)  # transcript
    start = box.next_due(1.0)
    assert isinstance(start, Outgoing) and start.lateness_s == 0.0
    box.next_due(1.5)  # transcript
    second = box.next_due(1.5)
    assert isinstance(second, Outgoing) and second.lateness_s == pytest.approx(0.5 - 0.08)


def test_control_events_overtake_paced_audio() -> None:
    box = Outbox(max_items=1000, audio_lead_ms=100)
    push_response(box, "r1", frames=10, now=0.0)
    drain(box, now=0.0)
    assert isinstance(box.next_due(0.0), float)  # audio waits for its slot...
    box.push(control(1), now=0.0)
    due = box.next_due(0.0)
    assert isinstance(due, Outgoing) and isinstance(due.event, rt.ErrorEvent)  # ...control does not


def test_seq_is_monotonic_across_lanes_in_the_order_taken() -> None:
    box = Outbox(max_items=1000, audio_lead_ms=200)
    push_response(box, "r1", frames=8, now=0.0)
    seqs = []
    now = 0.0
    for n in range(30):
        if n % 3 == 0:
            box.push(control(n), now=now)
        due = box.next_due(now)
        if isinstance(due, Outgoing):
            seqs.append(due.event.server_event_seq)
        else:
            now += 0.04
    seqs += [o.event.server_event_seq for o in drain(box, now=10.0)]
    assert seqs == list(range(1, len(seqs) + 1))
    assert len(seqs) == 1 + 8 * 2 + 10


def test_purge_drops_unsent_audio_and_its_transcript_only() -> None:
    box = Outbox(max_items=1000, audio_lead_ms=100)
    push_response(box, "r1", frames=10, now=0.0)
    push_response(box, "r2", frames=2, now=0.0)
    sent = drain(box, now=0.0)
    assert sum(isinstance(o.event, rt.ResponseAudioDeltaEvent) for o in sent) == 2  # 0 and 80 ms
    box.push(done("r1"), "r1", now=0.0)
    assert box.queued_audio == 10
    assert box.purge("r1") == []
    rest = drain(box, now=0.0)
    kinds = [(o.response_id, type(o.event).__name__) for o in rest]
    # r2 is untouched and plays now; r1's done survives (only audio and its transcript are purged)
    assert kinds == [
        ("r2", "ResponseCreatedEvent"),
        ("r2", "ResponseAudioTranscriptDeltaEvent"),
        ("r2", "ResponseAudioDeltaEvent"),
        ("r2", "ResponseAudioTranscriptDeltaEvent"),
        ("r2", "ResponseAudioDeltaEvent"),
        ("r1", "ResponseDoneEvent"),
    ]
    assert box.queued_audio == 0 and len(box) == 0


def test_high_water_mark_tracks_queued_audio() -> None:
    box = Outbox(max_items=1000, audio_lead_ms=0, high_water=5)
    box.push(created("r1"), "r1", now=0.0)
    for i in range(4):
        box.push(audio("r1", i), "r1", FRAME_MS, now=0.0)
    assert box.has_room
    box.push(audio("r1", 4), "r1", FRAME_MS, now=0.0)
    assert not box.has_room and box.queued_audio == 5
    box.next_due(0.0)  # response.created: no audio left
    assert not box.has_room
    box.next_due(0.0)
    assert box.has_room
    for i in range(5, 9):
        box.push(audio("r1", i), "r1", FRAME_MS, now=0.0)
    assert not box.has_room
    box.purge("r1")
    assert box.has_room


def test_delivery_notice_comes_with_the_last_frame_not_before() -> None:
    box = Outbox(max_items=1000, audio_lead_ms=100)
    push_response(box, "r1", frames=4, now=0.0)
    assert box.await_delivery("r1", epoch=3) == []
    notices: list[object] = []
    now = 0.0
    while box.queued_audio:
        due = box.next_due(now)
        if isinstance(due, Outgoing):
            assert box.queued_audio or AudioDelivered("r1", 3) in due.notices
            notices += due.notices
        else:
            assert due is not None
            now += due
    assert notices == [PlaybackStarted("r1", 0.0), AudioDelivered("r1", 3)]
    # nothing queued: the notice comes at once
    assert box.await_delivery("r1", epoch=4) == [AudioDelivered("r1", 4)]


def test_delivery_notice_on_purge() -> None:
    box = Outbox(max_items=1000, audio_lead_ms=100)
    push_response(box, "r1", frames=4, now=0.0)
    assert box.await_delivery("r1", epoch=1) == []
    assert box.purge_all_audio() == [AudioDelivered("r1", 1)]
    assert box.purge("r1") == []  # reported once


def test_a_full_outbox_refuses_more() -> None:
    box = Outbox(max_items=3, audio_lead_ms=0)
    for n in range(3):
        box.push(control(n), now=0.0)
    with pytest.raises(OutboxFull):
        box.push(control(3), now=0.0)
    with pytest.raises(OutboxFull):
        box.push(audio("r1", 0), "r1", FRAME_MS, now=0.0)
    box.next_due(0.0)
    box.push(control(4), now=0.0)  # room again once one left
    assert len(box) == 3


def test_playback_clock_is_forgotten_with_response_done() -> None:
    box = Outbox(max_items=1000, audio_lead_ms=0)
    push_response(box, "r1", frames=1, now=0.0)
    box.push(done("r1"), "r1", now=0.0)
    drain(box, now=0.0)
    assert box._playback == {} and box._created == {}


def test_a_later_message_of_the_response_is_paced_from_when_it_comes() -> None:
    """A response that spoke, ran MCP calls for 5 s, then speaks a new message: the new message's
    audio is not late by the pause, and it is paced again from its first frame."""
    box = Outbox(max_items=1000, audio_lead_ms=40)
    push_response(box, "r1", frames=2, now=0.0)
    first = [o for o in drain(box, now=0.0) if isinstance(o.event, rt.ResponseAudioDeltaEvent)]
    assert len(first) == 1  # the second frame is due at 80 ms
    drain(box, now=0.1)
    for i in range(2):
        later = rt.ResponseAudioDeltaEvent(response_id="r1", item_id="item_2", output_index=2, content_index=0, delta=b"\0\0", seq=2 + i)
        box.push(later, "r1", FRAME_MS, now=5.0)
    resumed = box.next_due(5.0)
    assert isinstance(resumed, Outgoing) and resumed.lateness_s == 0.0 and resumed.notices == []
    assert box.next_due(5.0) == pytest.approx(0.04)  # paced again, from 5 s (80 ms on, 40 ms lead)
