"""Turn-taking: VAD decisions and what they lead to, a VAD stream the transport cannot (re)open,
and regressions of turns whose effects used to be lost."""

from __future__ import annotations

from typing import Any

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import TtsFrame, VadProbs
from realtime_gw.sessions.events import (
    AudioDelivered,
    FeedVad,
    Ids,
    Limits,
    PlaybackStarted,
    ResponseAudio,
    ResponseFinished,
    Send,
    StartResponse,
    StartVad,
    StopVad,
    Tick,
    Transcribe,
    TranscriptionDone,
    VadResult,
    VadUnavailable,
)
from realtime_gw.sessions.realtime import RealtimeSession
from realtime_gw.sessions.settings import SessionSettings
from realtime_gw.sessions.turns import Interrupt, TurnEnded, Turns, UserTurn
from tests.sessions.realtime_helpers import (
    FRAME,
    SILENCE,
    WINDOW,
    decode,
    done_of,
    kinds,
    of,
    sent,
    speech,
    start_response,
    user_text,
    vad,
)

SECOND = b"\x00\x00" * 24000


def vad_session(limits: Limits | None = None, duplex: bool = False) -> RealtimeSession:
    """A server-VAD session; with ``limits``, ``truncation: "disabled"`` so ``max_items`` is a hard cap."""
    s = RealtimeSession("sess_turns", limits or Limits(), duplex=duplex)
    s.start(0.0)
    if limits is not None:
        s.handle(decode('{"type":"session.update","session":{"truncation":"disabled"}}'), 0.0)
    return s


# -- a VAD stream the transport cannot (re)open -------------------------------------------------------
def test_vad_that_cannot_open_is_reported_once_and_turns_fall_back_to_manual_commits() -> None:
    s = vad_session()
    idle = '{"type":"server_vad","idle_timeout_ms":1000}'
    s.handle(
        decode(f'{{"type":"session.update","session":{{"audio":{{"input":{{"turn_detection":{idle}}}}}}}}}'),
        0,
    )
    stream = s.vad_stream
    out = s.handle(VadUnavailable(stream, "vad: no free slot"), 0)
    (err,) = sent(out)
    assert err.error.code == "server_busy" and err.error.type == "server_error"  # type: ignore[attr-defined]
    assert "no free slot" in err.error.message  # type: ignore[attr-defined]
    assert of(out, StopVad) == [StopVad(stream)] and s.vad_stream == 0
    # once: the same stream reported again (or any result of it) changes nothing
    assert s.handle(VadUnavailable(stream, "vad: no free slot"), 0) == []
    assert s.handle(VadResult(VadProbs(0.0, WINDOW, [0.9] * 5), stream), 0) == []
    # audio is no longer fed to a VAD stream, no idle timeout fires, and the client commits
    assert not of(s.handle(rt.InputAudioBufferAppendEvent(audio=SECOND), 0), FeedVad)
    assert s.handle(Tick(), 60.0) == []
    committed = s.handle(decode('{"type":"input_audio_buffer.commit"}'), 60.0)
    assert kinds(committed)[0] == "input_audio_buffer.committed"
    assert len(of(committed, Transcribe)[0].pcm) == len(SECOND)


def test_vad_lost_mid_turn_leaves_the_turn_to_the_client() -> None:
    s = vad_session()
    s.handle(rt.InputAudioBufferAppendEvent(audio=SECOND), 0)
    started = sent(vad(s, 0.0, [0.0] * 5 + speech(300)))
    assert [type(e) for e in started] == [rt.InputAudioBufferSpeechStartedEvent]
    s.handle(VadUnavailable(s.vad_stream, "vad: no free slot"), 0)
    # the session no longer waits for a speech_stopped that cannot come: the client commits, and
    # the committed item is the one speech_started announced
    committed = sent(s.handle(decode('{"type":"input_audio_buffer.commit"}'), 0))[0]
    assert committed.item_id == started[0].item_id  # type: ignore[attr-defined]
    user_text(s, "hi")
    assert of(s.handle(decode('{"type":"response.create"}'), 0), StartResponse) == [], (
        "waits for the transcript only"
    )


def test_setting_turn_detection_again_retries_vad() -> None:
    s = vad_session()
    lost = s.vad_stream
    s.handle(VadUnavailable(lost, "vad: no free slot"), 0)
    assert not of(
        s.handle(decode('{"type":"session.update","session":{"instructions":"Be brief."}}'), 0), StartVad
    )
    retry = s.handle(
        decode(
            '{"type":"session.update","session":{"audio":{"input":{"turn_detection":{"type":"server_vad"}}}}}'
        ),
        0,
    )
    (start,) = of(retry, StartVad)
    assert start.stream_id not in (0, lost) and s.vad_stream == start.stream_id
    assert of(s.handle(rt.InputAudioBufferAppendEvent(audio=SECOND), 0), FeedVad)


def test_vad_unavailable_for_a_replaced_stream_is_stale() -> None:
    s = vad_session()
    old = s.vad_stream
    s.handle(
        decode(
            '{"type":"session.update","session":{"audio":{"input":{"format":{"type":"audio/pcm","rate":16000}}}}}'
        ),
        0,
    )
    assert s.vad_stream != old
    assert s.handle(VadUnavailable(old, "vad: no free slot"), 0) == []
    assert s.vad_stream != 0


# -- Turns on its own -------------------------------------------------------------------------------
def test_turns_decide_and_the_session_carries_out() -> None:
    turns = Turns(Ids("sess_unit"), duplex=False)
    settings = SessionSettings()
    turns.restart_vad(settings.turn_detection, 24000, origin_ms=0.0)
    steps: list[Any] = []
    for i, p in enumerate([0.9] + [0.0] * 20):
        steps += turns.hear(settings, i * WINDOW, WINDOW, p, now=0.0, responding=True)
    assert isinstance(steps[0], Send) and isinstance(steps[0].event, rt.InputAudioBufferSpeechStartedEvent)
    assert isinstance(steps[1], Interrupt), "speech over a live response barges in"
    assert isinstance(steps[2], Send) and isinstance(steps[2].event, rt.InputAudioBufferSpeechStoppedEvent)
    turn = steps[3]
    assert isinstance(turn, UserTurn) and turn.respond
    assert turn.item_id == steps[0].event.item_id  # type: ignore[attr-defined]
    assert turn.start_ms == -300 and turn.end_ms == 544  # prefix padding .. the window 500 ms past the voice
    assert steps[4:] == [TurnEnded()]  # every end of a turn has this one outcome, as a commit and a timeout do
    assert turns.committed() == [TurnEnded()]
    assert turns.timed_out("item_x", 0.0, 100.0)[1:] == [TurnEnded()]


# -- regressions ----------------------------------------------------------------------------------------
def speaking_response(s: RealtimeSession, at: float = 10.0) -> StartResponse:
    user_text(s, "hi")
    start = start_response(s)
    for _ in range(25):
        s.handle(ResponseAudio(start.response_id, start.epoch, TtsFrame(FRAME, text="Words.")), at)
    s.handle(PlaybackStarted(start.response_id, at), at)
    return start


def test_a_listened_turn_is_not_answered_twice_after_its_response_is_cancelled() -> None:
    """The 'answer after this response' of a listened-to turn belongs to that response: cancelled,
    it is dropped (the turn is in the conversation, answered by the next response the client makes),
    instead of lingering and spawning an extra response after some later one."""
    s = vad_session(duplex=True)
    speaking_response(s)
    listened = vad(s, 0.0, speech(900) + SILENCE, now=11.0)
    assert "input_audio_buffer.committed" in kinds(listened) and "response.created" not in kinds(listened)
    assert done_of(s.handle(decode('{"type":"response.cancel"}'), 11.1)).response.status == "cancelled"
    s.handle(TranscriptionDone(of(listened, Transcribe)[0].item_id, "go on"), 11.2)
    start = start_response(s)
    s.handle(ResponseAudio(start.response_id, start.epoch, TtsFrame(FRAME, text="Sure.")), 12.0)
    s.handle(ResponseFinished(start.response_id, start.epoch), 12.0)
    done = s.handle(AudioDelivered(start.response_id, start.epoch), 12.1)
    assert kinds(done)[-2:] == ["response.done", "rate_limits.updated"] and "response.created" not in kinds(
        done
    )
    assert s.response is None


def test_a_full_conversation_during_barge_in_keeps_the_cancelled_response_done() -> None:
    """Barge-in and the end of the turn in one VAD batch, the turn refused (conversation full): the
    cancelled response's response.done still goes out, with the error after it."""
    s = vad_session(Limits(max_items=2))
    speaking_response(s)  # user item + assistant item: full
    out = vad(s, 0.0, speech(200) + SILENCE, now=10.5)
    done = [ev for ev in sent(out) if isinstance(ev, rt.ResponseDoneEvent)]
    assert len(done) == 1 and done[0].response.status == "cancelled"
    assert kinds(out)[-1] == "error" and sent(out)[-1].error.code == "conversation_full"  # type: ignore[attr-defined]
    assert s.response is None and not s.conversation.transcripts_pending


def test_a_full_conversation_when_answering_after_a_response_keeps_its_done() -> None:
    s = vad_session(Limits(max_items=3))
    no_interrupt = '{"type":"server_vad","interrupt_response":false}'
    s.handle(
        decode(
            f'{{"type":"session.update","session":{{"audio":{{"input":{{"turn_detection":{no_interrupt}}}}}}}}}'
        ),
        0,
    )
    start = speaking_response(s)
    turn = vad(s, 0.0, speech(300) + SILENCE, now=10.5)  # committed (3 items: full), answered later
    assert "input_audio_buffer.committed" in kinds(turn) and "response.created" not in kinds(turn)
    s.handle(ResponseFinished(start.response_id, start.epoch), 11.0)
    out = s.handle(AudioDelivered(start.response_id, start.epoch), 12.0)
    assert kinds(out).count("response.done") == 1 and sent(out)[-1].error.code == "conversation_full"  # type: ignore[attr-defined]
    assert s.response is None
