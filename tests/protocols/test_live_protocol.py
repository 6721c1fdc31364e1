"""The GPT-Live codec against the openai SDK's own shapes."""

from __future__ import annotations

import base64
import json

import pytest
from openai.types.live import ClientEventParam  # noqa: F401  (the SDK's client shapes exist)

from realtime_gw.protocols import live
from tests.server.live_events import validate_live


def decode(payload: dict) -> object:
    return live.decode_client_event(json.dumps(payload))


def test_session_start_decodes_every_supported_field() -> None:
    ev = decode(
        {
            "type": "session.start",
            "event_id": "c1",
            "session": {
                "model": "gpt-live-1",
                "instructions": "Be brief.",
                "audio": {"format": {"type": "audio/pcm", "rate": 16000}, "output": {"voice": "marin"}},
                "delegation": {"type": "client", "acknowledgement_delay_ms": 200},
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            },
        }
    )
    assert isinstance(ev, live.SessionStartEvent)
    assert ev.event_id == "c1"
    assert isinstance(ev.session.audio.format, live.AudioPCM) and ev.session.audio.format.rate == 16000
    assert isinstance(ev.session.delegation, live.ClientDelegation)


def test_unknown_field_is_named_with_its_path() -> None:
    ev = decode({"type": "session.start", "event_id": "c2", "session": {"model": "m", "voice": "x"}})
    assert isinstance(ev, live.ErrorEvent)
    assert (ev.error.code, ev.error.param, ev.error.client_event_id) == ("unknown_parameter", "session.voice", "c2")
    assert "session.start" in ev.error.message


def test_missing_and_invalid_values() -> None:
    ev = decode({"type": "session.commentary.append"})
    assert isinstance(ev, live.ErrorEvent)
    assert (ev.error.code, ev.error.param) == ("missing_required_parameter", "content")
    ev = decode({"type": "session.input_audio.append", "audio": "not base64!"})
    assert isinstance(ev, live.ErrorEvent) and ev.error.code == "invalid_value" and ev.error.param == "audio"
    ev = decode({"type": "session.start", "session": {"model": "m", "audio": {"format": {"type": "audio/pcm", "rate": 8000}}}})
    assert isinstance(ev, live.ErrorEvent) and ev.error.param == "session.audio.format.rate"


def test_unknown_and_unsupported_types() -> None:
    ev = decode({"type": "session.dance", "event_id": "c3"})
    assert isinstance(ev, live.ErrorEvent)
    assert (ev.error.code, ev.error.param, ev.error.client_event_id) == ("invalid_value", "type", "c3")
    assert "session.dance" in ev.error.message
    ev = decode({"type": "decision.create", "event_id": "c4", "anything": 1})
    assert isinstance(ev, live.Unsupported) and ev.event_id == "c4"
    ev = live.decode_client_event("{not json")
    assert isinstance(ev, live.ErrorEvent) and ev.error.code == "invalid_json"


RESOURCE = live.SessionResource(
    id="sess_1",
    expires_at=1_900_000_000,
    model="gpt-live-1",
    status="active",
    audio=live.Audio(format=live.AudioPCM(rate=24000), output=live.AudioOutput(voice="marin")),
    delegation=live.ClientDelegation(),
    instructions="Be brief.",
)


@pytest.mark.parametrize(
    "event",
    [
        live.SessionStartedEvent(event_id="e1", session=RESOURCE, client_event_id="c1"),
        live.SessionUpdatedEvent(event_id="e2", session=RESOURCE),
        live.InputAudioMutedEvent(event_id="e3", client_event_id="c"),
        live.InputAudioUnmutedEvent(event_id="e4"),
        live.InstructionsAppendedEvent(event_id="e5", start_ms=1, end_ms=2),
        live.ThinkingAppendedEvent(event_id="e6", start_ms=1, end_ms=2),
        live.CommentaryAppendedEvent(event_id="e7", start_ms=1, end_ms=2, client_event_id="c"),
        live.OutputAudioDeltaEvent(delta=b"\0\0" * 1920, start_ms=0, end_ms=80),
        live.InputTranscriptDeltaEvent(event_id="e8", delta="hi", start_ms=0, end_ms=300),
        live.OutputTranscriptDeltaEvent(event_id="e9", delta="hi", start_ms=0, end_ms=300),
        live.DelegationCreatedEvent(event_id="e10", delegation=live.DelegationRef(id="call_1"), offset_ms=5),
        live.SessionUsageUpdatedEvent(event_id="e11", usage=live.SessionUsage(seconds=3.0)),
        live.SessionClosedEvent(
            event_id="e12", reason="close_requested", session=RESOURCE, usage=live.SessionUsage(seconds=3.0)
        ),
        live.error_event("bad", "invalid_value", "type", "c9"),
        live.InfoEvent(event_id="e13", code="note", message="m"),
    ],
)
def test_server_events_validate_strictly_against_the_sdk(event: live.ServerEvent) -> None:
    if not isinstance(event, live.OutputAudioDeltaEvent):
        event.event_id = event.event_id or "e0"  # the session stamps every event but audio deltas
    event.server_event_seq = 7  # the outbox's stamp never reaches the wire
    raw = live.encode_server_event(event)
    parsed = validate_live(raw)
    assert parsed.type == json.loads(raw)["type"]
    if isinstance(event, live.OutputAudioDeltaEvent):
        assert base64.b64decode(parsed.delta) == event.delta
