"""Streamed transcription and semantic end of turn, as effects: the turn's ASR stream starts with the
speech (or the first append of a manual turn), deltas go out while the user speaks, the commit ends
the stream under the item id speech_started announced; semantic VAD asks the turn model at pauses."""

from __future__ import annotations

from typing import Any

from realtime_gw.protocols import realtime as rt
from realtime_gw.sessions.events import (
    AskTurn,
    AsrUnavailable,
    CancelAsr,
    FeedAsr,
    FeedVad,
    Limits,
    StartAsr,
    StartResponse,
    Transcribe,
    TranscriptionDelta,
    TranscriptionDone,
    TurnVerdict,
)
from realtime_gw.sessions.realtime import RealtimeSession
from tests.sessions.realtime_helpers import decode, kinds, of, sent, vad

MS = 48  # bytes per ms of 24 kHz PCM16
TRANSCRIBE = '"transcription":{"model":"pocketsphinx"}'


def session(turn_detection: str = '{"type":"server_vad"}', transcription: bool = True) -> RealtimeSession:
    s = RealtimeSession("sess_asr", Limits())
    s.start(0.0)
    audio_in = f'"turn_detection":{turn_detection}' + (f",{TRANSCRIBE}" if transcription else "")
    s.handle(decode(f'{{"type":"session.update","session":{{"audio":{{"input":{{{audio_in}}}}}}}}}'), 0.0)
    return s


def append(s: RealtimeSession, ms: int, now: float = 0.0) -> list[Any]:
    return s.handle(rt.InputAudioBufferAppendEvent(audio=b"\x01\x00" * 24 * ms), now)


def deltas(effects: list[Any]) -> list[str]:
    return [
        e.delta for e in sent(effects) if isinstance(e, rt.ConversationItemInputAudioTranscriptionDeltaEvent)
    ]


def test_server_vad_turn_streams_while_speaking_and_commits_under_the_announced_id() -> None:
    s = session()
    assert not of(append(s, 640), StartAsr)  # nobody speaks yet: nothing to transcribe
    started = vad(s, 0.0, [0.0] * 10 + [0.9] * 10)  # speech from 320 ms
    (event,) = [e for e in sent(started) if isinstance(e, rt.InputAudioBufferSpeechStartedEvent)]
    start, backlog = of(started, StartAsr)[0], of(started, FeedAsr)[0]
    assert start.item_id == event.item_id and start.sample_rate == 24000
    assert len(backlog.pcm) == (640 - 320 + 300) * MS  # from the prefix padding to what was appended
    fed = append(s, 1000)
    assert of(fed, FeedAsr) == [FeedAsr(start.item_id, b"\x01\x00" * 24 * 1000)] and of(fed, FeedVad)

    # Partial hypotheses: a word goes out, once, when two consecutive hypotheses agree on it and it is
    # not the last of either, while the user is still speaking.
    def partial(text: str, now: float) -> list[str]:
        return deltas(s.handle(TranscriptionDelta(start.item_id, text), now))

    assert partial("what is", 0.5) == []  # one hypothesis: nothing agreed yet
    assert partial("what is the weather", 0.6) == ["what"]
    assert partial("what is the whether", 0.7) == [" is the"]
    assert partial("what it", 0.8) == []  # nothing unsent
    # A revised word already sent ("the" -> "a") is not taken back; the words after it stream once two
    # hypotheses agree on them.
    assert partial("what is a weather like in", 0.9) == []
    assert partial("what is a weather like in paris", 0.95) == [" weather like"]

    stopped = vad(s, 640.0, [0.9] * 20 + [0.0] * 20)
    assert kinds(stopped)[:2] == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]
    (tr,) = of(stopped, Transcribe)
    assert tr.streamed and tr.item_id == start.item_id and tr.pcm
    assert tr.silence_s == (1792 - 1280) / 1000  # speech ended at 1280 ms; 500 ms of silence, whole windows
    assert not of(stopped, StartResponse), "the response waits for the transcript"
    done = s.handle(TranscriptionDone(start.item_id, "what is the weather like in paris"), 1.0)
    assert deltas(done) == [" in paris"]  # only what the deltas had not said
    (completed,) = [
        e for e in sent(done) if isinstance(e, rt.ConversationItemInputAudioTranscriptionCompletedEvent)
    ]
    assert completed.transcript == "what is the weather like in paris" and completed.item_id == start.item_id
    (response,) = of(done, StartResponse)
    assert response.messages[-1].content == "what is the weather like in paris"


def test_manual_turns_stream_from_the_first_append_and_clear_cancels() -> None:
    s = session("null")
    first = append(s, 200)
    (start,) = of(first, StartAsr)
    assert of(first, FeedAsr) == [FeedAsr(start.item_id, b"\x01\x00" * 24 * 200)]
    assert of(append(s, 100), FeedAsr)[0].item_id == start.item_id
    cleared = s.handle(decode('{"type":"input_audio_buffer.clear"}'), 0.0)
    assert of(cleared, CancelAsr) == [CancelAsr(start.item_id)]
    (again,) = of(append(s, 300), StartAsr)
    assert again.item_id != start.item_id
    committed = s.handle(decode('{"type":"input_audio_buffer.commit"}'), 0.0)
    (tr,) = of(committed, Transcribe)
    assert tr.streamed and tr.item_id == again.item_id and len(tr.pcm) == 300 * MS
    assert tr.silence_s == 0.0  # the client's commit says nothing of silence
    assert sent(committed)[0].item_id == again.item_id  # type: ignore[attr-defined]
    assert of(s.close(), CancelAsr) == [CancelAsr(again.item_id)]  # its transcript is moot now


def test_without_transcription_no_deltas_but_the_transcript_still_feeds_the_reply() -> None:
    s = session("null", transcription=False)
    (start,) = of(append(s, 300), StartAsr)
    assert s.handle(TranscriptionDelta(start.item_id, "open the door"), 0.0) == []
    s.handle(decode('{"type":"input_audio_buffer.commit"}'), 0.0)
    s.handle(decode('{"type":"response.create"}'), 0.0)
    done = s.handle(TranscriptionDone(start.item_id, "open the door"), 0.0)
    assert not deltas(done) and of(done, StartResponse)[0].messages[-1].content == "open the door"


def test_a_commit_without_a_stream_transcribes_in_one_shot() -> None:
    s = session()
    append(s, 1000)
    committed = s.handle(decode('{"type":"input_audio_buffer.commit"}'), 0.0)  # no speech was heard
    (tr,) = of(committed, Transcribe)
    assert not tr.streamed and len(tr.pcm) == 1000 * MS
    done = s.handle(TranscriptionDone(tr.item_id, "hello there"), 0.0)
    assert deltas(done) == ["hello there"]  # one-shot: the whole transcript in one delta, as before


def test_no_free_decoder_the_turn_goes_on_and_its_commit_decodes_in_one_shot() -> None:
    """The transport could not open the turn's stream: the session stops feeding it, keeps the item
    id speech_started announced, and asks for the one-shot decode at the commit."""
    s = session()
    append(s, 640)
    (start,) = of(vad(s, 0.0, [0.0] * 10 + [0.9] * 10), StartAsr)
    assert s.handle(AsrUnavailable(start.item_id, "no free asr slot"), 0.0) == []  # nothing to tell yet
    fed = append(s, 1000)
    assert of(fed, FeedVad) and not of(fed, FeedAsr)  # VAD still hears the turn; no stream does
    stopped = vad(s, 640.0, [0.9] * 20 + [0.0] * 20)
    assert kinds(stopped)[:2] == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]
    (tr,) = of(stopped, Transcribe)
    assert tr.item_id == start.item_id and not tr.streamed and tr.pcm
    assert not of(stopped, CancelAsr)  # there is no stream to cancel


def test_no_decoder_at_the_commit_either_fails_the_transcription_and_the_turn_goes_on() -> None:
    s = session("null")
    (start,) = of(append(s, 300), StartAsr)
    s.handle(AsrUnavailable(start.item_id, "no free asr slot"), 0.0)
    assert not of(append(s, 100), FeedAsr) and not of(append(s, 100), StartAsr)  # one turn, one id
    (tr,) = of(s.handle(decode('{"type":"input_audio_buffer.commit"}'), 0.0), Transcribe)
    assert tr.item_id == start.item_id and not tr.streamed and len(tr.pcm) == 500 * MS
    s.handle(decode('{"type":"response.create"}'), 0.0)
    done = s.handle(TranscriptionDone(tr.item_id, None, "no free asr slot"), 0.0)
    (failed,) = [e for e in sent(done) if isinstance(e, rt.ConversationItemInputAudioTranscriptionFailedEvent)]
    assert failed.item_id == start.item_id and "no free asr slot" in failed.error.message
    assert of(done, StartResponse), "the turn still gets its reply"


# -- semantic VAD ------------------------------------------------------------------------------------------
def semantic(eagerness: str = "medium") -> tuple[RealtimeSession, str]:
    s = session(f'{{"type":"semantic_vad","eagerness":"{eagerness}"}}')
    append(s, 4000)
    started = vad(s, 0.0, [0.9] * 30)  # speech from 0 to 960 ms
    return s, of(started, StartAsr)[0].item_id


def test_semantic_vad_asks_the_turn_model_at_a_pause_and_ends_a_complete_turn() -> None:
    s, item_id = semantic()
    assert not of(vad(s, 960.0, [0.0] * 5), AskTurn)  # 160 ms: not a pause yet
    asked = vad(s, 1120.0, [0.0] * 2)
    (ask,) = of(asked, AskTurn)
    assert len(ask.pcm) == 1184 * MS and ask.sample_rate == 24000  # the turn so far, pause included
    assert "input_audio_buffer.speech_stopped" not in kinds(asked)
    assert vad(s, 1184.0, [0.0] * 3) == []  # asked once per pause
    ended = s.handle(TurnVerdict(ask.pause_id, 0.9), 1.3)
    assert kinds(ended)[:2] == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]
    assert of(ended, Transcribe)[0].item_id == item_id and of(ended, Transcribe)[0].streamed


def test_semantic_vad_waits_on_an_unfinished_turn_until_speech_or_the_max_timeout() -> None:
    s, _ = semantic("high")  # high: 2 s at most
    (ask,) = of(vad(s, 960.0, [0.0] * 7), AskTurn)
    assert s.handle(TurnVerdict(ask.pause_id, 0.1), 1.2) == []  # unfinished: keep listening
    resumed = vad(s, 1184.0, [0.9] * 10 + [0.0] * 7)  # the user goes on, then pauses again
    (again,) = of(resumed, AskTurn)
    assert again.pause_id != ask.pause_id
    assert s.handle(TurnVerdict(ask.pause_id, 0.99), 2.0) == []  # stale: speech came after it
    waited = vad(s, 1728.0, [0.0] * 62)  # 2 s of silence after the last voice
    assert "input_audio_buffer.speech_stopped" in kinds(waited) and of(waited, Transcribe)


def test_semantic_vad_without_an_answer_falls_back_to_silence_length() -> None:
    s, _ = semantic("medium")
    (ask,) = of(vad(s, 960.0, [0.0] * 7), AskTurn)
    assert s.handle(TurnVerdict(ask.pause_id, None, "turn: no free slot"), 1.2) == []
    ended = vad(s, 1184.0, [0.0] * 16)  # 700 ms of silence: the old per-eagerness length
    assert "input_audio_buffer.speech_stopped" in kinds(ended)


def test_eagerness_sets_how_sure_the_model_must_be() -> None:
    for eagerness, probability, ends in [("low", 0.7, False), ("low", 0.85, True), ("high", 0.35, True)]:
        s, _ = semantic(eagerness)
        (ask,) = of(vad(s, 960.0, [0.0] * 7), AskTurn)
        out = s.handle(TurnVerdict(ask.pause_id, probability), 1.2)
        assert ("input_audio_buffer.speech_stopped" in kinds(out)) is ends, (eagerness, probability)


def test_the_turn_model_is_sent_the_last_8_seconds_of_a_long_turn() -> None:
    s = session('{"type":"semantic_vad"}')
    append(s, 12000)
    vad(s, 0.0, [0.9] * 320)  # 10.24 s of speech
    (ask,) = of(vad(s, 10240.0, [0.0] * 7), AskTurn)
    assert len(ask.pcm) == 8000 * MS
