"""OpenPI policy connection: a pure state machine (no I/O, no torch).

One ``PolicyConnection`` per WebSocket. It turns each decoded frame into effects:

- ``Send(payload)``      a binary msgpack-numpy reply (the transport adds ``server_timing`` to action replies);
- ``SendError(message)`` a text frame; the connection stays open for the next observation;
- ``Infer(request)``     run the policy; the transport feeds the actions back through ``on_actions``;
- ``StartStream(settings)`` switch this connection to streamed actions (``policy_stream``) until
  ``{"endpoint": "stream_stop"}``.

Several robots may share one connection, told apart by ``session_id`` (default ``"default"``). Each keeps
its own observation-history ring, which starts fresh on its first observation, on ``{"endpoint":
"reset"}`` and whenever its prompt changes. Missing history at the start repeats the oldest frame.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from realtime_gw.records.policy import PolicyRequest, PolicySpec, RtcGuide

MAX_SESSION_ID_CHARS = 128
MAX_PROMPT_CHARS = 2000
MAX_SEED = 2**63 - 1
MAX_CONTROL_HZ = 1000.0
ENDPOINTS = ("reset", "stream_start", "stream_stop")


@dataclass(frozen=True, slots=True)
class Send:
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SendError:
    message: str


@dataclass(frozen=True, slots=True)
class Infer:
    request: PolicyRequest


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
class StartStream:
    settings: StreamSettings


Effect = Union[Send, SendError, Infer, StartStream]  # noqa: UP007 -- a runtime alias; py3.10 target


class ObservationError(ValueError):
    """The observation is unusable; the message tells the client exactly what to fix."""


def server_metadata(spec: PolicySpec) -> dict[str, Any]:
    """The metadata frame sent first on every connection."""
    return {
        "policy_server_config": {
            "server": "realtime_gw",
            "model": spec.model,
            "random_init": spec.random_init,
            "action_key": spec.action_key,
            "action_keys": [spec.action_key],
            "action_horizon": spec.action_horizon,
            "action_dim": spec.action_dim,
            "action_dtype": "float32",
            "camera_keys": list(spec.camera_keys),
            "required_camera_keys": list(spec.required_cameras),
            "image_size": list(spec.image_size),
            "image_format": "uint8 (H, W, 3) RGB; other sizes are resized with padding",
            "state_key": spec.state_key,
            "state_dim": spec.state_dim,
            "prompt_key": spec.prompt_key,
            "max_prompt_tokens": spec.max_prompt_tokens,
            "tokenizer": spec.tokenizer,
            "image_history": list(spec.image_history),
            "state_history": list(spec.state_history),
            # With history, robots sharing one connection must say who they are.
            "needs_session_id": spec.history_depth > 1,
            "num_inference_steps": spec.num_inference_steps,
            "max_inference_steps": spec.max_inference_steps,
            "normalization": spec.normalization,
            "sampler": spec.sampler,
            "extensions": ["reset", "session_id", "seed", "num_inference_steps", "rtc", "stream"],
        }
    }


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


class RobotHistory:
    """The last ``depth`` frames of one robot, oldest first."""

    def __init__(self, depth: int, prompt: str) -> None:
        self.prompt = prompt
        self._frames: deque[Frame] = deque(maxlen=depth)

    def push(self, frame: Frame) -> None:
        self._frames.append(frame)

    def at(self, offsets: tuple[int, ...]) -> list[Frame]:
        """Frames at the given offsets (0 = newest); offsets before the first frame repeat the oldest."""
        newest = len(self._frames) - 1
        return [self._frames[max(0, newest + o)] for o in offsets]

    def __len__(self) -> int:
        return len(self._frames)


class PolicyConnection:
    def __init__(self, spec: PolicySpec, max_robots: int = 64) -> None:
        self.spec = spec
        self.max_robots = max_robots
        self.robots: dict[str, RobotHistory] = {}
        self._in_flight: str | None = None

    @property
    def metadata(self) -> dict[str, Any]:
        return server_metadata(self.spec)

    # -- events -----------------------------------------------------------------------------------------
    def handle(self, msg: Any) -> list[Effect]:
        """A decoded frame from the client."""
        if self._in_flight is not None:
            raise RuntimeError("handle() called while an inference is in flight")
        try:
            if isinstance(msg, dict) and "endpoint" in msg:
                return self._endpoint(msg)
            request = self.observe(msg)
        except ObservationError as e:
            return [SendError(str(e))]
        self._in_flight = request.session_id
        return [Infer(request)]

    def observe(self, msg: Any) -> PolicyRequest:
        """Validate an observation, push it into its robot's history and build the request (no in-flight
        bookkeeping: streamed mode takes observations while a chunk is computing)."""
        obs = parse_observation(self.spec, msg)
        robot = self._robot(obs.session_id, obs.prompt)
        robot.push(obs.frame)
        return self._request(robot, obs)

    def reset(self, msg: dict[str, Any]) -> list[Effect]:
        self.robots.pop(_session_id(msg), None)
        return [Send({"status": "reset successful"})]

    def reject(self, reason: str) -> list[Effect]:
        """A frame that could not be decoded at all."""
        return [SendError(f"could not decode observation: {reason}")]

    def on_actions(self, actions: np.ndarray) -> list[Effect]:
        """The policy answered the in-flight request."""
        self._in_flight = None
        expected = (self.spec.action_horizon, self.spec.action_dim)
        if actions.shape != expected or actions.dtype != np.float32:
            raise RuntimeError(
                f"policy returned {actions.dtype} {actions.shape}, expected float32 {expected}"
            )
        return [Send({self.spec.action_key: actions})]

    def on_error(self, message: str) -> list[Effect]:
        """The in-flight request was refused (e.g. the worker is full); the client may retry."""
        self._in_flight = None
        return [SendError(message)]

    # -- internals --------------------------------------------------------------------------------------
    def _endpoint(self, msg: dict[str, Any]) -> list[Effect]:
        endpoint = endpoint_name(msg)
        if endpoint == "reset":
            return self.reset(msg)
        if endpoint == "stream_start":
            return [StartStream(parse_stream_start(self.spec, msg))]
        raise ObservationError(
            "no stream is running; send {'endpoint': 'stream_start', 'control_hz': ...} first"
        )

    def _robot(self, session_id: str, prompt: str) -> RobotHistory:
        robot = self.robots.get(session_id)
        if robot is not None and robot.prompt == prompt:
            return robot
        if robot is None and len(self.robots) >= self.max_robots:
            raise ObservationError(
                f"too many session_ids on this connection (limit {self.max_robots}); "
                "send {'endpoint': 'reset', 'session_id': ...} for robots that are done"
            )
        # New robot, or a new task: history from before the prompt change would mislead the policy.
        robot = RobotHistory(self.spec.history_depth, prompt)
        self.robots[session_id] = robot
        return robot

    def _request(self, robot: RobotHistory, obs: Observation) -> PolicyRequest:
        spec = self.spec
        image_frames = robot.at(spec.image_history)
        images = [f.images[c] for c in range(len(spec.camera_keys)) for f in image_frames]
        state = np.stack([f.state for f in robot.at(spec.state_history)])
        return PolicyRequest(
            images=images,
            state=state,
            prompt=obs.prompt,
            seed=obs.seed,
            num_steps=obs.num_steps,
            session_id=obs.session_id,
            rtc=obs.rtc,
        )


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
        session_id=_session_id(msg),
        seed=_seed(msg),
        num_steps=_num_steps(spec, msg),
        rtc=_rtc(spec, msg),
    )


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


def _session_id(msg: dict[str, Any]) -> str:
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
