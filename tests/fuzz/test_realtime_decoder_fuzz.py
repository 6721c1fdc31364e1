"""Property fuzzing of ``decode_client_event``: arbitrary bytes, arbitrary JSON, and the real event
shapes with mutated field types and values. Every outcome is a decoded client event or an
``ErrorEvent`` of type ``invalid_request_error``, never an exception."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from realtime_gw.protocols import realtime as rt
from tests.fuzz.strategies import dumps, fuzz, json_values, mutated_events, valid_events

EVENT_CLASSES = {t.__struct_config__.tag: t for t in rt.AnyClientEvent.__args__}  # type: ignore[attr-defined]
ERROR_CODES = {"invalid_json", "invalid_event", "invalid_event_type", "invalid_value"}


def not_utf8(raw: bytes | str) -> bool:
    if isinstance(raw, str):
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def check_outcome(raw: bytes | str) -> rt.ErrorEvent | rt.ClientEvent | None:
    """The decoder's contract for any input; returns the outcome for further checks (None: the known
    invalid-UTF-8 bug below, tolerated here so this property keeps guarding everything else)."""
    try:
        out = rt.decode_client_event(raw)
    except UnicodeDecodeError:
        assert not_utf8(raw), "UnicodeDecodeError from valid UTF-8"
        return None
    if isinstance(out, rt.ErrorEvent):
        err = out.error
        assert err.type == "invalid_request_error", err
        assert err.code in ERROR_CODES, err
        assert err.message, err
        assert err.event_id is None or isinstance(err.event_id, str)
        rt.encode_server_event(out)  # the transport must be able to send it
    else:
        assert type(out) in EVENT_CLASSES.values(), type(out)
        # what decoded re-encodes and decodes to the same event
        again = rt.decode_client_event(msgspec.json.encode(out))
        assert again == out, (out, again)
    return out


@fuzz(400)
@given(st.binary(max_size=2048))
@example(b"")
@example(b"\xef\xbb\xbf{}")  # a BOM
@example(b'{"type":"response.create"}\x00')
@example(b'{"type":"response.create","type":"session.close"}')
def test_arbitrary_bytes(raw: bytes) -> None:
    check_outcome(raw)


@fuzz(300)
@given(st.text(max_size=512))
def test_arbitrary_text(raw: str) -> None:
    """Text frames (valid UTF-8, as a WebSocket text frame is); str and bytes decode alike."""
    out = check_outcome(raw)
    assert type(check_outcome(raw.encode())) is type(out)


@fuzz(300)
@given(json_values, st.booleans())
def test_arbitrary_json(obj: Any, ascii_only: bool) -> None:
    out = check_outcome(dumps(obj, ascii_only))
    if not isinstance(obj, dict):
        assert isinstance(out, rt.ErrorEvent) and out.error.code == "invalid_event"


@fuzz(300)
@given(
    st.sampled_from(sorted(rt.CLIENT_EVENT_TYPES)) | st.text(max_size=20) | json_values,
    st.dictionaries(
        st.sampled_from(
            ["event_id", "session", "audio", "item", "item_id", "content_index", "audio_end_ms", "response",
             "response_id", "played_ms", "previous_item_id"]
        ) | st.text(max_size=8),
        json_values,
        max_size=5,
    ),
)  # fmt: skip
def test_known_types_with_arbitrary_fields(kind: Any, fields: dict[str, Any]) -> None:
    obj = {"type": kind, **fields}
    out = check_outcome(dumps(obj))
    if isinstance(out, rt.ErrorEvent):
        if not isinstance(kind, str):
            assert out.error.code == "invalid_event" and out.error.param == "type"
        elif kind not in rt.CLIENT_EVENT_TYPES:
            assert out.error.code == "invalid_event_type"
        if out.error.code != "invalid_json" and isinstance(obj.get("event_id"), str):
            assert out.error.event_id == obj["event_id"]
    else:
        assert out.__struct_config__.tag == kind


@fuzz(400)
@given(valid_events(), st.booleans())
def test_valid_event_shapes_decode(obj: dict[str, Any], ascii_only: bool) -> None:
    """The generator's unmutated events are valid: each decodes to its own class, never an error."""
    out = rt.decode_client_event(dumps(obj, ascii_only))
    assert isinstance(out, EVENT_CLASSES[obj["type"]]), (obj, out)
    assert out.event_id == obj.get("event_id")
    check_outcome(dumps(obj))


@fuzz(800)
@given(mutated_events(), st.booleans(), st.booleans())
def test_mutated_event_shapes(obj: Any, ascii_only: bool, as_bytes: bool) -> None:
    raw = dumps(obj, ascii_only)
    out = check_outcome(raw.encode() if as_bytes else raw)
    if isinstance(out, rt.ErrorEvent):
        if isinstance(obj, dict) and out.error.code != "invalid_json" and isinstance(obj.get("event_id"), str):
            assert out.error.event_id == obj["event_id"], (obj, out)
        if out.error.code == "invalid_value":
            assert out.error.message.startswith(f"Invalid '{obj['type']}'"), out.error.message
    else:
        assert isinstance(obj, dict) and out.__struct_config__.tag == obj["type"]


@fuzz(200)
@given(valid_events(), st.integers(min_value=0, max_value=10_000), st.binary(min_size=1, max_size=8))
def test_valid_then_garbage_and_truncated(obj: dict[str, Any], cut: int, junk: bytes) -> None:
    raw = dumps(obj).encode()
    for candidate in (raw + junk, raw[: cut % max(1, len(raw))], junk + raw):
        check_outcome(candidate)


@fuzz(100)
@given(st.integers(min_value=1, max_value=900), st.sampled_from(["[", '{"a":', '{"type":"session.update","session":{"tools":[']))
def test_nesting_within_the_recursion_limit(depth: int, opener: str) -> None:
    """Up to 900 levels (the known bug below starts near Python's recursion limit of 1000)."""
    depth = max(1, depth // (opener.count("{") + opener.count("[")))  # containers per repetition
    closer = {"[": "]", '{"a":': "}", '{"type":"session.update","session":{"tools":[': "]}}"}[opener]
    inner = {"[": "1", '{"a":': "1", '{"type":"session.update","session":{"tools":[': "1"}[opener]
    check_outcome(opener * depth + inner + closer * depth)
    check_outcome(opener * depth)  # truncated


# -- found by fuzzing, fixed: regression tests ------------------------------------------------------------
@pytest.mark.parametrize("frame", ["[" * 1000, '{"type":"response.create","response":' + '{"a":' * 1000])
def test_deep_nesting_is_an_error_event(frame: str) -> None:
    out = rt.decode_client_event(frame)
    assert isinstance(out, rt.ErrorEvent)


@pytest.mark.parametrize("frame", [b'"\xff"', b'{"type":"x\xff"}', b'{"type":"response.create","event_id":"\xff"}'])
def test_invalid_utf8_bytes_are_an_error_event(frame: bytes) -> None:
    out = rt.decode_client_event(frame)
    assert isinstance(out, rt.ErrorEvent) and out.error.code == "invalid_json"


def test_lone_surrogate_str_is_an_error_event() -> None:
    out = rt.decode_client_event(json.dumps({"type": "response.create", "event_id": "\ud800"}, ensure_ascii=False))
    assert isinstance(out, rt.ErrorEvent)
