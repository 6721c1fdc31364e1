"""What a robot sends on the OpenPI socket, checked: observations and control frames (pure, no I/O).

``parse_observation`` turns one decoded msgpack-numpy map into an ``Observation`` or raises
``ObservationError`` whose message names exactly what to fix; ``endpoint_name`` and
``parse_stream_start`` do the same for ``{"endpoint": ...}`` frames. Nothing here keeps state: the
history rings and the modes live in ``sessions/policy_request_reply.py`` and ``sessions/openpi.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from realtime_gw.protocols.action_contract import ContractError, ReplyRequest, parse_opt_in
from realtime_gw.records.policy import PolicySpec, RtcGuide

MAX_SESSION_ID_CHARS = 128
MAX_PROMPT_CHARS = 2000
MAX_SEED = 2**63 - 1
MAX_CONTROL_HZ = 1000.0
ENDPOINTS = ("reset", "stream_start", "stream_stop")


class ObservationError(ValueError):
    """The observation is unusable; the message tells the client exactly what to fix."""


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """``{"endpoint": "stream_start", ...}``, checked."""

    control_hz: float
    """The robot's control rate: one action per step of 1 / control_hz seconds."""
    execute_horizon: int
    """s: steps of each chunk executed before the next chunk starts (a new chunk every s steps)."""
    inference_delay: int | None = None
    """d, fixed by the client; None = estimated from measured chunk latencies."""
    rtc: bool = True
    """Join consecutive chunks with real-time chunking (False: plain chunks)."""


@dataclass(frozen=True, slots=True)
class Frame:
    images: tuple[np.ndarray | None, ...]
    """One entry per camera key, None where an optional camera was not sent."""
    state: np.ndarray


@dataclass(frozen=True, slots=True)
class Observation:
    frame: Frame
    prompt: str
    session_id: str
    seed: int | None
    num_steps: int | None
    rtc: RtcGuide | None = None
    reply: ReplyRequest | None = None
    """The action contract's opt-in (``protocols/action_contract.py``); None for a stock observation."""


def endpoint_name(msg: dict[str, Any]) -> str:
    """The ``endpoint`` of a control frame, one of ``ENDPOINTS``; raises ``ObservationError`` otherwise."""
    endpoint = msg["endpoint"]
    # isinstance first: comparing a numpy array with "reset" is elementwise, not a yes/no.
    if not (isinstance(endpoint, str) and endpoint in ENDPOINTS):
        raise ObservationError(
            f"unknown endpoint {_show(endpoint)}; the endpoints are {', '.join(repr(e) for e in ENDPOINTS)}"
        )
    return endpoint


def parse_stream_start(spec: PolicySpec, msg: dict[str, Any]) -> StreamSettings:
    h = spec.action_horizon
    hz = msg.get("control_hz")
    if isinstance(hz, (bool, np.bool_)) or not isinstance(hz, (int, float, np.integer, np.floating)):
        raise ObservationError(
            f"stream_start needs 'control_hz': a number of control steps per second, got {_show(hz)}"
        )
    if not 0 < float(hz) <= MAX_CONTROL_HZ:
        raise ObservationError(f"'control_hz' must be > 0 and <= {MAX_CONTROL_HZ:g}, got {_show(hz)}")
    s = _int_field(msg, "execute_horizon", 1, h, default=max(1, h // 2))
    d = msg.get("inference_delay")
    delay = None if d is None else _int_field(msg, "inference_delay", 0, h - 1)
    if delay is not None and delay > h - s:
        raise ObservationError(
            f"'inference_delay' ({delay}) must be <= action_horizon - execute_horizon ({h - s}): "
            "the frozen steps must exist in the previous chunk"
        )
    rtc = msg.get("rtc", True)
    if not isinstance(rtc, (bool, np.bool_)):
        raise ObservationError(f"'rtc' must be true or false, got {_show(rtc)}")
    return StreamSettings(control_hz=float(hz), execute_horizon=s, inference_delay=delay, rtc=bool(rtc))


# -- validation -------------------------------------------------------------------------------------------
def parse_observation(spec: PolicySpec, msg: Any) -> Observation:
    """Check one observation against the spec; raises ``ObservationError`` naming the exact problem."""
    if not isinstance(msg, dict):
        raise ObservationError(f"an observation must be a msgpack map, got {_kind(msg)}")
    reply = contract_opt_in(spec, msg)
    # Ring entries outlive the frame; copy only when there is a ring to keep them in.
    keep = spec.history_depth > 1
    images: list[np.ndarray | None] = []
    for key in spec.camera_keys:
        if key not in msg or msg[key] is None:
            if key in spec.optional_cameras:
                images.append(None)
                continue
            raise ObservationError(
                f"missing camera key {key!r}: required cameras are {list(spec.required_cameras)}, "
                f"each a uint8 array of shape (H, W, 3)"
            )
        img = _image(spec, key, msg[key])
        images.append(img.copy() if keep else img)
    state = _state(spec, msg)
    return Observation(
        frame=Frame(images=tuple(images), state=state),
        prompt=_prompt(spec, msg),
        session_id=session_id_of(msg),
        seed=_seed(msg),
        num_steps=_num_steps(spec, msg),
        rtc=_rtc(spec, msg),
        reply=reply,
    )


def contract_opt_in(spec: PolicySpec, msg: dict[str, Any]) -> ReplyRequest | None:
    """The observation's action-contract opt-in (``protocols/action_contract.py``); an expectation the
    server does not meet is an ``ObservationError`` naming the field. Checked before a robot preset's
    input transform too: a client built for another layout learns that, not a missing key of this one."""
    try:
        return parse_opt_in(spec.contract, msg)
    except ContractError as e:
        raise ObservationError(str(e)) from None


def _image(spec: PolicySpec, key: str, value: Any) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise ObservationError(f"{key!r} must be a uint8 array of shape (H, W, 3), got {_kind(value)}")
    if value.dtype != np.uint8:
        raise ObservationError(f"{key!r} must have dtype uint8, got {value.dtype} (shape {value.shape})")
    if value.ndim != 3 or value.shape[2] != 3:
        raise ObservationError(f"{key!r} must have shape (H, W, 3) (RGB, channels last), got {value.shape}")
    h, w = value.shape[:2]
    if not (0 < h <= spec.max_image_side and 0 < w <= spec.max_image_side):
        raise ObservationError(f"{key!r} is {h}x{w}; each side must be between 1 and {spec.max_image_side}")
    return value


def _state(spec: PolicySpec, msg: dict[str, Any]) -> np.ndarray:
    key, dim = spec.state_key, spec.state_dim
    if key not in msg:
        raise ObservationError(f"missing state key {key!r}: a float array of shape ({dim},)")
    value = msg[key]
    if isinstance(value, (list, tuple)):
        try:
            value = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            raise ObservationError(f"{key!r} must be a list of {dim} numbers") from None
    if not isinstance(value, np.ndarray):
        raise ObservationError(f"{key!r} must be a float array of shape ({dim},), got {_kind(value)}")
    if value.dtype.kind not in "fiu":
        raise ObservationError(f"{key!r} must have a float (or integer) dtype, got {value.dtype}")
    if value.shape != (dim,):
        got = f"length {value.shape[0]}" if value.ndim == 1 else f"shape {value.shape}"
        raise ObservationError(f"{key!r} must have length {dim}, got {got}")
    state = value.astype(np.float32)
    if not np.isfinite(state).all():
        raise ObservationError(f"{key!r} contains NaN or infinity: {state.tolist()}")
    return state


def _prompt(spec: PolicySpec, msg: dict[str, Any]) -> str:
    prompt = msg.get(spec.prompt_key, "")
    if isinstance(prompt, np.ndarray) and prompt.ndim == 0 and prompt.dtype.kind == "U":
        prompt = str(prompt)  # some clients send np.str_ / 0-d unicode arrays
    if not isinstance(prompt, str):
        raise ObservationError(f"{spec.prompt_key!r} must be a string, got {_kind(prompt)}")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ObservationError(
            f"{spec.prompt_key!r} is {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}"
        )
    return prompt


def session_id_of(msg: dict[str, Any]) -> str:
    """The robot a frame speaks for: its ``session_id`` (``"default"`` when absent)."""
    sid = msg.get("session_id", "default")
    if not isinstance(sid, str) or not 0 < len(sid) <= MAX_SESSION_ID_CHARS:
        raise ObservationError(
            f"'session_id' must be a string of 1 to {MAX_SESSION_ID_CHARS} characters, got {_show(sid)}"
        )
    return sid


def _seed(msg: dict[str, Any]) -> int | None:
    seed = msg.get("seed")
    if seed is None:
        return None
    if (
        isinstance(seed, (bool, np.bool_))
        or not isinstance(seed, (int, np.integer))
        or not 0 <= seed <= MAX_SEED
    ):
        raise ObservationError(f"'seed' must be an integer from 0 to 2**63-1, got {_show(seed)}")
    return int(seed)


def _num_steps(spec: PolicySpec, msg: dict[str, Any]) -> int | None:
    steps = msg.get("num_inference_steps")
    if steps is None:
        return None
    ok = isinstance(steps, (int, np.integer)) and not isinstance(steps, (bool, np.bool_))
    if not ok or not 1 <= steps <= spec.max_inference_steps:
        raise ObservationError(
            f"'num_inference_steps' must be an integer from 1 to {spec.max_inference_steps}, got {_show(steps)}"
        )
    return int(steps)


def _int_field(msg: dict[str, Any], key: str, lo: int, hi: int, default: int | None = None) -> int:
    value = msg.get(key, default)
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not ok or not lo <= value <= hi:
        raise ObservationError(f"{key!r} must be an integer from {lo} to {hi}, got {_show(value)}")
    return int(value)


def _rtc(spec: PolicySpec, msg: dict[str, Any]) -> RtcGuide | None:
    """``rtc: {prev_actions: (K, action_dim), inference_delay: d, execute_horizon: s}`` (s optional)."""
    rtc = msg.get("rtc")
    if rtc is None:
        return None
    h, a = spec.action_horizon, spec.action_dim
    if not isinstance(rtc, dict):
        raise ObservationError(
            f"'rtc' must be a map {{prev_actions, inference_delay, execute_horizon}}, got {_kind(rtc)}"
        )
    prev = rtc.get("prev_actions")
    if isinstance(prev, (list, tuple)):
        try:
            prev = np.asarray(prev, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            raise ObservationError(
                f"'rtc.prev_actions' must be a ({h}, {a})-shaped list of numbers"
            ) from None
    if not isinstance(prev, np.ndarray) or prev.dtype.kind not in "fiu":
        raise ObservationError(
            f"'rtc.prev_actions' must be a float array of shape (K, {a}), got {_kind(prev)}"
        )
    if prev.ndim != 2 or prev.shape[1] != a or not 1 <= prev.shape[0] <= h:
        raise ObservationError(
            f"'rtc.prev_actions' must have shape (K, {a}) with 1 <= K <= {h} (the previous chunk's actions "
            f"from the new observation's step on), got {prev.shape}"
        )
    prev = prev.astype(np.float32)
    if not np.isfinite(prev).all():
        raise ObservationError("'rtc.prev_actions' contains NaN or infinity")
    k = prev.shape[0]
    delay = _int_field(rtc, "inference_delay", 0, k)
    # By default the previous chunk is exactly the remainder: s = H - K steps of it were executed.
    horizon = _int_field(rtc, "execute_horizon", 1, h, default=max(1, h - k))
    return RtcGuide(prev_actions=prev, inference_delay=delay, execute_horizon=horizon)


def _kind(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    return type(value).__name__


def _show(value: Any, limit: int = 80) -> str:
    """A short repr for error messages; never raises (numpy's repr can, e.g. for generic datetimes)."""
    if isinstance(value, np.ndarray):
        return _kind(value)
    try:
        text = repr(value)
    except Exception:
        return type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
