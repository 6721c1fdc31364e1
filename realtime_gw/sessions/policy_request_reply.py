"""The request/reply half of the OpenPI session, and each robot's observation history (pure: no I/O).

``PolicyConnection`` turns each decoded frame into effects:

- ``SendReply(payload)``  a binary msgpack-numpy reply;
- ``SendError(message)``  a text frame; the connection stays open for the next observation;
- ``Infer(request)``      run the policy; the answer comes back through ``on_actions`` / ``on_error``;
- ``StartStream(settings)`` switch to streamed actions (``policy_stream``) until ``stream_stop``.

It is a part: the transport talks to ``sessions/openpi.py``'s ``OpenPISession``, which owns both modes,
numbers the policy jobs and adds ``server_timing``. The streamed half reuses ``observe`` and ``reset``.

With an openpi robot preset (``spec.robot``: DROID, LIBERO, ALOHA; ``protocols/robots.py``) ``observe``
first maps the robot's own observation onto the model's fields with openpi's input transform; the
metadata frame then describes the robot's keys and shapes. The output transform runs where results
come back (``sessions/openpi.py``), for both modes.

Several robots may share one connection, told apart by ``session_id`` (default ``"default"``). Each keeps
its own observation-history ring, which starts fresh on its first observation, on ``{"endpoint":
"reset"}`` and whenever its prompt changes. Missing history at the start repeats the oldest frame.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from realtime_gw.protocols.robots import RobotFormatError
from realtime_gw.records.policy import PolicyRequest, PolicySpec
from realtime_gw.sessions.observation import (
    Frame,
    Observation,
    ObservationError,
    StreamSettings,
    contract_opt_in,
    endpoint_name,
    parse_observation,
    parse_stream_start,
    session_id_of,
)


@dataclass(frozen=True, slots=True)
class SendReply:
    """A binary msgpack-numpy frame."""

    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SendError:
    """A text frame (the stock client raises it as an error); the connection stays open."""

    message: str


@dataclass(frozen=True, slots=True)
class Infer:
    request: PolicyRequest


@dataclass(frozen=True, slots=True)
class StartStream:
    settings: StreamSettings


PolicyEffect = Union[SendReply, SendError, Infer, StartStream]  # noqa: UP007 -- a runtime alias (py3.10)


def server_metadata(spec: PolicySpec) -> dict[str, Any]:
    """The metadata frame sent first on every connection: the model-side fields, with a robot preset's
    own observation keys and shapes in place of the model's (``RobotFormat.describe``)."""
    config = {
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
        "state_in_prompt": spec.state_in_prompt,
        "extensions": ["reset", "session_id", "seed", "num_inference_steps", "rtc", "stream", "action_contract"],
        "action_contract": spec.contract.describe(),
    }
    return {"policy_server_config": {**config, **spec.robot.describe()}}


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
    """Request/reply: one ``Infer`` per observation, and no frame until its answer is in."""

    def __init__(self, spec: PolicySpec, max_robots: int = 64) -> None:
        self.spec = spec
        self.max_robots = max_robots
        self.robots: dict[str, RobotHistory] = {}
        self._in_flight: str | None = None

    @property
    def metadata(self) -> dict[str, Any]:
        return server_metadata(self.spec)

    # -- events -----------------------------------------------------------------------------------------
    def handle(self, msg: Any) -> list[PolicyEffect]:
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
        if isinstance(msg, dict) and not self.spec.robot.generic:
            contract_opt_in(self.spec, msg)
        try:
            msg = self.spec.robot.inputs(msg, self.spec.max_image_side)
        except RobotFormatError as e:
            raise ObservationError(str(e)) from None
        obs = parse_observation(self.spec, msg)
        robot = self._robot(obs.session_id, obs.prompt)
        robot.push(obs.frame)
        return self._request(robot, obs)

    def reset(self, msg: dict[str, Any]) -> list[SendReply]:
        self.robots.pop(session_id_of(msg), None)
        return [SendReply({"status": "reset successful"})]

    def reject(self, reason: str) -> list[SendError]:
        """A frame that could not be decoded at all."""
        return [SendError(f"could not decode observation: {reason}")]

    def on_actions(self, actions: np.ndarray) -> list[SendReply]:
        """The policy answered the in-flight request."""
        self._in_flight = None
        expected = (self.spec.action_horizon, self.spec.action_dim)
        if actions.shape != expected or actions.dtype != np.float32:
            raise RuntimeError(
                f"policy returned {actions.dtype} {actions.shape}, expected float32 {expected}"
            )
        return [SendReply({self.spec.action_key: actions})]

    def on_error(self, message: str) -> list[SendError]:
        """The in-flight request was refused (e.g. the worker is full); the client may retry."""
        self._in_flight = None
        return [SendError(message)]

    # -- internals --------------------------------------------------------------------------------------
    def _endpoint(self, msg: dict[str, Any]) -> list[PolicyEffect]:
        endpoint = endpoint_name(msg)
        if endpoint == "reset":
            return [*self.reset(msg)]
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
            reply=obs.reply,
        )
