"""Plain records shared by the policy session and the policy backends (NumPy only: no torch, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from realtime_gw.protocols.action_contract import CONTROL_HZ, LAYOUTS, ActionContract, ReplyRequest
from realtime_gw.protocols.robots import GENERIC, MODEL_CAMERAS, MODEL_STATE_KEY, RobotFormat

DROID_CAMERAS = (
    "observation/exterior_image_1_left",
    "observation/wrist_image_left",
    "observation/exterior_image_2_left",
)
"""Camera keys in model slot order (openpi's base_0 / left_wrist_0 / right_wrist_0 slots)."""
DROID_OPTIONAL_CAMERAS = ("observation/exterior_image_2_left",)


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """What a policy backend consumes and produces; the session validates observations against it."""

    model: str
    """Human-readable model name, e.g. ``pi0-tiny (random init)``."""
    action_horizon: int
    action_dim: int
    state_dim: int
    camera_keys: tuple[str, ...] = DROID_CAMERAS
    optional_cameras: tuple[str, ...] = DROID_OPTIONAL_CAMERAS
    image_size: tuple[int, int] = (224, 224)
    image_history: tuple[int, ...] = (0,)
    """Frame offsets fed to the model for every camera, oldest first; 0 is the current frame."""
    state_history: tuple[int, ...] = (0,)
    state_key: str = "observation/state"
    prompt_key: str = "prompt"
    action_key: str = "actions"
    random_init: bool = True
    tokenizer: str = "byte-level"
    max_prompt_tokens: int = 48
    num_inference_steps: int = 10
    max_inference_steps: int = 100
    normalization: str = "none"
    sampler: str = "eager"
    """How chunks are sampled: ``eager`` (transformers' sample_actions) or ``fast`` (static KV, graphs)."""
    max_image_side: int = 4096
    robot: RobotFormat = GENERIC
    """openpi's robot preset (``protocols/robots.py``): the session maps the robot's own observation onto
    the model-side fields above and the actions back. ``generic``: the fields above are the wire format."""
    state_in_prompt: bool = False
    """The normalized state is also written into the prompt as openpi's discrete state tokens."""
    control_hz: float | None = None
    """The control rate the server expects the robot to run at (the action contract's); None = the
    preset's own (``action_contract.CONTROL_HZ``), none for ``generic``."""

    def __post_init__(self) -> None:
        for name, offsets in (("image_history", self.image_history), ("state_history", self.state_history)):
            if not offsets or list(offsets) != sorted(set(offsets)) or offsets[-1] != 0 or offsets[0] > 0:
                raise ValueError(
                    f"{name} must be strictly increasing frame offsets <= 0 ending in 0, got {offsets}"
                )
        unknown = set(self.optional_cameras) - set(self.camera_keys)
        if unknown:
            raise ValueError(
                f"optional cameras {sorted(unknown)} are not among camera_keys {self.camera_keys}"
            )
        robot = self.robot
        if not robot.generic:
            model_side = (self.camera_keys, self.optional_cameras, self.state_key, self.state_dim)
            preset = (MODEL_CAMERAS, robot.optional_slots, MODEL_STATE_KEY, robot.state_dim)
            if model_side != preset or self.action_dim != robot.action_dim:
                raise ValueError(
                    f"robot {robot.name!r} needs cameras {MODEL_CAMERAS} (optional {robot.optional_slots}), "
                    f"state {MODEL_STATE_KEY!r} ({robot.state_dim},) and {robot.action_dim} action dims; "
                    f"got {model_side} and {self.action_dim} action dims"
                )

    @classmethod
    def for_robot(cls, robot: RobotFormat, **fields: Any) -> PolicySpec:
        """A spec whose model-side cameras, state and action size are the ones ``robot`` fixes."""
        if robot.generic:
            return cls(robot=robot, **fields)
        return cls(
            camera_keys=MODEL_CAMERAS,
            optional_cameras=robot.optional_slots,
            state_key=MODEL_STATE_KEY,
            state_dim=robot.state_dim,
            action_dim=robot.action_dim,
            robot=robot,
            **fields,
        )

    @property
    def contract(self) -> ActionContract:
        """The machine-readable action contract of the metadata frame (``protocols/action_contract.py``)."""
        robot = self.robot
        if robot.generic:
            state_keys: tuple[str, ...] = (self.state_key,)
        else:
            state_keys = tuple(f.label for f in robot.fields if f.dtype == "float")
        hz = self.control_hz if self.control_hz is not None else CONTROL_HZ.get(robot.name)
        return ActionContract(
            layout=LAYOUTS[robot.name],
            state_keys=state_keys,
            state_dim=self.state_dim,
            action_key=self.action_key,
            action_dim=self.action_dim,
            horizon=self.action_horizon,
            control_hz=hz,
        )

    @property
    def required_cameras(self) -> tuple[str, ...]:
        return tuple(k for k in self.camera_keys if k not in self.optional_cameras)

    @property
    def image_slots(self) -> int:
        """Images per request: one per camera per history offset."""
        return len(self.camera_keys) * len(self.image_history)

    @property
    def history_depth(self) -> int:
        """Frames the session must remember (current one included)."""
        return 1 - min(self.image_history[0], self.state_history[0])


@dataclass(frozen=True, slots=True)
class RtcGuide:
    """Real-time chunking: join the new chunk onto what is left of the previous one.

    ``prev_actions[i]`` is the previous chunk's action for the new chunk's step ``i`` (the robot's action
    space, as the server sent it). The first ``inference_delay`` steps are frozen to it (they execute
    while the new chunk is computed); guidance toward it then decays to zero at step
    ``action_horizon - execute_horizon`` (Black et al., 2025, "Real-Time Execution of Action Chunking
    Flow Policies")."""

    prev_actions: np.ndarray
    """(K, action_dim) float32, 1 <= K <= action_horizon."""
    inference_delay: int
    """d: steps frozen to ``prev_actions``; 0 <= d <= K."""
    execute_horizon: int
    """s: steps executed from each chunk before the next one starts; 1 <= s <= action_horizon."""


@dataclass(slots=True)
class PolicyRequest:
    """One action-chunk request; one-shot (finished after one backend step)."""

    images: list[np.ndarray | None]
    """``spec.image_slots`` entries, camera-major then oldest-to-newest; uint8 (H, W, 3) or None (masked)."""
    state: np.ndarray
    """(len(state_history), state_dim) float32, oldest first."""
    prompt: str = ""
    seed: int | None = None
    """Seeds the flow-matching noise; None draws a fresh seed."""
    num_steps: int | None = None
    session_id: str = "default"
    rtc: RtcGuide | None = None
    """Real-time chunking against the previous chunk; None = a plain chunk."""
    reply: ReplyRequest | None = None
    """The observation opted in to the action contract's reply fields (``valid_steps``...)."""
