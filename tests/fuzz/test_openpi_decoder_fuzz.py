"""Property fuzzing of the msgpack-numpy decoder (``realtime_gw.protocols.openpi.unpackb``): arbitrary
bytes, damaged valid observations, bad dtypes and shapes, huge declared sizes, deep nesting. Every
outcome is a value within the limits or the module's own ``DecodeError`` with a message."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from realtime_gw.protocols import openpi
from realtime_gw.protocols.openpi import DecodeError, FrameLimits, packb, unpackb
from tests.fuzz.strategies import (
    arrays,
    frame_mutations,
    fuzz,
    msgpack_values,
    ndarray_maps,
    npgeneric_maps,
    packb_raw,
    plain_msgpack_values,
)

# A float too large for "<f2" becomes inf with this warning: accepted, as NumPy does.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

SMALL = FrameLimits(max_frame_bytes=1 << 16, max_depth=8, max_array_bytes=1 << 12, max_array_ndim=6)


def walk(obj: Any) -> list[Any]:
    out = [obj]
    if isinstance(obj, dict):
        for v in obj.values():
            out += walk(v)
    elif isinstance(obj, list):
        for v in obj:
            out += walk(v)
    return out


def check_outcome(frame: bytes, limits: FrameLimits = openpi.DEFAULT_LIMITS) -> Any:
    """The decoder's contract for any frame: a value within ``limits`` or a ``DecodeError`` that says why."""
    t0 = time.perf_counter()
    try:
        value = unpackb(frame, limits)
    except DecodeError as e:
        assert type(e) is DecodeError
        assert str(e), "a refusal names its reason"
        return e
    finally:
        assert time.perf_counter() - t0 < 2.0, "decoding one small frame must be fast"
    assert len(frame) <= limits.max_frame_bytes
    for node in walk(value):
        if isinstance(node, np.ndarray):
            assert node.dtype.kind not in openpi.REJECTED_KINDS, node.dtype
            assert node.nbytes <= limits.max_array_bytes
            assert node.ndim <= limits.max_array_ndim
            assert not node.flags.writeable, "arrays are read-only views on the frame, as stock"
        elif isinstance(node, np.generic):
            assert node.dtype.kind not in openpi.REJECTED_KINDS, node.dtype
    return value


@fuzz(500)
@given(st.binary(max_size=4096))
@example(b"")
@example(b"\xc1")  # never used
@example(b"\xdd\xff\xff\xff\xff")  # array32 declaring 2**32-1 items
@example(b"\xdf\xff\xff\xff\xff")  # map32
@example(b"\xc6\xff\xff\xff\xff")  # bin32 declaring 4 GiB
@example(b"\xdb\xff\xff\xff\xff")  # str32
@example(b"\xc9\xff\xff\xff\xff\x01")  # ext32
@example(b"\xd6\xff\xff\xff\xff\xff")  # timestamp ext
def test_arbitrary_bytes(frame: bytes) -> None:
    check_outcome(frame)
    check_outcome(frame, SMALL)


def observation(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "observation/exterior_image_1_left": draw(arrays(max_side=8)),
        "observation/state": draw(arrays()),
        "prompt": draw(st.text(max_size=20)),
        draw(st.text(max_size=8)): draw(plain_msgpack_values),
    }


@fuzz(300)
@given(st.data())
def test_valid_observations_round_trip(data: st.DataObject) -> None:
    obs = observation(data.draw)
    out = check_outcome(packb(obs))
    assert set(out) == set(obs)
    for k, v in obs.items():
        if isinstance(v, np.ndarray):
            assert out[k].dtype == v.dtype and out[k].shape == v.shape and out[k].tobytes() == v.tobytes()


@fuzz(400)
@given(st.data())
def test_damaged_observations(data: st.DataObject) -> None:
    obs = observation(data.draw)
    obs["extra"] = data.draw(msgpack_values)
    frame = packb(obs)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        frame = data.draw(frame_mutations(frame))
    check_outcome(frame)
    check_outcome(frame, SMALL)


@fuzz(500)
@given(st.dictionaries(st.text(max_size=8), ndarray_maps() | npgeneric_maps(), min_size=1, max_size=3))
@example({"a": {b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [2**31, 2**31, 7]}})
@example({"a": {b"__ndarray__": True, b"data": b"", b"dtype": "S0", b"shape": [2**40]}})
@example({"a": {b"__ndarray__": True, b"data": b"\0" * 4, b"dtype": "<f4", b"shape": [1] * 17}})
@example({"a": {b"__npgeneric__": True, b"data": 2**64 - 1, b"dtype": "<i8"}})
@example({"a": {b"__npgeneric__": True, b"data": "garbage", b"dtype": "<M8[ns]"}})
def test_bad_dtypes_shapes_and_sizes(obj: dict[str, Any]) -> None:
    """Markers with wrong, rejected or absurd dtypes, shapes (negative, huge, too many dims, not ints)
    and data (short, long, not bytes)."""
    out = check_outcome(packb_raw(obj))
    if not isinstance(out, DecodeError):
        for key, marker in obj.items():
            if b"__ndarray__" in marker:
                assert len(marker[b"data"]) == out[key].nbytes


@fuzz(150)
@given(
    st.integers(min_value=0, max_value=200),
    st.sampled_from(["list", "map", "mixed"]),
    st.integers(min_value=1, max_value=40),
)
def test_deep_nesting(depth: int, kind: str, max_depth: int) -> None:
    obj: Any = np.zeros(2, np.float32)
    for i in range(depth):
        obj = [obj] if kind == "list" or (kind == "mixed" and i % 2) else {"k": obj}
    limits = FrameLimits(max_depth=max_depth)
    out = check_outcome(packb({"root": obj}), limits)
    containers = depth + 1  # the top-level map counts too
    if containers > max_depth:
        assert isinstance(out, DecodeError) and f"nesting deeper than {max_depth}" in str(out)
    else:
        assert not isinstance(out, DecodeError), out


@fuzz(100)
@given(st.integers(min_value=1000, max_value=100_000), st.sampled_from([b"\x91", b"\x81\xa1k"]))
def test_nesting_past_msgpacks_stack(depth: int, opener: bytes) -> None:
    out = check_outcome(opener * depth + b"\xc0")
    assert isinstance(out, DecodeError) and "nesting" in str(out)


@fuzz(200)
@given(
    st.integers(min_value=0, max_value=1 << 14),
    st.integers(min_value=1, max_value=1 << 14),
    st.integers(min_value=1, max_value=8),
    st.data(),
)
def test_limits_are_honoured(max_frame: int, max_array: int, max_ndim: int, data: st.DataObject) -> None:
    obs = observation(data.draw)
    limits = FrameLimits(max_frame_bytes=max_frame, max_depth=32, max_array_bytes=max_array, max_array_ndim=max_ndim)
    out = check_outcome(packb(obs), limits)
    if len(packb(obs)) > max_frame:
        assert isinstance(out, DecodeError) and "over the limit" in str(out)


# -- found by fuzzing ----------------------------------------------------------------------------------
# Fixed (regressions): these raised bare ValueError / TypeError out of unpackb (over the socket: an internal
# error, text frame + close 1011) until the decoder checked them.
@pytest.mark.parametrize(
    ("shape", "data"),
    [
        ([2**63, 0], b""),  # a zero lets the byte count pass; numpy cannot index 2**63
        ([0, 2**63 - 1], b""),
        ([2**31, 2**31, 2**31, 0], b""),  # "array is too big"
        ([True], b"\0\0"),  # a bool is an int to Python, not a dimension to numpy (found by atheris)
        ([2, False], b""),
    ],
)
def test_regression_odd_shapes_are_decode_errors(shape: list[Any], data: bytes) -> None:
    frame = packb_raw({"a": {b"__ndarray__": True, b"data": data, b"dtype": "<i2", b"shape": shape}})
    with pytest.raises(DecodeError, match="at 'a': "):
        unpackb(frame)


@pytest.mark.parametrize(("value", "dtype"), [(300, "|u1"), (-1, "<u8"), (2**63, "<i8"), (-(2**15) - 1, "<i2")])
def test_regression_out_of_range_npgeneric_is_refused(value: int, dtype: str) -> None:
    """NumPy 1.x wrapped these (with a DeprecationWarning) instead of refusing them."""
    with pytest.raises(DecodeError, match="does not fit|is not a valid"):
        unpackb(packb_raw({b"__npgeneric__": True, b"data": value, b"dtype": dtype}))


def test_regression_npgeneric_bytes_cannot_amplify_memory() -> None:
    """Found by atheris: {'__npgeneric__': True, 'data': N, 'dtype': 'S0'} made np.bytes_(N) allocate N
    zero bytes (a 38-byte frame, 1 GiB and ~2 s of event loop with N=2**30)."""
    frame = packb_raw({"a": {b"__npgeneric__": True, b"data": 2**20, b"dtype": "S0"}})
    with pytest.raises(DecodeError, match="needs bytes 'data'"):
        unpackb(frame, FrameLimits(max_array_bytes=1024))
