"""The realtime codec: every GA client event decodes; bad frames become precise error events."""

from __future__ import annotations

import json

import msgspec
import pytest
from openai.types.realtime import (
    RealtimeAudioConfigParam,
    SessionUpdateEventParam,
)

from realtime_gw.protocols import realtime as rt

CLIENT_EVENTS = {
    "session.update": {"session": {"type": "realtime", "instructions": "be brief"}},
    "input_audio_buffer.append": {"audio": "AAAA"},
    "input_audio_buffer.commit": {},
    "input_audio_buffer.clear": {},
    "output_audio_buffer.clear": {},
    "conversation.item.create": {
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    },
    "conversation.item.retrieve": {"item_id": "item_1"},
    "conversation.item.truncate": {"item_id": "item_1", "content_index": 0, "audio_end_ms": 100},
    "conversation.item.delete": {"item_id": "item_1"},
    "response.create": {"response": {"instructions": "x", "output_modalities": ["text"]}},
    "response.cancel": {},
}


def test_all_eleven_client_events_decode() -> None:
    assert set(CLIENT_EVENTS) == rt.GA_CLIENT_EVENT_TYPES
    for kind, body in CLIENT_EVENTS.items():
        ev = rt.decode_client_event(json.dumps({"type": kind, "event_id": "e1", **body}))
        assert not isinstance(ev, rt.ErrorEvent), (kind, ev)
        assert ev.event_id == "e1"


def test_full_sdk_session_update_decodes() -> None:
    audio: RealtimeAudioConfigParam = {
        "input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "noise_reduction": {"type": "near_field"},
            "transcription": {"model": "whisper-1", "language": "en"},
            "turn_detection": {
                "type": "server_vad",
                "threshold": 0.6,
                "prefix_padding_ms": 200,
                "silence_duration_ms": 400,
                "create_response": True,
                "interrupt_response": False,
                "idle_timeout_ms": 6000,
            },
        },
        "output": {"format": {"type": "audio/pcmu"}, "voice": "alloy", "speed": 1.2},
    }
    event: SessionUpdateEventParam = {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "model": "gpt-realtime",
            "audio": audio,
            "tools": [{"type": "function", "name": "f", "parameters": {}}],
            "tool_choice": "auto",
            "tracing": "auto",
            "max_output_tokens": "inf",
        },
    }
    ev = rt.decode_client_event(json.dumps(event))
    assert isinstance(ev, rt.SessionUpdateEvent)
    td = ev.session.audio.input.turn_detection  # type: ignore[union-attr]
    assert isinstance(td, rt.ServerVad) and td.threshold == 0.6 and td.idle_timeout_ms == 6000


def test_turn_detection_null_differs_from_absent() -> None:
    absent = rt.decode_client_event('{"type":"session.update","session":{"audio":{"input":{}}}}')
    null = rt.decode_client_event(
        '{"type":"session.update","session":{"audio":{"input":{"turn_detection":null}}}}'
    )
    assert absent.session.audio.input.turn_detection is msgspec.UNSET  # type: ignore[union-attr]
    assert null.session.audio.input.turn_detection is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        ("[1, 2", "invalid_json", None),
        ('{"event_id": "e"}', "invalid_event", "type"),
        ('{"type": "response.explode", "event_id": "e"}', "invalid_event_type", "type"),
        ('{"type": "input_audio_buffer.append", "audio": "###", "event_id": "e"}', "invalid_value", "audio"),
        ('{"type": "input_audio_buffer.append", "event_id": "e"}', "invalid_value", None),
        (
            '{"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": "x", "event_id": "e"}',
            "invalid_value",
            "audio_end_ms",
        ),
        (
            '{"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "magic"}}}}, "event_id": "e"}',
            "invalid_value",
            "session.audio.input.turn_detection.type",
        ),
    ],
)
def test_bad_frames_name_the_field_and_echo_event_id(raw: str, code: str, param: str | None) -> None:
    ev = rt.decode_client_event(raw)
    assert isinstance(ev, rt.ErrorEvent)
    assert ev.error.type == "invalid_request_error"
    assert ev.error.code == code
    if param is not None:
        assert ev.error.param == param
    if '"event_id": "e"' in raw:
        assert ev.error.event_id == "e"


def test_missing_field_is_named_in_the_message() -> None:
    ev = rt.decode_client_event('{"type": "input_audio_buffer.append", "event_id": "e"}')
    assert isinstance(ev, rt.ErrorEvent) and "audio" in ev.error.message


def test_audio_delta_encodes_base64_and_additive_fields() -> None:
    ev = rt.ResponseAudioDeltaEvent(
        event_id="e", response_id="r", item_id="i", output_index=0, content_index=0, delta=b"\x01\x02", seq=3
    )
    data = json.loads(rt.encode_server_event(ev))
    assert data["type"] == "response.output_audio.delta"
    assert data["delta"] == "AQI=" and data["seq"] == 3 and data["sample_rate_hz"] == 24000


def test_what_framework_clients_send_decodes() -> None:
    """Explicit nulls (LiveKit), voice objects, retention_ratio truncation, tools and function items."""
    update = {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "instructions": None,
            "max_output_tokens": None,
            "tool_choice": {"type": "function", "name": "f"},
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "truncation": {
                "type": "retention_ratio",
                "retention_ratio": 0.5,
                "token_limits": {"post_instructions": 900},
            },
            "audio": {
                "input": {"format": None, "turn_detection": {"type": "semantic_vad", "eagerness": None}},
                "output": {"voice": {"id": "marin"}, "speed": None},
            },
        },
    }
    ev = rt.decode_client_event(json.dumps(update))
    assert isinstance(ev, rt.SessionUpdateEvent), ev
    assert ev.session.instructions is None and ev.session.max_output_tokens is None
    assert (
        isinstance(ev.session.truncation, rt.RetentionRatio) and ev.session.truncation.retention_ratio == 0.5
    )
    audio = ev.session.audio
    assert isinstance(audio, rt.AudioConfig) and isinstance(audio.output, rt.AudioOutputConfig)
    assert audio.output.voice == rt.VoiceId("marin")
    assert isinstance(audio.input, rt.AudioInputConfig) and isinstance(
        audio.input.turn_detection, rt.SemanticVad
    )
    assert audio.input.turn_detection.eagerness == "auto", "null is the default"
    for item in (
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "42"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}],
        },
    ):
        created = rt.decode_client_event(json.dumps({"type": "conversation.item.create", "item": item}))
        assert isinstance(created, rt.ConversationItemCreateEvent), created
        # a message's fields stay off a function item on the wire, and the other way round
        wire = json.loads(rt.encode_server_event(rt.ConversationItemAdded(item=created.item)))["item"]
        assert {k: v for k, v in wire.items() if v not in (None, [])} == item
