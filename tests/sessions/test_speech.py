"""The speech stream's session, as events and effects: segments at sentence ends, one TTS stream at a
time, audio reframed to 80 ms and counted, refusals and faults said in order, text bounds, expiry."""

from __future__ import annotations

from typing import Any

from realtime_gw.protocols import speech as sp
from realtime_gw.records.voice import FRAME_SAMPLES
from realtime_gw.sessions.speech import (
    Close,
    Expired,
    SegmentAudio,
    SegmentEnded,
    SegmentFailed,
    SegmentRefused,
    Send,
    Speak,
    SpeechLimits,
    SpeechSession,
)

FRAME = b"\x01\x00" * FRAME_SAMPLES


def session(**limits: Any) -> SpeechSession:
    return SpeechSession(SpeechLimits(voices=frozenset({"default", "alloy"}), **limits))


def text(s: SpeechSession, piece: str) -> list[Any]:
    return s.handle(sp.InputText(text=piece))


def sent(effects: list[Any]) -> list[Any]:
    return [e.item for e in effects if isinstance(e, Send)]


def speaks(effects: list[Any]) -> list[Speak]:
    return [e for e in effects if isinstance(e, Speak)]


def errors(effects: list[Any]) -> list[sp.StreamError]:
    return [i for i in sent(effects) if isinstance(i, sp.StreamError)]


def test_complete_sentences_are_spoken_one_segment_at_a_time() -> None:
    s = session()
    first = text(s, "Hello there. And")
    assert isinstance(sent(first)[0], sp.AudioStart) and sent(first)[0].utterance == 1
    (speak,) = speaks(first)
    assert speak.text == "Hello there. " and s.speaking and s.pending == "And"
    assert speaks(text(s, " then. More.")) == []  # one segment at a time: the next waits
    assert s.handle(SegmentEnded(speak.segment)) == [Speak(speak.segment + 1, "And then. ", speak.request)]
    assert s.pending == "More."  # "More." may go on ("More.com"): it waits, with no stream open
    assert s.handle(SegmentEnded(speak.segment + 1)) == [] and not s.speaking


def test_input_done_speaks_the_rest_then_ends_the_utterance_with_its_count() -> None:
    s = session()
    text(s, "Unfinished")
    assert s.takes_text
    (speak,) = speaks(s.handle(sp.InputDone()))
    assert speak.text == "Unfinished" and not s.takes_text  # the utterance finishes: the next waits
    audio = s.handle(SegmentAudio(speak.segment, FRAME + FRAME[:100]))  # reframed to 80 ms
    assert [len(f) for f in sent(audio)] == [len(FRAME)] and all(e.audio for e in audio)
    done = s.handle(SegmentEnded(speak.segment))
    tail, finished = sent(done)
    assert tail == FRAME[:100] and isinstance(finished, sp.AudioDone)
    assert (finished.frames, finished.text) == (2, "Unfinished") and finished.audio_ms == (
        FRAME_SAMPLES + 50
    ) / 24
    assert s.utterance is None and s.takes_text
    assert errors(s.handle(sp.InputDone()))[0].code == "no_utterance"
    assert sent(text(s, "Next."))[0].utterance == 2


def test_results_of_an_old_segment_are_dropped() -> None:
    s = session()
    (speak,) = speaks(text(s, "One. Two"))
    s.handle(SegmentEnded(speak.segment))
    assert s.handle(SegmentAudio(speak.segment, FRAME)) == []
    assert s.handle(SegmentEnded(speak.segment)) == []


def test_refusals_and_faults_are_said_in_the_audio_order_and_the_utterance_goes_on() -> None:
    s = session()
    (speak,) = speaks(text(s, "One. "))
    text(s, "Two. ")
    refused = s.handle(SegmentRefused(speak.segment, "no free tts slot"))
    (busy,) = errors(refused)
    assert busy.code == "server_busy" and busy.message == "no free tts slot" and refused[0].audio
    s.handle(sp.InputDone())
    failed = s.handle(SegmentFailed(speaks(refused)[0].segment, "worker died"))
    assert (
        errors(failed)[0].code == "server_error"
        and errors(failed)[0].message == "synthesis failed: worker died"
    )
    assert isinstance(sent(failed)[-1], sp.AudioDone)


def test_whitespace_is_never_a_segment() -> None:
    s = session()
    (speak,) = speaks(text(s, "One.\n"))
    assert speaks(text(s, "\n\n  ")) == []
    assert speaks(s.handle(SegmentEnded(speak.segment))) == []  # only whitespace waited


def test_text_bounds() -> None:
    s = session(max_pending_chars=50, max_utterance_chars=120)
    (too_long,) = errors(text(s, "x" * 51))
    assert too_long.code == "string_above_max_length" and "over the limit of 50" in too_long.message
    assert s.utterance is None  # nothing started
    assert speaks(text(s, "y " * 20)) == []  # 40 characters without a sentence end: waits
    (speak,) = speaks(text(s, "y " * 20))  # 80 waiting, over the bound: cut at the last space
    assert speak.text == "y " * 40 and s.takes_text
    text(s, "y " * 20)
    (over,) = errors(text(s, "z"))
    assert "exceed 120" in over.message and s.utterance is not None and s.utterance.chars == 120
    assert errors(text(s, "")) == [
        sp.StreamError(message="input.text needs non-empty text", code="invalid_value", param="text")
    ]


def test_pending_text_at_its_bound_always_has_a_segment() -> None:
    s = session(max_pending_chars=10)
    (speak,) = speaks(text(s, "abcdefghij"))  # no space, no sentence end: the whole of it
    assert speak.text == "abcdefghij"
    assert not s.takes_text or s.pending == ""


def test_session_config() -> None:
    s = session()
    assert s.handle(sp.SessionConfig(voice="alloy", speed=1.5, instructions="Slowly")) == []
    (speak,) = speaks(text(s, "Hi. "))
    assert (speak.request.voice, speak.request.speed, speak.request.instructions) == ("alloy", 1.5, "Slowly")
    assert errors(s.handle(sp.SessionConfig()))[0].code == "utterance_in_progress"
    s.handle(sp.InputDone())
    s.handle(SegmentEnded(speak.segment))
    assert errors(s.handle(sp.SessionConfig(voice="nobody")))[0].param == "voice"
    assert errors(s.handle(sp.SessionConfig(speed=9.0)))[0].param == "speed"
    assert (
        errors(s.handle(sp.SessionConfig(instructions="x" * (sp.MAX_INSTRUCTIONS_CHARS + 1))))[0].param
        == "instructions"
    )
    assert s.config.voice == "alloy"  # refused changes leave it as it was


def test_a_frame_the_transport_could_not_take_is_answered_and_expiry_closes() -> None:
    s = session()
    bad = sp.StreamError(message="Binary frames are not accepted; send JSON events", code="invalid_frame")
    assert s.handle(bad) == [Send(bad)]
    why = "session was idle for 30 s (no client event)"
    error, close = s.handle(Expired(why))
    assert isinstance(error, Send) and error.item.code == "session_expired" and why in error.item.message
    assert close == Close(1000, why)
