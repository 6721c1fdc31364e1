"""openpi's robots on the policy socket: the DROID, LIBERO and ALOHA observation formats and their transforms.

openpi's server maps each robot's own observation dict onto the model's inputs with per-robot input and
output transforms (``src/openpi/policies/{droid,libero,aloha}_policy.py``, plus the delta-action
transforms of the robot's data config in ``src/openpi/training/config.py``). A ``RobotFormat`` is that
pair for PI0, pure (NumPy and PIL, no torch), so the session applies it before anything reaches a worker:

- ``inputs(msg)``: the robot's dict -> the model's canonical observation: camera slots ``base_0_rgb``,
  ``left_wrist_0_rgb``, ``right_wrist_0_rgb`` (uint8 (H, W, 3), or None = a masked black image, as openpi
  masks the cameras a robot lacks), ``state`` (the model-space state vector) and the request's control
  keys (``prompt``, ``session_id``, ``seed``, ``num_inference_steps``, ``rtc``) untouched. Images arrive as
  openpi takes them (``protocols/images.py``); resizing to the model's size happens on the policy worker.
- ``outputs(actions, state)``: model-space actions, already un-normalized -> the robot's action space
  (openpi's ``AbsoluteActions`` then the robot's ``*Outputs``: dims kept, ALOHA's joint flips and gripper
  conversion).
- ``actions_to_model(actions, state)``: the inverse, for real-time chunking: the previous chunk, as the
  robot executes it, back in the space the model denoises in (before normalization).

Normalization sits between the two (openpi's ``Normalize`` / ``Unnormalize``) and runs with the model.
``generic`` is the gateway's own configurable scheme: its transforms are the identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from realtime_gw.protocols.images import ImageFormatError, to_uint8_hwc

ROBOTS = ("generic", "droid", "libero", "aloha")
MODEL_CAMERAS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
"""PI0's camera slots, in model order (openpi's names)."""
MODEL_STATE_KEY = "state"
CONTROL_KEYS = ("prompt", "session_id", "seed", "num_inference_steps", "rtc", "action_contract", "timestamp")
"""Keys of an observation that are not robot data; they pass through the input transform unchanged."""
DEFAULT_MAX_SIDE = 4096


class RobotFormatError(ValueError):
    """The observation does not match the robot's format; the message names the key and what to send."""


@dataclass(frozen=True, slots=True)
class Field:
    """One key a robot sends (``path``: nested keys, e.g. ``("images", "cam_high")`` for ALOHA)."""

    path: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    required: bool = True
    note: str = ""

    @property
    def label(self) -> str:
        return "/".join(self.path)

    @property
    def is_image(self) -> bool:
        return self.dtype == "uint8" and len(self.shape) == 3

    def describe(self) -> dict[str, Any]:
        return {
            "path": list(self.path),
            "shape": list(self.shape),
            "dtype": self.dtype,
            "required": self.required,
            "note": self.note,
        }


IMAGE_NOTE = "uint8 0..255 or float 0..1, (H, W, 3) or (3, H, W); other sizes are resized with padding"


@dataclass(frozen=True)
class RobotFormat:
    """The ``generic`` scheme (identity transforms); the presets below override the robot-specific parts."""

    name: str = "generic"
    state_dim: int = 0
    """The model-space state size after ``inputs`` (0: the server's configured ``state_dim``)."""
    action_dim: int = 0
    """The robot's action size after ``outputs`` (0: the server's configured ``action_dim``)."""
    fields: tuple[Field, ...] = ()
    optional_slots: tuple[str, ...] = ()
    """Model camera slots that may be None (masked) after ``inputs``."""
    delta_mask: tuple[bool, ...] | None = None
    """Action dims the model predicts relative to the state (openpi's ``DeltaActions`` mask)."""
    default_prompt: str | None = None
    """Used when an observation has no ``prompt`` (openpi's ``InjectDefaultPrompt``)."""

    @property
    def generic(self) -> bool:
        return self.name == "generic"

    @property
    def options(self) -> dict[str, Any]:
        return {"delta_actions": self.delta_mask is not None, "default_prompt": self.default_prompt}

    # -- observations in --------------------------------------------------------------------------------
    def inputs(self, msg: Any, max_side: int = DEFAULT_MAX_SIDE) -> Any:
        """The robot's observation -> the model's canonical one (see the module doc)."""
        if self.generic:
            if self.default_prompt is not None and isinstance(msg, dict) and "prompt" not in msg:
                return {**msg, "prompt": self.default_prompt}
            return msg
        if not isinstance(msg, dict):
            raise RobotFormatError(f"an observation must be a msgpack map, got {type(msg).__name__}")
        out: dict[str, Any] = {k: msg[k] for k in CONTROL_KEYS if k in msg}
        prompt = out.get("prompt")
        if isinstance(prompt, bytes):
            try:
                out["prompt"] = prompt.decode("utf-8")  # as openpi's DroidInputs
            except UnicodeDecodeError:
                raise RobotFormatError("'prompt' must be a string (or UTF-8 bytes)") from None
        if prompt is None and self.default_prompt is not None:
            out["prompt"] = self.default_prompt
        try:
            out.update(self._images(msg, max_side))
        except ImageFormatError as e:
            raise RobotFormatError(str(e)) from None
        out[MODEL_STATE_KEY] = self._state(msg)
        return out

    def _images(self, msg: dict[str, Any], max_side: int) -> dict[str, np.ndarray | None]:
        raise NotImplementedError

    def _state(self, msg: dict[str, Any]) -> np.ndarray:
        raise NotImplementedError

    # -- actions out ------------------------------------------------------------------------------------
    def outputs(self, actions: np.ndarray, state: np.ndarray) -> np.ndarray:
        """(H, >= action_dim) model-space actions (un-normalized) -> (H, action_dim) float32 robot actions;
        ``state`` is the model-space state of the observation they answer."""
        if self.generic:
            return actions
        a = np.array(actions[:, : self.action_dim], dtype=np.float64)
        if self.delta_mask is not None:
            mask = np.asarray(self.delta_mask)
            a[:, : mask.size] += np.where(mask, state[: mask.size], 0.0)  # openpi's AbsoluteActions
        return self._encode(a).astype(np.float32)

    def actions_to_model(self, actions: np.ndarray, state: np.ndarray) -> np.ndarray:
        """The inverse of ``outputs``: (K, action_dim) robot actions -> model space (before normalization)."""
        if self.generic:
            return actions
        a = self._decode(np.array(actions, dtype=np.float64))
        if self.delta_mask is not None:
            mask = np.asarray(self.delta_mask)
            a[:, : mask.size] -= np.where(mask, state[: mask.size], 0.0)  # openpi's DeltaActions
        return a.astype(np.float32)

    def _encode(self, actions: np.ndarray) -> np.ndarray:
        return actions

    def _decode(self, actions: np.ndarray) -> np.ndarray:
        return actions

    # -- metadata ---------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """What the metadata frame says of this robot's observations (added to the server config)."""
        if self.generic:
            return {"robot": "generic"}
        cameras = [f for f in self.fields if f.is_image]
        states = [f for f in self.fields if f.dtype == "float"]
        return {
            "robot": self.name,
            "robot_options": self.options,
            "observation": [f.describe() for f in self.fields],
            "camera_keys": [f.label for f in cameras],
            "required_camera_keys": [f.label for f in cameras if f.required],
            "image_format": IMAGE_NOTE,
            "state_key": states[0].label if len(states) == 1 else None,
            "state_keys": [f.label for f in states],
            "state_dim": sum(f.shape[0] for f in states),
        }


# -- shared parsing -----------------------------------------------------------------------------------------
def _vector(name: str, value: Any, n: int, allow_scalar: bool = False) -> np.ndarray:
    """A float vector of length ``n`` (a NumPy array or a list of numbers; a scalar where ``allow_scalar``)."""
    if isinstance(value, (list, tuple)):
        try:
            value = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            raise RobotFormatError(f"{name!r} must be a list of {n} numbers") from None
    elif (
        allow_scalar
        and isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, (bool, np.bool_))
    ):
        value = np.asarray([value], dtype=np.float64)
    if not isinstance(value, np.ndarray):
        raise RobotFormatError(f"{name!r} must be a float array of shape ({n},), got {type(value).__name__}")
    if value.dtype.kind not in "fiu":
        raise RobotFormatError(f"{name!r} must have a float (or integer) dtype, got {value.dtype}")
    if allow_scalar and value.shape == ():
        value = value.reshape(1)
    if value.shape != (n,):
        raise RobotFormatError(f"{name!r} must have length {n}, got shape {value.shape}")
    out = value.astype(np.float64)
    if not np.isfinite(out).all():
        raise RobotFormatError(f"{name!r} contains NaN or infinity: {out.tolist()}")
    return out


def _required(msg: dict[str, Any], key: str, robot: str, what: str) -> Any:
    if key not in msg or msg[key] is None:
        raise RobotFormatError(f"missing key {key!r} ({what}) of the {robot} observation format")
    return msg[key]


# -- DROID --------------------------------------------------------------------------------------------------
DROID_EXTERIOR, DROID_WRIST = "observation/exterior_image_1_left", "observation/wrist_image_left"
DROID_JOINTS, DROID_GRIPPER = "observation/joint_position", "observation/gripper_position"


@dataclass(frozen=True)
class DroidFormat(RobotFormat):
    """openpi's ``DroidInputs`` / ``DroidOutputs`` for PI0: two cameras (the third slot masked), 7 joint
    positions + 1 gripper position as the state, the first 8 action dims back."""

    name: str = "droid"
    state_dim: int = 8
    action_dim: int = 8
    fields: tuple[Field, ...] = (
        Field((DROID_EXTERIOR,), (224, 224, 3), "uint8", note=f"camera base_0_rgb; {IMAGE_NOTE}"),
        Field((DROID_WRIST,), (224, 224, 3), "uint8", note=f"camera left_wrist_0_rgb; {IMAGE_NOTE}"),
        Field((DROID_JOINTS,), (7,), "float", note="7 joint positions"),
        Field((DROID_GRIPPER,), (1,), "float", note="gripper position (a scalar works too)"),
        Field(("prompt",), (), "str", required=False, note="the task"),
    )
    optional_slots: tuple[str, ...] = ("right_wrist_0_rgb",)

    def _images(self, msg: dict[str, Any], max_side: int) -> dict[str, np.ndarray | None]:
        base = to_uint8_hwc(DROID_EXTERIOR, _required(msg, DROID_EXTERIOR, self.name, "camera"), max_side)
        wrist = to_uint8_hwc(DROID_WRIST, _required(msg, DROID_WRIST, self.name, "camera"), max_side)
        return {"base_0_rgb": base, "left_wrist_0_rgb": wrist, "right_wrist_0_rgb": None}

    def _state(self, msg: dict[str, Any]) -> np.ndarray:
        joints = _vector(DROID_JOINTS, _required(msg, DROID_JOINTS, self.name, "7 joint positions"), 7)
        gripper_value = _required(msg, DROID_GRIPPER, self.name, "gripper position")
        gripper = _vector(DROID_GRIPPER, gripper_value, 1, allow_scalar=True)
        return np.concatenate([joints, gripper])


# -- LIBERO -------------------------------------------------------------------------------------------------
LIBERO_IMAGE, LIBERO_WRIST, LIBERO_STATE = "observation/image", "observation/wrist_image", "observation/state"


@dataclass(frozen=True)
class LiberoFormat(RobotFormat):
    """openpi's ``LiberoInputs`` / ``LiberoOutputs`` for PI0: two cameras (the third slot masked), an
    8-dim state, the first 7 action dims back; with ``delta_mask`` the ``extra_delta_transform`` of
    openpi's ``pi0_libero`` (the first 6 dims relative to the state)."""

    name: str = "libero"
    state_dim: int = 8
    action_dim: int = 7
    fields: tuple[Field, ...] = (
        Field((LIBERO_IMAGE,), (224, 224, 3), "uint8", note=f"camera base_0_rgb; {IMAGE_NOTE}"),
        Field((LIBERO_WRIST,), (224, 224, 3), "uint8", note=f"camera left_wrist_0_rgb; {IMAGE_NOTE}"),
        Field((LIBERO_STATE,), (8,), "float", note="end-effector position 3 + axis-angle 3 + gripper 2"),
        Field(("prompt",), (), "str", required=False, note="the task"),
    )
    optional_slots: tuple[str, ...] = ("right_wrist_0_rgb",)

    def _images(self, msg: dict[str, Any], max_side: int) -> dict[str, np.ndarray | None]:
        base = to_uint8_hwc(LIBERO_IMAGE, _required(msg, LIBERO_IMAGE, self.name, "camera"), max_side)
        wrist = to_uint8_hwc(LIBERO_WRIST, _required(msg, LIBERO_WRIST, self.name, "camera"), max_side)
        return {"base_0_rgb": base, "left_wrist_0_rgb": wrist, "right_wrist_0_rgb": None}

    def _state(self, msg: dict[str, Any]) -> np.ndarray:
        return _vector(LIBERO_STATE, _required(msg, LIBERO_STATE, self.name, "8-dim state"), 8)


# -- ALOHA --------------------------------------------------------------------------------------------------
ALOHA_CAMERAS = ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist")
"""openpi's ``AlohaInputs.EXPECTED_CAMERAS``; PI0 has three slots, so ``cam_low`` is accepted but not used."""
ALOHA_SLOTS = {
    "base_0_rgb": "cam_high",
    "left_wrist_0_rgb": "cam_left_wrist",
    "right_wrist_0_rgb": "cam_right_wrist",
}
ALOHA_GRIPPERS = [6, 13]
ALOHA_FLIP = np.array([1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1], dtype=np.float64)
"""openpi's ``_joint_flip_mask``: joint sign conventions of ALOHA vs the PI runtime."""


def _normalize(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return (x - lo) / (hi - lo)


def _unnormalize(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return x * (hi - lo) + lo


def gripper_to_angular(value: np.ndarray) -> np.ndarray:
    """ALOHA's linear gripper position -> PI0's normalized angular one (openpi's ``_gripper_to_angular``:
    the Interbotix linear-to-angle inverse, then normalized between encoder counts 2405 and 3110)."""
    value = _unnormalize(value, 0.01844, 0.05800)  # PUPPET_GRIPPER_POSITION_OPEN / _CLOSED
    arm_length, horn_radius = 0.036, 0.022
    with np.errstate(divide="ignore"):  # a position of exactly 0 gives -inf, clipped to -1 below
        ratio = (horn_radius**2 + value**2 - arm_length**2) / (2 * horn_radius * value)
    return _normalize(np.arcsin(np.clip(ratio, -1.0, 1.0)), 0.5476, 1.6296)


def gripper_from_angular(value: np.ndarray) -> np.ndarray:
    """PI0's gripper action -> ALOHA's gripper joint command (openpi's ``_gripper_from_angular``)."""
    return _normalize(value + 0.5476, -0.6213, 1.4910)  # PUPPET_GRIPPER_JOINT_OPEN / _CLOSE


def gripper_from_angular_inv(value: np.ndarray) -> np.ndarray:
    """The exact inverse of ``gripper_from_angular`` (openpi's ``_gripper_from_angular_inv``)."""
    return _unnormalize(value, -0.6213, 1.4910) - 0.5476


@dataclass(frozen=True)
class AlohaFormat(RobotFormat):
    """openpi's ``AlohaInputs`` / ``AlohaOutputs`` for PI0: ``images`` channels-first, ``cam_high`` in the base
    slot and the wrist cameras masked when absent; a 14-dim state and action space (two arms: 6 joints +
    1 gripper each); with ``adapt_to_pi`` the joint flips and gripper conversions between standard ALOHA
    and the PI runtime; with ``delta_mask`` joint actions relative to the state (openpi's default
    ``use_delta_joint_actions``)."""

    name: str = "aloha"
    state_dim: int = 14
    action_dim: int = 14
    fields: tuple[Field, ...] = (
        Field(("state",), (14,), "float", note="left arm 6 joints + gripper, right arm 6 joints + gripper"),
        Field(("images", "cam_high"), (3, 224, 224), "uint8", note=f"camera base_0_rgb; {IMAGE_NOTE}"),
        Field(
            ("images", "cam_left_wrist"),
            (3, 224, 224),
            "uint8",
            required=False,
            note="camera left_wrist_0_rgb, masked when absent",
        ),
        Field(
            ("images", "cam_right_wrist"),
            (3, 224, 224),
            "uint8",
            required=False,
            note="camera right_wrist_0_rgb, masked when absent",
        ),
        Field(
            ("images", "cam_low"),
            (3, 224, 224),
            "uint8",
            required=False,
            note="accepted; PI0 has three camera slots and does not use it (as openpi)",
        ),
        Field(("prompt",), (), "str", required=False, note="the task"),
    )
    optional_slots: tuple[str, ...] = ("left_wrist_0_rgb", "right_wrist_0_rgb")
    adapt_to_pi: bool = True

    @property
    def options(self) -> dict[str, Any]:
        return {**super().options, "adapt_to_pi": self.adapt_to_pi}

    def _images(self, msg: dict[str, Any], max_side: int) -> dict[str, np.ndarray | None]:
        images = _required(msg, "images", self.name, "a map of camera name -> (3, H, W) image")
        if not isinstance(images, dict):
            raise RobotFormatError(
                f"'images' must be a map of camera name -> image, got {type(images).__name__}"
            )
        unknown = sorted(str(k) for k in images if k not in ALOHA_CAMERAS)
        if unknown:
            raise RobotFormatError(
                f"unknown ALOHA cameras {unknown}: 'images' may hold {list(ALOHA_CAMERAS)}"
            )
        if images.get("cam_high") is None:
            raise RobotFormatError("missing images/cam_high: the base camera of the aloha observation format")
        out: dict[str, np.ndarray | None] = {}
        for slot, cam in ALOHA_SLOTS.items():
            value = images.get(cam)
            out[slot] = None if value is None else to_uint8_hwc(f"images/{cam}", value, max_side)
        return out

    def _state(self, msg: dict[str, Any]) -> np.ndarray:
        state = _vector("state", _required(msg, "state", self.name, "14 joint and gripper positions"), 14)
        if self.adapt_to_pi:
            state = ALOHA_FLIP * state
            state[ALOHA_GRIPPERS] = gripper_to_angular(state[ALOHA_GRIPPERS])
        return state

    def _encode(self, actions: np.ndarray) -> np.ndarray:
        if self.adapt_to_pi:
            actions = ALOHA_FLIP * actions
            actions[:, ALOHA_GRIPPERS] = gripper_from_angular(actions[:, ALOHA_GRIPPERS])
        return actions

    def _decode(self, actions: np.ndarray) -> np.ndarray:
        if self.adapt_to_pi:
            actions = ALOHA_FLIP * actions
            actions[:, ALOHA_GRIPPERS] = gripper_from_angular_inv(actions[:, ALOHA_GRIPPERS])
        return actions


GENERIC = RobotFormat()


def delta_mask(*dims: int) -> tuple[bool, ...]:
    """openpi's ``make_bool_mask``: (6, -1) -> six True then one False."""
    return tuple(d > 0 for d in dims for _ in range(abs(d)))


def robot_format(
    name: str,
    delta_actions: bool | None = None,
    adapt_to_pi: bool = True,
    default_prompt: str | None = None,
) -> RobotFormat:
    """The preset ``name``. ``delta_actions`` None = as openpi's PI0 checkpoint for that robot was trained
    (``pi0_libero``: ``extra_delta_transform=True``; ``pi0_aloha``: ``use_delta_joint_actions=True``)."""
    if name == "generic":
        return RobotFormat(default_prompt=default_prompt)
    if name == "droid":
        if delta_actions:
            raise ValueError(
                "robot 'droid' has no delta actions (openpi's DROID policies predict them as is)"
            )
        return DroidFormat(default_prompt=default_prompt)
    delta = True if delta_actions is None else delta_actions
    if name == "libero":
        return LiberoFormat(delta_mask=delta_mask(6, -1) if delta else None, default_prompt=default_prompt)
    if name == "aloha":
        return AlohaFormat(
            delta_mask=delta_mask(6, -1, 6, -1) if delta else None,
            adapt_to_pi=adapt_to_pi,
            default_prompt=default_prompt,
        )
    raise ValueError(f"unknown robot {name!r}; expected one of {', '.join(ROBOTS)}")
