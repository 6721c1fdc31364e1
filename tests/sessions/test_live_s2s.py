"""A GPT-Live session whose ``session.start`` names the speech-to-speech model, fed events (no server):
it starts once the model's stream is open, the model's steps become the output stream and its
transcript (through the wire, as written), barge-in and fixtures hold the model silent until the
user's turn ends, and what the model cannot take is ignored with an ``info`` where clients send it by
default, refused where none would. Every GPT-Live event is validated by the SDK's models."""

from __future__ import annotations

import base64
import json
from typing import Any

from realtime_gw.protocols import live
from realtime_gw.records.s2s import S2sAudio, S2sSilence
from realtime_gw.records.voice import VadProbs
from realtime_gw.sessions.events import (
    AudioDelivered,
    AwaitDelivery,
    Close,
    Limits,
    OpenS2s,
    PurgeAudio,
    S2sOpened,
    S2sRefused,
    Send,
    VadResult,
)
from realtime_gw.sessions.live import LiveSession
from realtime_gw.sessions.live_s2s import DuplexModels
from realtime_gw.sessions.live_wire import LiveWire
from realtime_gw.sessions.s2s import S2sBinding
from tests.server.live_events import validate_live
from tests.sessions.test_s2s import RULE, SPEC, STEP, Model

CAPABILITIES = "audio_in, audio_out, text_out"
MODELS = DuplexModels(S2sBinding(SPEC, RULE), frozenset({"moshi"}), frozenset({"personaplex"}))
LIVEKIT_DEFAULTS = {
    "instructions": "You are a helpful assistant.",
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi."}]}],  # pipecat's history
    "delegation": {"type": "responses", "responses": {"model": "gpt-5.4-mini", "tools": []}},
    "audio": {"output": {"voice": "marin"}},
}


def client(s: LiveSession, event: dict[str, Any], now: float = 1.0) -> list[Any]:
    return s.handle(live.decode_client_event(json.dumps(event)), now)


def sent(effects: list[Any], wire: LiveWire | None = None, now: float = 1.0) -> list[Any]:
    """The GPT-Live events among ``effects`` as written (realtime events through ``wire``), validated."""
    out = []
    for e in effects:
        if not isinstance(e, Send):
            continue
        event = wire.translate(e.event, now) if wire is not None else e.event
        if isinstance(event, live.ServerEvent):
            out.append(validate_live(live.encode_server_event(event)))
    return out


def kinds(effects: list[Any], wire: LiveWire | None = None) -> list[str]:
    return [e.type for e in sent(effects, wire)]


def opened(**config: Any) -> tuple[LiveSession, list[Any], LiveWire]:
    """A session started on the model, its stream open: the session, what the opening sent, its wire."""
    s = LiveSession("sess_live_s2s", Limits(voices=frozenset({"default", "marin"})), 0.0, 600.0, 1.8e9, MODELS)
    starting = client(s, {"type": "session.start", "event_id": "go", "session": {"model": "moshi", **config}}, 0.0)
    assert [type(e) for e in starting if isinstance(e, OpenS2s)] == [OpenS2s]
    assert kinds(starting) == []  # not started before the model's stream is open
    wire = LiveWire()
    out = s.handle(S2sOpened(), 0.0)
    assert sent(out, wire, 0.0)[0].type == "session.started"
    return s, out, wire


def vad(s: LiveSession, start_ms: float, probs: list[float], now: float) -> list[Any]:
    return s.handle(VadResult(VadProbs(start_ms, 32.0, probs), s.inner.vad_stream), now)


def test_a_start_naming_the_model_runs_on_the_stage_once_its_stream_is_open() -> None:
    s, out, wire = opened(**LIVEKIT_DEFAULTS)
    started, mapped, ignored = sent(out)
    assert started.client_event_id == "go" and started.session.model == "moshi"
    assert started.session.delegation.type == "responses"  # echoed as asked
    assert mapped.code == "model_mapped" and "speech-to-speech" in mapped.message
    assert ignored.code == "settings_ignored" and CAPABILITIES in ignored.message
    for name in ("instructions", "input", "audio.output.voice", "delegation"):
        assert name in ignored.message
    assert not s.inner.conversation.entries()  # the history is not the model's: nothing added, no error
    settings = s.inner.settings
    assert s.inner.s2s is not None and not settings.tools and not settings.instructions
    assert settings.turn_detection is not None and settings.turn_detection.interrupt_response
    assert settings.transcription is not None  # the user's words: the ASR stage beside the model


def test_a_start_with_only_what_the_model_takes_has_no_ignored_settings() -> None:
    _, out, _ = opened(audio={"format": {"type": "audio/pcm", "rate": 16000}})
    assert kinds(out) == ["session.started", "info"]


def test_a_full_stage_refuses_the_start_and_the_session_never_starts() -> None:
    s = LiveSession("sess_full", Limits(), 0.0, 600.0, 0.0, MODELS)
    client(s, {"type": "session.start", "session": {"model": "moshi"}}, 0.0)
    out = s.handle(S2sRefused("no free slot"), 0.1)
    [error] = sent(out)
    assert error.type == "error" and error.error.code == "server_busy" and "moshi" in error.error.message
    assert [e.code for e in out if isinstance(e, Close)] == [1013]


def test_a_speech_to_speech_model_this_gateway_does_not_serve_is_refused_at_start() -> None:
    s = LiveSession("sess_x", Limits(), 0.0, 600.0, 0.0, MODELS)
    [error] = sent(client(s, {"type": "session.start", "event_id": "s", "session": {"model": "personaplex"}}))
    assert (error.error.code, error.error.param) == ("unsupported_value", "session.model")
    assert "--s2s personaplex" in error.error.message and not s.started
    # other names stay the cascade, started at once
    assert kinds(client(s, {"type": "session.start", "session": {"model": "gpt-live-1"}}))[0] == "session.started"


def test_audio_in_becomes_the_models_steps_and_its_words_the_output_stream() -> None:
    s, _, wire = opened()
    heard = client(s, {"type": "session.input_audio.append", "audio": base64.b64encode(bytes(STEP * 2)).decode()})
    assert [type(e) for e in heard if isinstance(e, S2sAudio)] == [S2sAudio, S2sAudio]
    m = Model()
    said: list[Any] = []
    for piece in (" Hello", " there", ""):
        said += s.handle(m.step(piece, loud=piece != ""), 1.0)
    events = sent(said, wire)
    assert [e.type for e in events] == [
        "session.output_transcript.delta", "session.output_audio.delta",
        "session.output_transcript.delta", "session.output_audio.delta",
        "session.output_audio.delta",
    ]  # fmt: skip
    text = [e for e in events if e.type == "session.output_transcript.delta"]
    audio = [e for e in events if e.type == "session.output_audio.delta"]
    assert "".join(e.delta for e in text) == "Hello there"
    assert [(e.start_ms, e.end_ms) for e in audio] == [(0, 80), (80, 160), (160, 240)]
    assert [e.start_ms for e in text] == [0, 80]  # each word where its step's audio starts


def test_barge_in_holds_the_model_silent_until_the_user_stops() -> None:
    s, _, wire = opened()
    m = Model()
    for piece in (" Let", " me", " tell"):
        s.handle(m.step(piece), 1.0)
    over = vad(s, 0.0, [0.9] * 10, 1.5)
    assert [e for e in over if isinstance(e, S2sSilence)] == [S2sSilence(True)]
    assert any(isinstance(e, PurgeAudio) for e in over)  # its queued audio is dropped
    assert kinds(s.handle(m.step(" you"), 1.6), wire) == []  # held: nothing said
    stopped = vad(s, 320.0, [0.0] * 20, 2.0)
    assert [e for e in stopped if isinstance(e, S2sSilence)] == [S2sSilence(False)]
    assert "session.output_transcript.delta" in kinds(s.handle(m.step(" Yes"), 2.1), wire)


def test_a_fixture_interrupts_the_model_and_holds_it() -> None:
    s, _, _ = opened()
    m = Model()
    s.handle(m.step(" Hi"), 1.0)
    out = client(s, {"type": "session.output_audio.fixture.play", "audio": base64.b64encode(bytes(STEP)).decode()})
    assert [e for e in out if isinstance(e, S2sSilence)] == [S2sSilence(True)]
    assert "session.output_audio.fixture.playing" in kinds(out)


def test_context_appends_are_acknowledged_and_named_not_applied() -> None:
    s, _, _ = opened()
    out = client(s, {"type": "session.commentary.append", "event_id": "c1", "content": "Greet the user."})
    info, ack = sent(out)
    assert info.code == "context_ignored" and CAPABILITIES in info.message and info.client_event_id == "c1"
    assert ack.type == "session.commentary.appended" and ack.client_event_id == "c1"
    assert not [e for e in s.inner.conversation.entries() if e.item.role == "system"]
    [error] = sent(client(s, {"type": "session.thinking.append", "content": "x", "delegation_id": "call_1"}))
    assert error.error.param == "delegation_id"  # the model never delegated: no such delegation


def test_a_delegation_update_is_echoed_and_named_not_applied() -> None:
    s, _, _ = opened(**LIVEKIT_DEFAULTS)
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}]
    out = client(s, {"type": "session.update", "event_id": "u", "session": {"delegation": {"type": "responses", "responses": {"tools": tools}}}})
    updated, info = sent(out)
    assert updated.type == "session.updated" and info.code == "settings_ignored" and CAPABILITIES in info.message


def test_continuing_a_delegation_is_refused_naming_the_models_capabilities() -> None:
    s, _, _ = opened()
    for event in ({"type": "response.create"}, {"type": "response.item.create", "item": {"type": "message", "role": "user", "content": "hi"}}):
        [error] = sent(client(s, {**event, "event_id": "r"}))
        assert error.error.code == "unsupported_event" and CAPABILITIES in error.error.message
        assert error.error.client_event_id == "r"


def test_a_close_lets_the_reply_being_said_end_and_opens_no_new_one() -> None:
    s, _, wire = opened()
    m = Model()
    s.handle(m.step(" Good"), 1.0)
    assert client(s, {"type": "session.close", "event_id": "bye"}, 1.1) == []
    out: list[Any] = []
    for _ in range(3):  # padding and quiet: the reply ends (RULE: 240 ms)
        out += s.handle(m.step(loud=False), 1.2)
    [wait] = [e for e in out if isinstance(e, AwaitDelivery)]
    assert kinds(s.handle(m.step(" more"), 1.3), wire) == []  # no new reply while closing
    closing = s.handle(AudioDelivered(wait.response_id, wait.epoch), 1.4)
    assert kinds(closing)[-1] == "session.closed" and sent(closing)[-1].client_event_id == "bye"
    assert [e.code for e in closing if isinstance(e, Close)] == [1000]


def test_what_the_client_sends_while_the_stream_opens_is_answered_after_session_started() -> None:
    """A client that sends at once after session.start (a context append, a close) hears session.started
    first: nothing is answered before the session it belongs to has started."""
    s = LiveSession("sess_eager", Limits(voices=frozenset({"default"})), 0.0, 600.0, 1.8e9, MODELS)
    client(s, {"type": "session.start", "event_id": "go", "session": {"model": "moshi"}}, 0.0)
    early = client(s, {"type": "session.commentary.append", "event_id": "c1", "content": "Hello."}, 0.01)
    early += client(s, {"type": "session.close", "event_id": "bye"}, 0.02)
    assert kinds(early) == []  # held, not answered before the start
    out = s.handle(S2sOpened(), 0.05)
    types = kinds(out, LiveWire())
    assert types[0] == "session.started" and len(types) > 1
    assert types.index("session.started") < min(i for i, t in enumerate(types) if t != "session.started")
