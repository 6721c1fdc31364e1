"""Transcription sessions, a mode of the realtime session: opened so (``?intent=transcription``) or
switched by ``session.update`` with ``type: "transcription"``; turns are heard, streamed and
transcribed, never answered; the session echoes its input settings only."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from openai.types.realtime import RealtimeTranscriptionSessionCreateRequest, SessionCreatedEvent

from realtime_gw.protocols import realtime as rt
from realtime_gw.sessions.events import (
    Limits,
    StartAsr,
    StartResponse,
    Transcribe,
    TranscriptionDelta,
    TranscriptionDone,
)
from realtime_gw.sessions.realtime import RealtimeSession
from tests.sessions.realtime_helpers import decode, errors, kinds, of, sent, vad


def opened(now: float = 0.0) -> tuple[RealtimeSession, list[Any]]:
    s = RealtimeSession("sess_tr", Limits(), transcription=True)
    return s, s.start(now)


def update(s: RealtimeSession, session: dict[str, Any]) -> list[Any]:
    return s.handle(decode(json.dumps({"type": "session.update", "session": session})), 0.0)


def test_created_as_a_transcription_session_in_the_sdk_shape() -> None:
    s, out = opened()
    (created,) = sent(out)
    wire = msgspec.json.encode(created)
    event = SessionCreatedEvent.model_validate_json(wire)
    assert isinstance(event.session, RealtimeTranscriptionSessionCreateRequest)
    assert event.session.type == "transcription" and event.session.audio and event.session.audio.input
    assert event.session.audio.input.turn_detection is not None  # server VAD by default
    assert event.session.audio.input.transcription is not None  # turns are always transcribed
    assert "instructions" not in json.loads(wire)["session"]


def test_a_turn_is_streamed_and_transcribed_and_never_answered() -> None:
    s, _ = opened()
    s.handle(rt.InputAudioBufferAppendEvent(audio=b"\x01\x00" * 24 * 640), 0.0)
    started = vad(s, 0.0, [0.0] * 10 + [0.9] * 10)
    (asr,) = of(started, StartAsr)
    partial = s.handle(TranscriptionDelta(asr.item_id, "hello there general"), 0.3)
    partial += s.handle(TranscriptionDelta(asr.item_id, "hello there general kenobi"), 0.4)
    assert [e.delta for e in sent(partial)] == ["hello there"]
    stopped = vad(s, 640.0, [0.9] * 20 + [0.0] * 20)
    assert kinds(stopped)[:2] == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]
    assert of(stopped, Transcribe) and not of(stopped, StartResponse)
    done = s.handle(TranscriptionDone(asr.item_id, "hello there general kenobi"), 1.0)
    assert kinds(done) == [
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
    ]
    assert not of(done, StartResponse) and s.response is None


def test_response_create_is_refused() -> None:
    s, _ = opened()
    (err,) = errors(s.handle(decode('{"type":"response.create"}'), 0.0))
    assert "transcription session" in err.error.message and s.response is None


def test_session_update_switches_the_mode_and_checks_its_fields() -> None:
    s = RealtimeSession("sess_rt", Limits())
    s.start(0.0)
    out = update(s, {"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcmu"},
                                                                   "noise_reduction": {"type": "near_field"}}}})
    (updated,) = sent(out)
    assert isinstance(updated.session, rt.TranscriptionSessionOut)
    assert updated.session.audio["input"]["format"] == {"type": "audio/pcmu"}
    assert updated.session.audio["input"]["noise_reduction"] == {"type": "near_field"}
    assert s.settings.transcription is not None and not s.settings.answers
    for bad, param in [
        ({"instructions": "be brief"}, "session.instructions"),
        ({"audio": {"output": {"voice": "alloy"}}}, "session.audio.output"),
        ({"include": ["item.input_audio_transcription.logprobs"]}, "session.include"),
        ({"type": "translation"}, "session.type"),
    ]:
        (err,) = errors(update(s, {"type": "transcription", **bad}))
        assert err.error.param == param, (bad, err)
    assert not s.settings.answers  # refused updates changed nothing
    (back,) = sent(update(s, {"type": "realtime"}))
    assert isinstance(back.session, rt.SessionOut) and s.settings.answers


def test_no_switch_to_transcription_while_a_response_runs() -> None:
    s = RealtimeSession("sess_rt", Limits())
    s.start(0.0)
    s.handle(decode('{"type":"response.create"}'), 0.0)
    assert s.response is not None
    (err,) = errors(update(s, {"type": "transcription"}))
    assert err.error.param == "session.type" and s.settings.answers
