"""Hypothesis strategies shared by the fuzz tests: JSON values, the real client-event shapes of
``/v1/realtime`` (and mutations of them), and msgpack-numpy observations (and mutations of them).

The event shapes follow ``realtime_gw.protocols.realtime`` field by field, so an unmutated draw is a
valid event; a mutation changes one node (type confusion, removal, an unknown key, a huge value...).
"""

from __future__ import annotations

import base64
import copy
import json
import os
from typing import Any

import msgpack
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from realtime_gw.protocols import realtime as rt

# -- JSON --------------------------------------------------------------------------------------------------
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=24)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=16,
)
NASTY_VALUES: list[Any] = [
    None, True, False, 0, -1, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30, 1e308, -1e308, 0.5, "",
    "x" * 5000, "\u0000", "\U0001f600", "null", "NaN", [], {}, [[[[[]]]]], {"type": "session.update"},
    {"": None}, ["audio", "text", "video"],
]  # fmt: skip


def dumps(obj: Any, ascii_only: bool = True) -> str:
    return json.dumps(obj, ensure_ascii=ascii_only, separators=(",", ":"))


# -- realtime client events: the real shapes ---------------------------------------------------------------
ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=16)
small_text = st.text(max_size=40)
pcm_b64 = st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode())

audio_format = st.fixed_dictionaries(
    {"type": st.sampled_from(["audio/pcm", "audio/pcmu", "audio/pcma"])},
    optional={"rate": st.sampled_from([16000, 24000, 8000, 44100]) | st.none()},
)
server_vad = st.fixed_dictionaries(
    {"type": st.just("server_vad")},
    optional={
        "threshold": st.floats(min_value=0.0, max_value=1.5),
        "prefix_padding_ms": st.integers(min_value=-10, max_value=2000),
        "silence_duration_ms": st.integers(min_value=-10, max_value=3000),
        "create_response": st.booleans(),
        "interrupt_response": st.booleans(),
        "idle_timeout_ms": st.none() | st.sampled_from([0, 300, 1000, 5000]),
    },
)
semantic_vad = st.fixed_dictionaries(
    {"type": st.just("semantic_vad")},
    optional={
        "eagerness": st.sampled_from(["low", "medium", "high", "auto"]),
        "create_response": st.booleans(),
        "interrupt_response": st.booleans(),
    },
)
audio_input = st.fixed_dictionaries(
    {},
    optional={
        "format": audio_format,
        "transcription": st.none()
        | st.fixed_dictionaries({}, optional={"model": small_text, "language": st.sampled_from(["en", "de"])}),
        "turn_detection": st.none() | server_vad | semantic_vad,
        "noise_reduction": st.none() | st.fixed_dictionaries({"type": st.sampled_from(["near_field", "far_field"])}),
    },
)
audio_output = st.fixed_dictionaries(
    {},
    optional={
        "format": audio_format,
        "voice": st.sampled_from(["default", "alloy", "tone"]),
        "speed": st.floats(min_value=0.1, max_value=5.0),
    },
)
audio_config = st.fixed_dictionaries({}, optional={"input": audio_input, "output": audio_output})
modalities = st.lists(st.sampled_from(["text", "audio"]), min_size=1, max_size=2, unique=True)
duplex_params = st.fixed_dictionaries(
    {},
    optional={
        "overlap_short_ack_ms": st.integers(min_value=0, max_value=3000),
        "overlap_barge_in_ms": st.integers(min_value=0, max_value=3000),
        "echo_guard_ms": st.integers(min_value=0, max_value=2000),
    },
)
session_params = st.fixed_dictionaries(
    {},
    optional={
        "type": st.just("realtime"),
        "model": small_text,
        "instructions": small_text,
        "output_modalities": modalities,
        "audio": audio_config,
        "max_output_tokens": st.integers(min_value=1, max_value=4096) | st.just("inf"),
        "tools": st.lists(json_values, max_size=2),
        "tool_choice": json_values,
        "tracing": json_values,
        "include": st.none() | st.lists(small_text, max_size=2),
        "duplex": duplex_params,
    },
)
content_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "input_audio", "output_text", "output_audio", "text", "audio"])},
    optional={"text": small_text, "transcript": small_text | st.none(), "audio": pcm_b64 | st.none()},
)
item = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call"])},
    optional={
        "id": ids,
        "object": st.just("realtime.item"),
        "status": st.sampled_from(["completed", "incomplete", "in_progress"]),
        "role": st.sampled_from(["user", "assistant", "system"]),
        "content": st.lists(content_part, max_size=3),
    },
)
response_params = st.fixed_dictionaries(
    {},
    optional={
        "conversation": st.sampled_from(["auto", "none"]) | st.none(),
        "instructions": small_text | st.none(),
        "output_modalities": modalities | st.none(),
        "audio": audio_config | st.none(),
        "max_output_tokens": st.integers(min_value=1, max_value=4096) | st.just("inf") | st.none(),
        "metadata": st.dictionaries(ids, small_text, max_size=3) | st.none(),
        "input": st.lists(item, max_size=2) | st.none(),
        "tools": st.lists(json_values, max_size=2) | st.none(),
    },
)
event_id = {"event_id": ids | st.none()}

EVENT_BODIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "session.update": st.fixed_dictionaries({"session": session_params}, optional=event_id),
    "input_audio_buffer.append": st.fixed_dictionaries({"audio": pcm_b64}, optional=event_id),
    "input_audio_buffer.commit": st.fixed_dictionaries({}, optional=event_id),
    "input_audio_buffer.clear": st.fixed_dictionaries({}, optional=event_id),
    "output_audio_buffer.clear": st.fixed_dictionaries({}, optional=event_id),
    "conversation.item.create": st.fixed_dictionaries(
        {"item": item}, optional={**event_id, "previous_item_id": ids | st.none()}
    ),
    "conversation.item.retrieve": st.fixed_dictionaries({"item_id": ids}, optional=event_id),
    "conversation.item.truncate": st.fixed_dictionaries(
        {
            "item_id": ids,
            "content_index": st.integers(min_value=0, max_value=3),
            "audio_end_ms": st.integers(min_value=0, max_value=10**6),
        },
        optional=event_id,
    ),
    "conversation.item.delete": st.fixed_dictionaries({"item_id": ids}, optional=event_id),
    "response.create": st.fixed_dictionaries({}, optional={**event_id, "response": response_params | st.none()}),
    "response.cancel": st.fixed_dictionaries({}, optional={**event_id, "response_id": ids | st.none()}),
    "playback.ack": st.fixed_dictionaries(
        {"response_id": ids, "played_ms": st.integers(min_value=0, max_value=10**6)}, optional=event_id
    ),
    "session.close": st.fixed_dictionaries({}, optional=event_id),
}
assert set(EVENT_BODIES) == rt.CLIENT_EVENT_TYPES, "every client event type has a shape here"


@st.composite
def valid_events(draw: st.DrawFn) -> dict[str, Any]:
    """A valid client event as a JSON object (``type`` first, as clients send it)."""
    kind = draw(st.sampled_from(sorted(EVENT_BODIES)))
    return {"type": kind, **draw(EVENT_BODIES[kind])}


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*path, i))
    return out


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        node = node[p]
    return node


MUTATIONS = ("replace", "replace_nasty", "delete", "add_key", "wrap_list", "retag", "null")


@st.composite
def mutated_events(draw: st.DrawFn) -> Any:
    """A valid event with one to three nodes changed: type confusion, a removed or unknown field, a huge
    value, the body of one event type under another's tag..."""
    obj: Any = copy.deepcopy(draw(valid_events()))  # drawn values may be shared: never mutate them
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(obj)
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(MUTATIONS))
        if op == "retag":
            if isinstance(obj, dict):
                obj["type"] = draw(st.sampled_from(sorted(rt.CLIENT_EVENT_TYPES)) | st.text(max_size=12) | json_values)
            continue
        if not path:  # the whole event
            obj = draw(json_values) if op in ("replace", "null") else copy.deepcopy(draw(st.sampled_from(NASTY_VALUES)))
            continue
        parent, key = _get(obj, path[:-1]), path[-1]
        if op == "replace":
            parent[key] = draw(json_values)
        elif op == "replace_nasty":
            parent[key] = copy.deepcopy(draw(st.sampled_from(NASTY_VALUES)))
        elif op == "null":
            parent[key] = None
        elif op == "wrap_list":
            parent[key] = [parent[key]]
        elif op == "delete":
            del parent[key]
        elif op == "add_key":
            target = _get(obj, path)
            if isinstance(target, dict):
                target[draw(st.text(max_size=10))] = draw(json_values)
            else:
                parent[key] = {draw(st.text(max_size=10)): target}
    return obj


# -- msgpack-numpy ---------------------------------------------------------------------------------------
SAFE_DTYPES = ["|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<i8", "<u8", "<f2", "<f4", "<f8", ">f4", ">i8", "|b1"]
BAD_DTYPES = [
    "|O", "O", "|V8", "V", "<c8", "<c16", "f4,f4", "(2,3)f4", "[('a','<f4')]", "", "garbage", "<M8", "<M8[ns]",
    "<m8[s]", "|S0", "|S5", "<U3", "<U0", "<U2147483647", "S999999999999", "float", "int", "object", "e", "g",
]  # fmt: skip
HUGE = [2**31, 2**32 - 1, 2**40, 2**62, 2**63 - 1]


msgpack_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=16)
    | st.binary(max_size=16)
)
plain_msgpack_values = st.recursive(
    msgpack_scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8) | st.binary(max_size=8), inner, max_size=4),
    max_leaves=10,
)
"""msgpack without numpy markers."""


@st.composite
def arrays(draw: st.DrawFn, max_side: int = 6) -> np.ndarray:
    dtype = np.dtype(draw(st.sampled_from(SAFE_DTYPES)))
    shape = tuple(draw(st.lists(st.integers(min_value=0, max_value=max_side), max_size=4)))
    raw = draw(st.binary(min_size=dtype.itemsize * int(np.prod(shape)), max_size=dtype.itemsize * int(np.prod(shape))))
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


@st.composite
def ndarray_maps(draw: st.DrawFn) -> dict[bytes, Any]:
    """A raw ``__ndarray__`` map whose dtype, shape and data are each valid, wrong or absurd."""
    dtype: Any = draw(st.sampled_from(SAFE_DTYPES + BAD_DTYPES) | msgpack_scalars)
    dims = st.integers(min_value=0, max_value=8) | st.sampled_from(HUGE) | st.integers(min_value=-3, max_value=-1)
    shape: Any = draw(st.lists(dims, max_size=18) | plain_msgpack_values)
    try:
        itemsize = np.dtype(dtype).itemsize if isinstance(dtype, str) else 1
        count = int(np.prod([n for n in shape], dtype=object)) if isinstance(shape, list) else 1
        exact = max(0, min(itemsize * count, 4096)) if isinstance(count, int) else 0
    except Exception:
        exact = 0
    size = draw(st.sampled_from([exact, exact + 1, max(0, exact - 1), 0]))
    data: Any = draw(st.binary(min_size=size, max_size=size) | msgpack_scalars)
    out: dict[bytes, Any] = {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}
    for key in draw(st.lists(st.sampled_from([b"data", b"dtype", b"shape"]), max_size=1)):
        del out[key]
    return out


@st.composite
def npgeneric_maps(draw: st.DrawFn) -> dict[bytes, Any]:
    return {
        b"__npgeneric__": True,
        b"data": draw(msgpack_scalars | st.sampled_from([2**64 - 1, -(2**63), 1e300, float("nan")])),
        b"dtype": draw(st.sampled_from(SAFE_DTYPES + BAD_DTYPES) | msgpack_scalars),
    }

msgpack_values = st.recursive(
    msgpack_scalars | ndarray_maps() | npgeneric_maps(),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8) | st.binary(max_size=8), inner, max_size=4),
    max_leaves=10,
)
"""msgpack with numpy markers, valid or not."""


def packb_raw(obj: Any) -> bytes:
    """Plain msgpack (bin for bytes, str for str), as a client library would write the markers."""
    return msgpack.packb(obj, use_bin_type=True)


@st.composite
def frame_mutations(draw: st.DrawFn, frame: bytes) -> bytes:
    """Byte-level damage to a frame: bit flips, truncation, garbage appended, a byte overwritten."""
    data = bytearray(frame)
    op = draw(st.sampled_from(["flip", "truncate", "append", "overwrite", "insert", "delete"]))
    pos = draw(st.integers(min_value=0, max_value=max(0, len(data) - 1)))
    if op == "flip" and data:
        for _ in range(draw(st.integers(min_value=1, max_value=8))):
            i = draw(st.integers(min_value=0, max_value=len(data) - 1))
            data[i] ^= 1 << draw(st.integers(min_value=0, max_value=7))
    elif op == "truncate":
        del data[pos:]
    elif op == "append":
        data += draw(st.binary(min_size=1, max_size=16))
    elif op == "overwrite" and data:
        data[pos] = draw(st.integers(min_value=0, max_value=255))
    elif op == "insert":
        data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    elif op == "delete" and data:
        del data[pos : pos + draw(st.integers(min_value=1, max_value=8))]
    return bytes(data)


# -- settings ----------------------------------------------------------------------------------------------
SCALE = float(os.environ.get("FUZZ_SCALE", "1"))
"""Multiply every example budget (e.g. ``FUZZ_SCALE=20`` for a long local run); CI keeps 1."""


def fuzz(max_examples: int) -> settings:
    return settings(
        max_examples=max(1, int(max_examples * SCALE)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
