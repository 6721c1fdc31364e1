"""msgpack-numpy: byte-compatible with openpi_client, and every limit refuses with a precise message."""

from __future__ import annotations

import contextlib

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openpi_client import msgpack_numpy as stock

from realtime_gw.protocols.openpi import DecodeError, FrameLimits, packb, unpackb

SAMPLE = {
    "observation/exterior_image_1_left": np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3),
    "observation/state": np.linspace(-1, 1, 8),
    "prompt": "pick up the cup",
    "nested": {"ints": np.array([[1, 2], [3, 4]], dtype=np.int16), "list": [1, 2.5, "x", None, True]},
    "scalar_f": np.float32(0.25),
    "scalar_i": np.int64(-7),
    "scalar_b": np.bool_(True),
    "empty": np.zeros((0, 4), np.float32),
    "big_endian": np.arange(3, dtype=">u4"),
    "text_array": np.array(["ab", "c"]),
}


def _assert_same(a: object, b: object) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    elif isinstance(a, (np.ndarray, np.generic)):
        assert type(a) is type(b) and a.dtype == b.dtype  # type: ignore[union-attr]
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b and type(a) is type(b)


def test_bytes_identical_to_openpi_client() -> None:
    assert packb(SAMPLE) == stock.packb(SAMPLE)
    assert packb({"actions": np.ones((10, 8), np.float32)}) == stock.Packer().pack(
        {"actions": np.ones((10, 8), np.float32)}
    )


def test_round_trips_both_ways() -> None:
    _assert_same(unpackb(stock.packb(SAMPLE)), stock.unpackb(stock.packb(SAMPLE)))
    _assert_same(stock.unpackb(packb(SAMPLE)), SAMPLE | {})
    decoded = unpackb(packb(SAMPLE))
    _assert_same(decoded, stock.unpackb(packb(SAMPLE)))
    assert decoded["observation/state"].flags.writeable is False  # a zero-copy view, like the stock decoder


def _raw_array(dtype: str, data: bytes, shape: list[int]) -> bytes:
    return msgpack.packb({"obs": {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}})


@pytest.mark.parametrize(
    ("dtype", "kind"),
    [("|O", "object"), ("|V8", "void (structured)"), ("<c16", "complex"), ("[('a', '<i4')]", None)],
)
def test_rejected_dtypes(dtype: str, kind: str | None) -> None:
    with pytest.raises(DecodeError) as err:
        unpackb(_raw_array(dtype, b"\0" * 8, [1]))
    msg = str(err.value)
    if kind is None:  # a structured-dtype spelling np.dtype() does not parse from a string
        assert msg == "at 'obs': unknown dtype \"[('a', '<i4')]\""
    else:
        assert msg == (
            f"at 'obs': dtype '{dtype}' ({kind}) is not allowed; object, void and complex dtypes are rejected"
        )


def test_rejected_generic_dtype_and_packing() -> None:
    frame = msgpack.packb({"s": {b"__npgeneric__": True, b"data": 1.0, b"dtype": "<c8"}})
    with pytest.raises(DecodeError, match=r"at 's': dtype '<c8' \(complex\) is not allowed"):
        unpackb(frame)
    with pytest.raises(ValueError, match="Unsupported dtype: object"):
        packb({"x": np.array([object()], dtype=object)})


@pytest.mark.parametrize(
    ("frame", "limits", "message"),
    [
        (b"\0" * 101, FrameLimits(max_frame_bytes=100), "frame is 101 bytes, over the limit of 100 bytes"),
        (
            b"\0" * (3 * 2**20),
            FrameLimits(max_frame_bytes=2**21),
            "frame is 3145728 bytes (3.0 MiB), over the limit of 2097152 bytes (2.0 MiB)",
        ),
        (msgpack.packb({"a": {"b": {"c": [1]}}}), FrameLimits(max_depth=3), "at 'a.b.c': nesting deeper than 3"),
        (
            _raw_array("<f4", b"\0" * 400, [10, 10]),
            FrameLimits(max_array_bytes=399),
            "at 'obs': array of shape (10, 10) is 400 bytes, over the limit of 399 bytes",
        ),
        (
            _raw_array("<f4", b"\0", [1] * 17),
            FrameLimits(),
            "at 'obs': array has 17 dimensions, over the limit of 16",
        ),
        (
            _raw_array("<f4", b"\0" * 12, [4]),
            FrameLimits(),
            "at 'obs': array of shape (4,) and dtype <f4 needs 16 bytes of data, got 12",
        ),
        (_raw_array("<f4", b"\0" * 20, [4]), FrameLimits(), "needs 16 bytes of data, got 20"),
        (_raw_array("<f4", b"", [-1]), FrameLimits(), "'shape' must be a list of non-negative integers, got [-1]"),
        (_raw_array("float128x", b"", [0]), FrameLimits(), "at 'obs': unknown dtype 'float128x'"),
        (
            msgpack.packb({"obs": {b"__ndarray__": True, b"data": "text", b"dtype": "<f4", b"shape": [1]}}),
            FrameLimits(),
            "__ndarray__ needs bin 'data', got str",
        ),
        (b"\xc1", FrameLimits(), "not valid msgpack"),
        (b"\x92\x01", FrameLimits(), "not valid msgpack: Unpack failed: incomplete input"),
        (b"\x91" * 5000 + b"\xc0", FrameLimits(), "nesting deeper than 32"),
    ],
)
def test_limits_and_malformed_frames(frame: bytes, limits: FrameLimits, message: str) -> None:
    with pytest.raises(DecodeError) as err:
        unpackb(frame, limits)
    assert message in str(err.value)


def test_depth_counts_containers_not_arrays() -> None:
    frame = packb({"a": {"b": np.zeros((2, 2))}})
    assert unpackb(frame, FrameLimits(max_depth=2))["a"]["b"].shape == (2, 2)
    with pytest.raises(DecodeError, match="at 'a': nesting deeper than 1"):
        unpackb(frame, FrameLimits(max_depth=1))


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=64), st.integers(min_value=0, max_value=400), st.integers(min_value=0, max_value=255)
)
def test_corrupted_frames_only_ever_raise_decode_error(junk: bytes, pos: int, byte: int) -> None:
    frame = bytearray(packb(SAMPLE))
    frame[pos % len(frame)] = byte
    for candidate in (bytes(frame), junk, bytes(frame[: pos % len(frame)])):
        with contextlib.suppress(DecodeError):
            unpackb(candidate)


@pytest.mark.parametrize(
    ("shape", "data", "message"),
    [
        ([True], b"\0\0", "'shape' must be a list of non-negative integers, got [True]"),
        ([2, False], b"", "'shape' must be a list of non-negative integers, got [2, False]"),
        ([2**63, 0], b"", "at 'a': array of shape (9223372036854775808, 0) is not valid"),
        ([0, 2**63 - 1], b"", "is not valid"),
        ([2**31, 2**31, 2**31, 0], b"", "is not valid"),
    ],
)
def test_shapes_numpy_cannot_build_are_decode_errors(shape: list[object], data: bytes, message: str) -> None:
    """Found by fuzzing (tests/fuzz): these used to escape as ValueError / TypeError."""
    frame = msgpack.packb({"a": {b"__ndarray__": True, b"data": data, b"dtype": "<i2", b"shape": shape}})
    with pytest.raises(DecodeError) as err:
        unpackb(frame)
    assert message in str(err.value)


def test_out_of_range_integer_scalar_is_refused() -> None:
    frame = msgpack.packb({"s": {b"__npgeneric__": True, b"data": 300, b"dtype": "|u1"}})
    with pytest.raises(DecodeError, match="at 's': __npgeneric__ value 300 does not fit |u1"):
        unpackb(frame)
    ok = msgpack.packb({"s": {b"__npgeneric__": True, b"data": -128, b"dtype": "|i1"}})
    assert unpackb(ok)["s"] == np.int8(-128)


@pytest.mark.parametrize(
    ("data", "dtype", "message"),
    [
        (2**30, "S0", "__npgeneric__ of dtype |S0 needs bytes 'data', got int"),  # would allocate 1 GiB
        (5, "<U0", "needs str 'data', got int"),
        (True, "<i8", "needs int 'data', got bool"),
        ("1", "<f4", "needs float or int 'data', got str"),
        (None, "<f4", "got NoneType"),
        ([1], "<i4", "got list"),
    ],
)
def test_npgeneric_data_must_have_the_dtype_python_type(data: object, dtype: str, message: str) -> None:
    """Found by fuzzing (tests/fuzz): np.bytes_(N) allocated N bytes from a 38-byte frame."""
    frame = msgpack.packb({"a": {b"__npgeneric__": True, b"data": data, b"dtype": dtype}})
    with pytest.raises(DecodeError) as err:
        unpackb(frame)
    assert message in str(err.value)
