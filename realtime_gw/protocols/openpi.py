"""msgpack-numpy, wire-compatible with ``openpi_client.msgpack_numpy``, with hard limits. Pure: no I/O.

An array travels as a msgpack map with *bin* keys::

    {b"__ndarray__": True, b"data": <raw bytes, C order>, b"dtype": "<f4", b"shape": [224, 224, 3]}

and a NumPy scalar as ``{b"__npgeneric__": True, b"data": <python value>, b"dtype": "<i8"}``.

Decoding differs from the stock ``unpackb`` only in what it refuses: frames over ``max_frame_bytes``,
nesting deeper than ``max_depth``, arrays over ``max_array_bytes`` or whose byte count does not match
their shape, and object / void (structured) / complex dtypes. Every refusal is a ``DecodeError`` whose
message names the offending key path, so a robot author can fix the client from the text alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

MiB = 1024 * 1024
REJECTED_KINDS = {"O": "object", "V": "void (structured)", "c": "complex"}
_GENERIC_DATA: dict[str, tuple[type, ...]] = {
    "b": (bool,),
    "i": (int,),
    "u": (int,),
    "f": (float, int),
    "S": (bytes,),
    "U": (str,),
    "M": (int,),
    "m": (int,),
}
"""Python types ``np.generic.item()`` gives per dtype kind, i.e. what the stock packer can send."""


class DecodeError(ValueError):
    """The frame cannot be turned into an observation; the message says exactly why."""


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """What one frame may hold; anything beyond is a ``DecodeError``, never an allocation."""

    max_frame_bytes: int = 64 * MiB
    max_depth: int = 32
    """Containers (maps/lists) nested inside the top-level map; an array counts as a leaf."""
    max_array_bytes: int = 64 * MiB
    max_array_ndim: int = 16


DEFAULT_LIMITS = FrameLimits()


# -- encoding (identical bytes to openpi_client.msgpack_numpy.packb) --------------------------------------
def _pack_default(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind in REJECTED_KINDS:
        raise ValueError(f"Unsupported dtype: {obj.dtype}")
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


def packb(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_pack_default)


# -- decoding ---------------------------------------------------------------------------------------------
def unpackb(data: bytes | bytearray | memoryview, limits: FrameLimits = DEFAULT_LIMITS) -> Any:
    """Decode one frame; raises ``DecodeError`` with a precise reason on anything unacceptable."""
    size = len(data)
    if size > limits.max_frame_bytes:
        raise DecodeError(
            f"frame is {_fmt_bytes(size)}, over the limit of {_fmt_bytes(limits.max_frame_bytes)}"
        )
    try:
        # The hook-free decode keeps key paths available for error messages; msgpack's own stack
        # limit bounds nesting before our walk sees it.
        raw = msgpack.unpackb(data, raw=False)
    except msgpack.exceptions.StackError:
        raise DecodeError(f"not valid msgpack-numpy: nesting deeper than {limits.max_depth}") from None
    except (ValueError, TypeError, msgpack.exceptions.UnpackException) as e:
        raise DecodeError(f"not valid msgpack: {e or type(e).__name__}") from None
    return _convert(raw, "", 0, limits)


def _convert(obj: Any, path: str, depth: int, limits: FrameLimits) -> Any:
    if isinstance(obj, dict):
        if b"__ndarray__" in obj:
            return _to_array(obj, path, limits)
        if b"__npgeneric__" in obj:
            return _to_generic(obj, path)
        depth += 1
        if depth > limits.max_depth:
            raise DecodeError(f"{_where(path)}nesting deeper than {limits.max_depth}")
        return {k: _convert(v, _join(path, k), depth, limits) for k, v in obj.items()}
    if isinstance(obj, list):
        depth += 1
        if depth > limits.max_depth:
            raise DecodeError(f"{_where(path)}nesting deeper than {limits.max_depth}")
        return [_convert(v, f"{path}[{i}]", depth, limits) for i, v in enumerate(obj)]
    return obj


def _to_array(obj: dict[Any, Any], path: str, limits: FrameLimits) -> np.ndarray:
    data, dtype_s, shape = obj.get(b"data"), obj.get(b"dtype"), obj.get(b"shape")
    if not isinstance(data, bytes):
        raise DecodeError(f"{_where(path)}__ndarray__ needs bin 'data', got {type(data).__name__}")
    dtype = _dtype(dtype_s, path)
    # type() is int, not isinstance: a bool is an int to Python but not a dimension to numpy.
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise DecodeError(
            f"{_where(path)}__ndarray__ 'shape' must be a list of non-negative integers, got {_short(shape)}"
        )
    if len(shape) > limits.max_array_ndim:
        raise DecodeError(
            f"{_where(path)}array has {len(shape)} dimensions, over the limit of {limits.max_array_ndim}"
        )
    count = 1
    for n in shape:
        count *= n
    nbytes = count * dtype.itemsize
    if nbytes > limits.max_array_bytes:
        raise DecodeError(
            f"{_where(path)}array of shape {tuple(shape)} is {_fmt_bytes(nbytes)}, "
            f"over the limit of {_fmt_bytes(limits.max_array_bytes)}"
        )
    if len(data) != nbytes:
        raise DecodeError(
            f"{_where(path)}array of shape {tuple(shape)} and dtype {dtype.str} needs {nbytes} bytes of data, "
            f"got {len(data)}"
        )
    try:
        # Zero-copy, read-only view on the frame, exactly like the stock decoder.
        return np.ndarray(buffer=data, dtype=dtype, shape=tuple(shape))
    except (ValueError, TypeError, OverflowError) as e:
        # e.g. a zero beside a dimension numpy cannot index: 0 bytes pass the size check above.
        raise DecodeError(f"{_where(path)}array of shape {tuple(shape)} is not valid: {e}") from None


def _to_generic(obj: dict[Any, Any], path: str) -> np.generic:
    dtype = _dtype(obj.get(b"dtype"), path)
    value = obj.get(b"data")
    allowed = _GENERIC_DATA.get(dtype.kind, ())
    # Exact types, as numpy's .item() produces them: np.bytes_(2**30) would allocate a GiB from 5 bytes.
    if type(value) not in allowed:
        names = " or ".join(t.__name__ for t in allowed) or "nothing"
        raise DecodeError(
            f"{_where(path)}__npgeneric__ of dtype {dtype.str} needs {names} 'data', got {type(value).__name__}"
        )
    if dtype.kind in "iu" and type(value) is int:
        # NumPy 1.x wraps out-of-range integers (with a warning) instead of refusing them.
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise DecodeError(f"{_where(path)}__npgeneric__ value {_short(value)} does not fit {dtype.str}")
    try:
        return dtype.type(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise DecodeError(
            f"{_where(path)}__npgeneric__ value {_short(value)} is not a valid {dtype.str}: {e}"
        ) from None


def _dtype(spec: Any, path: str) -> np.dtype[Any]:
    if not isinstance(spec, str):
        raise DecodeError(f"{_where(path)}'dtype' must be a string such as '<f4', got {type(spec).__name__}")
    try:
        dtype = np.dtype(spec)
    except (TypeError, ValueError, SyntaxError):
        raise DecodeError(f"{_where(path)}unknown dtype {spec!r}") from None
    if dtype.kind in REJECTED_KINDS:
        raise DecodeError(
            f"{_where(path)}dtype {spec!r} ({REJECTED_KINDS[dtype.kind]}) is not allowed; "
            "object, void and complex dtypes are rejected"
        )
    return dtype


def _join(path: str, key: Any) -> str:
    k = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
    return f"{path}.{k}" if path else k


def _where(path: str) -> str:
    return f"at '{path}': " if path else ""


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)  # msgpack primitives and lists of them: repr cannot fail
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt_bytes(n: int) -> str:
    return f"{n} bytes ({n / MiB:.1f} MiB)" if n >= MiB else f"{n} bytes"
