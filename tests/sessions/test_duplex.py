"""Barge-in, playback ledger and the duplex overlap policy, on the pure session."""

from __future__ import annotations

from typing import Any

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import TtsFrame
from realtime_gw.sessions.duplex import Decision, DuplexSettings, Overlap, OverlapPolicy, Playback
from realtime_gw.sessions.events import (
    AudioDelivered,
    CancelResponse,
    Close,
    Limits,
    PlaybackStarted,
    PurgeAudio,
    ResponseAudio,
    ResponseFinished,
    StartResponse,
)
from realtime_gw.sessions.realtime import RealtimeSession
from tests.sessions.realtime_helpers import FRAME, SILENCE, decode, kinds, of, sent, speech, user_text, vad


def session(duplex: bool) -> RealtimeSession:
    s = RealtimeSession("sess_dup", Limits(), duplex=duplex)
    s.start(0.0)
    return s


def speaking_response(s: RealtimeSession, frames: int = 25, at: float = 10.0) -> StartResponse:
    """A response with two sentences of audio whose playback started at ``at``."""
    user_text(s, "hi")
    start = of(s.handle(decode('{"type":"response.create"}'), at), StartResponse)[0]
    r, e = start.response_id, start.epoch
    s.handle(ResponseAudio(r, e, TtsFrame(FRAME, text="One two three four.")), at)
    for i in range(1, frames):
        text = "Five six seven eight." if i == 10 else ""
        s.handle(ResponseAudio(r, e, TtsFrame(FRAME, text=text)), at)
    s.handle(PlaybackStarted(r, at), at)
    return start


def decisions(effects: list[Any]) -> list[str]:
    return [ev.decision for ev in sent(effects) if isinstance(ev, rt.OverlapDecisionEvent)]


def test_duplex_session_advertises_capabilities() -> None:
    s = RealtimeSession("sess_dup", Limits(), duplex=True)
    created = sent(s.start(0.0))[0]
    assert created.session.capabilities == {  # type: ignore[attr-defined]
        "supports_barge_in": True,
        "supports_playback_ack": True,
        "chunk_period_ms": 80,
    }
    plain = RealtimeSession("sess_plain", Limits())
    assert sent(plain.start(0.0))[0].session.capabilities is None  # type: ignore[attr-defined]


def test_barge_in_cancels_and_truncates_to_what_was_played() -> None:
    s = session(duplex=False)
    start = speaking_response(s, at=10.0)
    # the user starts talking 1.2 s after playback began: 1200 ms of the 2000 ms were heard
    out = vad(s, 0.0, speech(100), now=11.2)
    assert of(out, CancelResponse) and of(out, PurgeAudio)
    done = [ev for ev in sent(out) if isinstance(ev, rt.ResponseDoneEvent)]
    assert len(done) == 1 and done[0].response.status == "cancelled"
    truncated = [ev for ev in sent(out) if isinstance(ev, rt.ConversationItemTruncatedEvent)]
    assert truncated[0].audio_end_ms == 1200
    entry = s.conversation.entries()[-1]
    assert entry.item.content[0].transcript == "One two three four. Five"
    # late frames of the cancelled epoch are stale
    assert s.handle(ResponseAudio(start.response_id, start.epoch, TtsFrame(FRAME)), 11.3) == []


def test_acks_bound_the_truncation() -> None:
    s = session(duplex=True)
    start = speaking_response(s, at=10.0)
    ack = s.handle(
        decode(f'{{"type":"playback.ack","response_id":"{start.response_id}","played_ms":400}}'), 10.9
    )
    (acked,) = sent(ack)
    assert (
        isinstance(acked, rt.PlaybackAcknowledgedEvent) and acked.played_ms == 400 and acked.audio_ms == 2000
    )
    # a stale, smaller ack does not move the ledger back
    older = sent(
        s.handle(
            decode(f'{{"type":"playback.ack","response_id":"{start.response_id}","played_ms":200}}'), 10.95
        )
    )
    assert older[0].played_ms == 400  # type: ignore[attr-defined]
    playback = s.playbacks[start.response_id]
    # the client reported 400 ms at 10.9 s, so at 11.0 s it has heard about 500 ms, not the 1000 ms clock
    assert abs(playback.played_ms(11.0) - 500) < 1e-6


def test_ack_errors() -> None:
    s = session(duplex=True)
    start = speaking_response(s)
    err = sent(s.handle(decode('{"type":"playback.ack","response_id":"resp_nope","played_ms":1}'), 10))[0]
    assert err.error.code == "unknown_response" and err.error.param == "response_id"  # type: ignore[attr-defined]
    err = sent(
        s.handle(
            decode(f'{{"type":"playback.ack","response_id":"{start.response_id}","played_ms":99999}}'), 10
        )
    )[0]
    assert err.error.param == "played_ms"  # type: ignore[attr-defined]
    assert isinstance(
        rt.decode_client_event('{"type":"playback.ack","response_id":"r","played_ms":-1}'), rt.ErrorEvent
    )


def test_short_backchannel_is_dropped_and_response_continues() -> None:
    s = session(duplex=True)
    start = speaking_response(s, at=10.0)
    out = vad(s, 0.0, speech(400) + SILENCE, now=11.0)
    assert decisions(out) == ["drop"]
    assert not of(out, CancelResponse)
    assert "input_audio_buffer.committed" not in kinds(out)
    assert s.response is not None and s.response.id == start.response_id


def test_medium_speech_is_listened_to_and_answered_after_the_response() -> None:
    s = session(duplex=True)
    start = speaking_response(s, at=10.0)
    out = vad(s, 0.0, speech(900) + SILENCE, now=11.0)
    assert decisions(out) == ["listen"]
    assert not of(out, CancelResponse)
    assert "input_audio_buffer.committed" in kinds(out)
    s.handle(ResponseFinished(start.response_id, start.epoch), 11.5)
    done = s.handle(AudioDelivered(start.response_id, start.epoch), 11.6)
    assert kinds(done).count("response.done") == 1 and "response.created" in kinds(done)


def test_long_speech_barges_in_when_it_crosses_the_threshold() -> None:
    s = session(duplex=True)
    speaking_response(s, at=10.0)
    out = vad(s, 0.0, speech(1100), now=11.0)
    assert decisions(out) == [] and s.response is not None
    out = vad(s, 1088.0, speech(400), now=11.4)
    assert decisions(out) == ["barge_in"]
    assert of(out, CancelResponse)
    (decision,) = [ev for ev in sent(out) if isinstance(ev, rt.OverlapDecisionEvent)]
    assert 1200 <= decision.speech_ms < 1300
    # the utterance still becomes a user turn when it ends, answered by a new response
    end = vad(s, 1504.0, SILENCE, now=12.0)
    assert "input_audio_buffer.committed" in kinds(end) and "response.created" in kinds(end)


def test_speech_inside_echo_guard_never_interrupts() -> None:
    s = session(duplex=True)
    start = speaking_response(s, at=10.0)
    # speech detected 100 ms after the assistant became audible: inside the 400 ms echo guard
    out = vad(s, 0.0, speech(2000) + SILENCE, now=10.1)
    assert decisions(out) == ["drop"]
    assert not of(out, CancelResponse)
    reason = [ev for ev in sent(out) if isinstance(ev, rt.OverlapDecisionEvent)][0].reason
    assert "echo" in reason
    assert s.response is not None and s.response.id == start.response_id


def test_speech_after_generation_while_audio_still_plays_purges_it() -> None:
    s = session(duplex=False)
    start = speaking_response(s, at=10.0)
    s.handle(ResponseFinished(start.response_id, start.epoch), 10.1)
    s.handle(AudioDelivered(start.response_id, start.epoch), 10.2)
    out = vad(s, 0.0, speech(100), now=10.5)
    assert of(out, PurgeAudio)
    assert "output_audio_buffer.cleared" in kinds(out)
    truncated = [ev for ev in sent(out) if isinstance(ev, rt.ConversationItemTruncatedEvent)]
    assert truncated[0].audio_end_ms == 500


def test_session_close_sends_closed_and_closes() -> None:
    s = session(duplex=True)
    speaking_response(s)
    out = s.handle(decode('{"type":"session.close"}'), 10.0)
    assert of(out, CancelResponse)
    assert kinds(out)[-1] == "session.closed"
    assert of(out, Close)[0].code == 1000


def test_policy_thresholds_directly() -> None:
    policy = OverlapPolicy(
        DuplexSettings(overlap_short_ack_ms=700, overlap_barge_in_ms=1200, echo_guard_ms=400)
    )
    assert policy.end(Overlap(0, echo=False), 699) is Decision.DROP
    assert policy.end(Overlap(0, echo=False), 701) is Decision.LISTEN
    o = policy.begin(0, assistant_turn_ms=1000)
    assert policy.during(o, 1199) is None and policy.during(o, 1200) is Decision.BARGE_IN
    assert policy.end(o, 1500) is None  # decided once
    guard = policy.begin(0, assistant_turn_ms=100)
    assert policy.during(guard, 5000) is None and policy.end(guard, 5000) is Decision.DROP


def test_playback_estimate_never_exceeds_generated_audio() -> None:
    p = Playback("r", "i", audio_ms=800.0, started_at=1.0)
    assert p.played_ms(0.5) == 0.0 and p.played_ms(1.5) == 500.0 and p.played_ms(9.0) == 800.0
    assert p.audible(1.5)
    p.finished = True
    assert not p.audible(9.0)


def test_output_buffer_clear_after_generation_cuts_what_still_plays() -> None:
    """A WebRTC call's playback outlasts response.done: the client's clear stops it and truncates."""
    s = session(duplex=False)
    start = speaking_response(s, at=10.0)
    s.handle(ResponseFinished(start.response_id, start.epoch), 10.1)
    s.handle(AudioDelivered(start.response_id, start.epoch), 10.2)
    out = s.handle(decode('{"type":"output_audio_buffer.clear"}'), 10.5)
    assert of(out, PurgeAudio) and not of(out, CancelResponse)  # nothing live to cancel
    assert kinds(out) == ["output_audio_buffer.cleared", "conversation.item.truncated"]
    assert [ev for ev in sent(out) if isinstance(ev, rt.ConversationItemTruncatedEvent)][0].audio_end_ms == 500
    assert s.handle(decode('{"type":"output_audio_buffer.clear"}'), 10.6) == []  # nothing plays any more
