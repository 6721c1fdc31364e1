"""The GPT-Live face of the session machine, fed events (no server): every server event it sends is
validated strictly against the openai SDK's ``openai.types.live`` models."""

from __future__ import annotations

import json
from typing import Any

from realtime_gw.protocols import live
from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import ToolCallDelta
from realtime_gw.sessions.events import (
    Close,
    Limits,
    ResponseFinished,
    ResponseToolCall,
    Send,
    StartResponse,
    StartVad,
)
from realtime_gw.sessions.live import MAX_QUEUED_ITEMS, LiveSession
from realtime_gw.sessions.live_delegation import ACKNOWLEDGE, DELEGATE_TOOL, SPEAK_RESULT
from tests.server.live_events import validate_live


def client(s: LiveSession, event: dict[str, Any], now: float = 1.0) -> list[Any]:
    ev = live.decode_client_event(json.dumps(event))
    return s.handle(ev, now)


def sent(effects: list[Any]) -> list[Any]:
    """The GPT-Live events among ``effects``, each validated by the SDK (realtime events that the
    wire translates as it writes them are skipped)."""
    out = []
    for e in effects:
        if isinstance(e, Send) and isinstance(e.event, live.ServerEvent):
            out.append(validate_live(live.encode_server_event(e.event)))
    return out


def started(**config: Any) -> LiveSession:
    s = LiveSession("sess_live0001", Limits(voices=frozenset({"default", "marin"})), 0.0, 600.0, 1_800_000_000.0)
    effects = client(s, {"type": "session.start", "event_id": "start", "session": {"model": "gpt-live-1", **config}})
    events = sent(effects)
    assert events[0].type == "session.started", events
    return s


def test_nothing_before_session_start() -> None:
    s = LiveSession("sess_live0001", Limits(), 0.0, 600.0)
    (error,) = sent(client(s, {"type": "session.input_audio.mute", "event_id": "m1"}))
    assert (error.error.code, error.error.client_event_id) == ("session_not_started", "m1")
    assert "session.input_audio.mute" in error.error.message


def test_session_started_carries_the_resolved_resource() -> None:
    s = LiveSession("sess_live0001", Limits(voices=frozenset({"default"})), 5.0, 600.0, 1_800_000_000.0)
    effects = client(
        s,
        {"type": "session.start", "event_id": "go", "session": {"model": "gpt-5.4-mini", "instructions": "Hi."}},
        now=5.0,
    )
    first = sent(effects)[0]
    assert first.type == "session.started" and first.client_event_id == "go"
    assert first.session.model == "gpt-5.4-mini" and first.session.status == "active"
    assert first.session.audio.format.type == "audio/pcm" and first.session.audio.format.rate == 24000
    assert first.session.audio.output.voice == "marin"
    assert first.session.delegation.type == "client"
    assert first.session.expires_at == 1_800_000_000 + 5 + 600
    assert any(isinstance(e, StartVad) for e in effects)
    settings = s.inner.settings
    assert settings.turn_detection is not None and settings.turn_detection.create_response
    assert [t["name"] for t in settings.tools] == [DELEGATE_TOOL]
    (again,) = sent(client(s, {"type": "session.start", "event_id": "twice", "session": {"model": "m"}}))
    assert (again.error.code, again.error.client_event_id) == ("session_already_started", "twice")


def test_g711_and_16k_formats_reach_the_input_path() -> None:
    s = started(audio={"format": {"type": "audio/pcm", "rate": 16000}})
    assert (s.inner.buffer.format, s.inner.buffer.rate) == ("audio/pcm", 16000)
    s = started(audio={"format": {"type": "audio/pcmu", "rate": 8000}})
    assert s.inner.buffer.format == "audio/pcmu" and s.inner.settings.output_format == "audio/pcmu"


def test_unsupported_configuration_is_refused_by_name() -> None:
    s = LiveSession("sess_live0001", Limits(), 0.0, 600.0)
    start = {"type": "session.start", "event_id": "s", "session": {"model": "m", "delegation": {"type": "decisions"}}}
    (error,) = sent(client(s, start))
    assert (error.error.code, error.error.param) == ("unsupported_value", "session.delegation.type")
    assert not s.started


def test_mute_appends_silence_and_acks() -> None:
    s = started()
    loud = b"\x10\x27" * 2400
    assert sent(client(s, {"type": "session.input_audio.mute", "event_id": "m"}))[0].type == "session.input_audio.muted"
    client(s, {"type": "session.input_audio.append", "audio": __import__("base64").b64encode(loud).decode()})
    assert bytes(s.inner.buffer.pcm)[-len(loud) :] == b"\0" * len(loud)
    (ack,) = sent(client(s, {"type": "session.input_audio.unmute", "event_id": "u"}))
    assert (ack.type, ack.client_event_id) == ("session.input_audio.unmuted", "u")
    client(s, {"type": "session.input_audio.append", "audio": __import__("base64").b64encode(loud).decode()})
    assert bytes(s.inner.buffer.pcm)[-len(loud) :] == loud


def test_appends_become_conversation_items_and_commentary_speaks() -> None:
    s = started()
    effects = client(s, {"type": "session.thinking.append", "event_id": "t", "content": "The user is Ada."}, now=2.0)
    (ack,) = sent(effects)
    assert (ack.type, ack.client_event_id, ack.start_ms) == ("session.thinking.appended", "t", 1000)
    assert not any(isinstance(e, StartResponse) for e in effects)  # thinking stays silent
    effects = client(s, {"type": "session.instructions.append", "event_id": "i", "content": "Say 'ma'am'."})
    assert sent(effects)[0].type == "session.instructions.appended"
    effects = client(s, {"type": "session.commentary.append", "event_id": "c", "content": "Your order shipped."})
    assert sent(effects)[-1].type == "session.commentary.appended"
    (start,) = [e for e in effects if isinstance(e, StartResponse)]
    texts = [m.content for m in start.messages]
    assert any("Ada" in str(t) for t in texts) and any("shipped" in str(t) for t in texts)
    # the items are in the conversation, not folded into the system prompt
    assert sum(1 for e in s.inner.conversation.entries() if e.item.role == "system") == 3


def test_append_limits_are_refused_with_the_session_alive() -> None:
    s = started()
    (error,) = sent(client(s, {"type": "session.thinking.append", "event_id": "x", "content": "word " * 600}))
    assert (error.error.code, error.error.param, error.error.client_event_id) == ("invalid_value", "content", "x")
    (error,) = sent(client(s, {"type": "session.commentary.append", "content": "hi", "delegation_id": "nope"}))
    assert error.error.param == "delegation_id"
    (error,) = sent(client(s, {"type": "decision.create", "event_id": "d"}))
    assert (error.error.code, error.error.client_event_id) == ("unsupported_event", "d")
    assert sent(client(s, {"type": "session.input_audio.mute"}))[0].type == "session.input_audio.muted"


def _delegate(s: LiveSession) -> tuple[str, list[Any]]:
    """The voice answers a commentary by calling the delegation tool."""
    effects = client(s, {"type": "session.commentary.append", "content": "Ask the app for the weather."})
    (start,) = [e for e in effects if isinstance(e, StartResponse)]
    call = ToolCallDelta(index=0, call_id="call_42", name=DELEGATE_TOOL, arguments='{"task": "weather in Paris"}')
    s.handle(ResponseToolCall(start.response_id, start.epoch, call), 2.0)
    return start.response_id, s.handle(ResponseFinished(start.response_id, start.epoch), 2.5)


def test_client_delegation_round_trip() -> None:
    s = started()
    _, effects = _delegate(s)
    created = [e for e in sent(effects) if e.type == "session.delegation.created"]
    assert len(created) == 1
    d = created[0].delegation
    assert (d.id, d.target, d.type, created[0].offset_ms) == ("call_42", "client", "delegation", 1500)
    effects = client(s, {"type": "session.thinking.append", "content": "Sunny, 24 C.", "delegation_id": "call_42"})
    assert sent(effects)[-1].type == "session.thinking.appended"
    assert not any(isinstance(e, StartResponse) for e in effects)
    outputs = [e.item for e in s.inner.conversation.entries() if e.item.type == "function_call_output"]
    assert [(o.call_id, o.output) for o in outputs] == [("call_42", "Sunny, 24 C.")]
    (again,) = sent(client(s, {"type": "session.commentary.append", "content": "x", "delegation_id": "call_42"}))
    assert again.error.param == "delegation_id"


def test_a_silent_delegation_is_acknowledged_aloud_at_once_by_default() -> None:
    s = started()
    _, effects = _delegate(s)
    (ack,) = [e for e in effects if isinstance(e, StartResponse)]
    assert ACKNOWLEDGE in str(ack.messages[-1].content)


def test_acknowledgement_delay_and_cancel() -> None:
    from realtime_gw.sessions.events import Tick

    s = started(delegation={"type": "client", "acknowledgement_delay_ms": 5000})
    _, effects = _delegate(s)
    assert not any(isinstance(e, StartResponse) for e in effects)
    assert not any(isinstance(e, StartResponse) for e in s.handle(Tick(), 6.0))  # 6.0 - 2.5 < 5 s
    (ack,) = [e for e in s.handle(Tick(), 7.6) if isinstance(e, StartResponse)]
    assert ACKNOWLEDGE in str(ack.messages[-1].content)
    s = started(delegation={"type": "client", "acknowledgement_delay_ms": 5000})
    _delegate(s)
    client(s, {"type": "session.thinking.append", "content": "Still looking."}, now=3.0)
    assert not any(isinstance(e, StartResponse) for e in s.handle(Tick(), 9.0))  # the app spoke up


def test_commentary_answers_a_delegation_aloud() -> None:
    s = started(delegation={"type": "client", "acknowledgement_delay_ms": 60000})
    _delegate(s)
    effects = client(s, {"type": "session.commentary.append", "content": "Sunny, 24 C.", "delegation_id": "call_42"})
    (start,) = [e for e in effects if isinstance(e, StartResponse)]
    assert any(m.role == "tool" and "Sunny" in str(m.content) for m in start.messages)
    assert start.messages[-1].role == "system" and start.messages[-1].content == SPEAK_RESULT


def test_update_keeps_the_delegation_type() -> None:
    s = started()
    (ok,) = sent(client(s, {"type": "session.update", "event_id": "u", "session": {"delegation": {"type": "client", "acknowledgement_delay_ms": 300}}}))
    assert ok.type == "session.updated" and ok.session.delegation.acknowledgement_delay_ms == 300
    bad = {"type": "session.update", "session": {"delegation": {"type": "responses", "responses": {"model": "m"}}}}
    (error,) = sent(client(s, bad))
    assert error.error.param == "session.delegation.type"


def test_close_drains_the_voice_then_closes() -> None:
    s = started()
    effects = client(s, {"type": "session.commentary.append", "content": "Goodbye."})
    (start,) = [e for e in effects if isinstance(e, StartResponse)]
    assert sent(client(s, {"type": "session.close", "event_id": "bye"}, now=3.0)) == []  # the voice is speaking
    effects = s.handle(ResponseFinished(start.response_id, start.epoch), 4.2)
    closed = [e for e in sent(effects) if e.type == "session.closed"]
    assert len(closed) == 1 and closed[0].reason == "close_requested" and closed[0].client_event_id == "bye"
    assert closed[0].usage.seconds == 3.0 and closed[0].session.id == "sess_live0001"
    assert isinstance(effects[-1], Close) and s.closed


def test_expiry_ends_with_session_closed() -> None:
    s = started()
    effects = s.end("expired", 30.0)
    (closed,) = sent(effects)
    assert closed.reason == "expired" and isinstance(effects[-1], Close)
    assert s.handle(rt.InputAudioBufferClearEvent(), 31.0) == []


def test_input_transcript_carries_the_turn_on_the_session_clock() -> None:
    s = started()
    out = s._outgoing(
        [
            s.ids.send(rt.InputAudioBufferSpeechStartedEvent(audio_start_ms=400, item_id="item_a")),
            s.ids.send(rt.InputAudioBufferSpeechStoppedEvent(audio_end_ms=1900, item_id="item_a")),
            s.ids.send(rt.ConversationItemInputAudioTranscriptionDeltaEvent(item_id="item_a", content_index=0, delta="open the")),
            s.ids.send(rt.ConversationItemInputAudioTranscriptionDeltaEvent(item_id="item_a", content_index=0, delta=" door")),
            s.ids.send(rt.InputAudioBufferSpeechStartedEvent(audio_start_ms=3000, item_id="item_b")),
            s.ids.send(rt.ConversationItemInputAudioTranscriptionDeltaEvent(item_id="item_b", content_index=0, delta="thanks")),
        ],
        1.0,
    )
    deltas = sent(out)
    assert "".join(d.delta for d in deltas) == "open the door thanks"
    assert [(d.start_ms, d.end_ms) for d in deltas[:2]] == [(400, 1900), (400, 1900)]
    assert deltas[2].start_ms == 3000


def test_fixture_interrupts_plays_in_its_own_lane_and_reports_played() -> None:
    import base64

    from realtime_gw.sessions.events import AudioDelivered, AwaitDelivery, CancelResponse

    s = started()
    effects = client(s, {"type": "session.commentary.append", "content": "A long story."})
    (start,) = [e for e in effects if isinstance(e, StartResponse)]
    clip = b"\x00\x10" * 24000  # one second
    effects = client(s, {"type": "session.output_audio.fixture.play", "event_id": "f", "audio": base64.b64encode(clip).decode()})
    assert any(isinstance(e, CancelResponse) and e.response_id == start.response_id for e in effects)
    kinds = [e.type for e in sent(effects)]
    assert kinds == ["session.usage.updated", "session.output_audio.fixture.playing"]  # the voice was cut
    frames = [e for e in effects if isinstance(e, Send) and isinstance(e.event, rt.ResponseAudioDeltaEvent)]
    assert len(frames) == 13 and b"".join(f.event.delta for f in frames) == clip
    (wait,) = [e for e in effects if isinstance(e, AwaitDelivery)]
    assert {f.response_id for f in frames} == {wait.response_id}
    (refused,) = sent(client(s, {"type": "session.thinking.append", "event_id": "t", "content": "x"}))
    assert refused.error.code == "fixture_active"
    (again,) = sent(client(s, {"type": "session.output_audio.fixture.play", "audio": base64.b64encode(clip).decode()}))
    assert again.error.code == "fixture_active"
    client(s, {"type": "session.input_audio.append", "audio": base64.b64encode(b"\x10\x27" * 480).decode()})
    assert bytes(s.inner.buffer.pcm)[-960:] == b"\0" * 960  # input is muted while the clip plays
    (played,) = sent(s.handle(AudioDelivered(wait.response_id, 0), 3.0))
    assert (played.type, played.client_event_id) == ("session.output_audio.fixture.played", "f")
    assert sent(client(s, {"type": "session.thinking.append", "content": "x"}))[0].type == "session.thinking.appended"


def test_fixture_audio_is_checked() -> None:
    import base64

    s = started()
    for audio, why in ((b"", "empty"), (b"\0" * 3, "odd"), (b"\0\0" * 24000 * 31, "too long")):
        (error,) = sent(client(s, {"type": "session.output_audio.fixture.play", "audio": base64.b64encode(audio).decode()}))
        assert (error.error.code, error.error.param) == ("invalid_value", "audio"), why


def test_commentary_waits_for_the_voice_and_follows_what_it_said() -> None:
    s = started()
    effects = client(s, {"type": "session.commentary.append", "content": "First thing."})
    (first,) = [e for e in effects if isinstance(e, StartResponse)]
    effects = client(s, {"type": "session.commentary.append", "event_id": "c2", "content": "Second thing."})
    assert [e.type for e in sent(effects)] == ["session.commentary.appended"]
    assert not any(isinstance(e, StartResponse) for e in effects)
    effects = s.handle(ResponseFinished(first.response_id, first.epoch), 2.0)
    (second,) = [e for e in effects if isinstance(e, StartResponse)]
    assert "Second thing." in str(second.messages[-1].content)


def test_a_delegation_the_voice_announced_needs_no_acknowledgement() -> None:
    from realtime_gw.records.voice import TtsFrame
    from realtime_gw.sessions.events import AudioDelivered, ResponseAudio

    s = started()
    effects = client(s, {"type": "session.commentary.append", "content": "Ask the app for the weather."})
    (start,) = [e for e in effects if isinstance(e, StartResponse)]
    s.handle(ResponseAudio(start.response_id, start.epoch, TtsFrame(b"\1\0" * 1920, "Let me check.")), 1.5)
    call = ToolCallDelta(index=0, call_id="call_7", name=DELEGATE_TOOL, arguments='{"task": "weather"}')
    s.handle(ResponseToolCall(start.response_id, start.epoch, call), 2.0)
    effects = s.handle(ResponseFinished(start.response_id, start.epoch), 2.5)
    effects += s.handle(AudioDelivered(start.response_id, start.epoch), 2.6)
    assert [e.type for e in sent(effects) if e.type == "session.delegation.created"] == ["session.delegation.created"]
    assert not any(isinstance(e, StartResponse) for e in effects)
    assert s.ack_due is None and s.spoke == set()


def test_commentary_waiting_for_the_voice_is_bounded() -> None:
    """Commentary sent while the voice speaks waits for it (in order), up to ``MAX_QUEUED_ITEMS``."""
    s = started()
    assert any(isinstance(e, StartResponse) for e in client(s, {"type": "session.commentary.append", "content": "One."}))
    for i in range(MAX_QUEUED_ITEMS):
        (ack,) = sent(client(s, {"type": "session.commentary.append", "content": f"Then {i}."}))
        assert ack.type == "session.commentary.appended"
    (error,) = sent(client(s, {"type": "session.commentary.append", "event_id": "more", "content": "More."}))
    assert (error.error.param, error.error.client_event_id) == ("content", "more")
    assert len(s.queued) == MAX_QUEUED_ITEMS and not s.closed


def test_server_stopping_ends_the_session_with_session_closed() -> None:
    from realtime_gw.sessions.events import ServerStopping

    s = started()
    effects = s.handle(ServerStopping(), 3.0)
    (closed,) = sent(effects)
    assert (closed.type, closed.reason) == ("session.closed", "connection_lost")
    assert isinstance(effects[-1], Close) and effects[-1].code == 1000
    assert s.closed and s.handle(ServerStopping(), 4.0) == []


def test_info_notices_model_mapping_ignored_settings_and_expiry() -> None:
    from realtime_gw.sessions.events import Tick

    s = LiveSession("sess_live0001", Limits(voices=frozenset({"default"}), model="local-llm"), 0.0, 100.0, 1_800_000_000.0)
    backend = {"model": "gpt-5.4-mini", "reasoning": {"effort": "low"}, "service_tier": "flex"}
    start = {"type": "session.start", "session": {"model": "gpt-live-1", "delegation": {"type": "responses", "responses": backend}}}
    infos = [e for e in sent(client(s, start, now=0.0)) if e.type == "info"]
    assert [i.code for i in infos] == ["model_mapped", "settings_ignored"]
    assert "'gpt-live-1'" in infos[0].message and "'gpt-5.4-mini'" in infos[0].message and "local-llm" in infos[0].message
    assert "reasoning" in infos[1].message and "service_tier" in infos[1].message
    assert not [e for e in sent(s.handle(Tick(), 49.0)) if e.type == "info"]
    (expiring,) = [e for e in sent(s.handle(Tick(), 50.0)) if e.type == "info"]
    assert expiring.code == "session_expiring" and "50 s" in expiring.message
    assert not [e for e in sent(s.handle(Tick(), 60.0)) if e.type == "info"]  # once
