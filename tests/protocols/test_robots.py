"""openpi's robot formats: each preset's input transform on openpi's own example observations, its output
transform and inverse, and what the metadata says. The reference below follows openpi's code step by step
(``src/openpi/policies/aloha_policy.py``, ``transforms.DeltaActions`` / ``AbsoluteActions``)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from realtime_gw.protocols.robots import (
    ALOHA_CAMERAS,
    MODEL_CAMERAS,
    RobotFormatError,
    delta_mask,
    gripper_from_angular,
    gripper_from_angular_inv,
    gripper_to_angular,
    robot_format,
)
from tests.openpi_examples import (
    ACTION_DIMS,
    EXAMPLES,
    make_aloha_example,
    make_droid_example,
    make_libero_example,
)

FLIP = np.array([1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1])


def openpi_aloha_state(state: np.ndarray) -> np.ndarray:
    """openpi's ``_decode_state(state, adapt_to_pi=True)``, spelled out."""
    state = FLIP * np.asarray(state, np.float64)
    g = state[[6, 13]] * (0.05800 - 0.01844) + 0.01844
    g = np.arcsin(np.clip((0.022**2 + g**2 - 0.036**2) / (2 * 0.022 * g), -1.0, 1.0))
    state[[6, 13]] = (g - 0.5476) / (1.6296 - 0.5476)
    return state


def openpi_aloha_actions(actions: np.ndarray, state: np.ndarray) -> np.ndarray:
    """openpi's output pipeline after Unnormalize for pi0_aloha: AbsoluteActions(make_bool_mask(6, -1, 6, -1)),
    then AlohaOutputs(adapt_to_pi=True): ``[:, :14]``, joint flips, gripper from angular."""
    a = np.array(actions, np.float64)[:, :14]
    mask = np.array([True] * 6 + [False] + [True] * 6 + [False])
    a[..., :14] += np.expand_dims(np.where(mask, state[..., :14], 0), axis=-2)
    a = FLIP * a
    a[:, [6, 13]] = (a[:, [6, 13]] + 0.5476 - (-0.6213)) / (1.4910 - (-0.6213))
    return a


def test_droid_example_maps_onto_the_model_slots() -> None:
    robot, ex = robot_format("droid"), make_droid_example(3)
    out = robot.inputs(ex)
    np.testing.assert_array_equal(out["base_0_rgb"], ex["observation/exterior_image_1_left"])
    np.testing.assert_array_equal(out["left_wrist_0_rgb"], ex["observation/wrist_image_left"])
    assert out["right_wrist_0_rgb"] is None  # masked, as openpi's DroidInputs does for PI0
    np.testing.assert_array_equal(
        out["state"], np.concatenate([ex["observation/joint_position"], ex["observation/gripper_position"]])
    )
    assert out["prompt"] == "do something" and set(out) == {*MODEL_CAMERAS, "state", "prompt"}
    # The gripper may be a scalar (openpi adds the axis); the reply keeps the first 8 dims.
    scalar = robot.inputs({**ex, "observation/gripper_position": 0.25, "prompt": b"wipe"})
    assert scalar["state"][-1] == 0.25 and scalar["prompt"] == "wipe"
    actions = np.arange(10 * 8, dtype=np.float32).reshape(10, 8)
    np.testing.assert_array_equal(robot.outputs(actions, out["state"]), actions)


def test_libero_example_and_its_delta_actions() -> None:
    ex = make_libero_example(4)
    plain, delta = robot_format("libero", delta_actions=False), robot_format("libero")
    out = plain.inputs(ex)
    np.testing.assert_array_equal(out["base_0_rgb"], ex["observation/image"])
    np.testing.assert_array_equal(out["left_wrist_0_rgb"], ex["observation/wrist_image"])
    np.testing.assert_array_equal(out["state"], ex["observation/state"])
    model = np.random.default_rng(0).standard_normal((10, 7)).astype(np.float32)
    np.testing.assert_array_equal(plain.outputs(model, out["state"]), model)
    # pi0_libero: extra_delta_transform, make_bool_mask(6, -1): the first 6 dims relative to the state.
    expected = model + np.concatenate([out["state"][:6], [0.0]])
    np.testing.assert_allclose(delta.outputs(model, out["state"]), expected, rtol=1e-6)
    np.testing.assert_allclose(delta.actions_to_model(expected, out["state"]), model, atol=1e-6)


def test_aloha_example_follows_openpis_transforms() -> None:
    robot, ex = robot_format("aloha"), make_aloha_example(5)
    ex["state"] = np.random.default_rng(1).uniform(0.0, 1.0, 14)
    out = robot.inputs(ex)
    # Channels first -> last; cam_high is the base slot; cam_low is not one of PI0's three slots.
    np.testing.assert_array_equal(out["base_0_rgb"], ex["images"]["cam_high"].transpose(1, 2, 0))
    np.testing.assert_array_equal(out["left_wrist_0_rgb"], ex["images"]["cam_left_wrist"].transpose(1, 2, 0))
    np.testing.assert_array_equal(
        out["right_wrist_0_rgb"], ex["images"]["cam_right_wrist"].transpose(1, 2, 0)
    )
    np.testing.assert_allclose(out["state"], openpi_aloha_state(ex["state"]), rtol=1e-12)
    model = np.random.default_rng(2).standard_normal((10, 32)).astype(np.float32)  # the model's 32 dims
    got = robot.outputs(model, out["state"])
    assert got.shape == (10, 14) and got.dtype == np.float32
    np.testing.assert_allclose(got, openpi_aloha_actions(model, out["state"]), rtol=1e-6, atol=1e-6)
    # The inverse (for real-time chunking) gets back to the model's space.
    np.testing.assert_allclose(robot.actions_to_model(got, out["state"]), model[:, :14], atol=2e-5)


def test_aloha_without_adapt_to_pi_or_deltas_is_the_identity_on_14_dims() -> None:
    robot = robot_format("aloha", delta_actions=False, adapt_to_pi=False)
    ex = make_aloha_example(6)
    out = robot.inputs(ex)
    np.testing.assert_array_equal(out["state"], ex["state"])
    model = np.random.default_rng(3).standard_normal((10, 20)).astype(np.float32)
    np.testing.assert_array_equal(robot.outputs(model, out["state"]), model[:, :14])


def test_aloha_gripper_conversions() -> None:
    x = np.linspace(0.0, 1.0, 11)
    np.testing.assert_allclose(gripper_from_angular_inv(gripper_from_angular(x)), x, atol=1e-12)
    # Linear position -> angle (Interbotix) is monotonic: opening the gripper opens the angle.
    angular = gripper_to_angular(np.linspace(0.2, 1.0, 9))
    assert (np.diff(angular) > 0).all() or (np.diff(angular) < 0).all()
    assert delta_mask(6, -1, 6, -1) == (True,) * 6 + (False,) + (True,) * 6 + (False,)


def test_aloha_cameras_may_be_missing_except_the_base() -> None:
    robot = robot_format("aloha")
    ex = make_aloha_example(7)
    del ex["images"]["cam_left_wrist"], ex["images"]["cam_low"]
    out = robot.inputs(ex)
    assert out["left_wrist_0_rgb"] is None and out["right_wrist_0_rgb"] is not None
    # Channels last and float in [0, 1] work too.
    ex["images"]["cam_high"] = ex["images"]["cam_high"].transpose(1, 2, 0) / 255.0
    assert robot.inputs(ex)["base_0_rgb"].dtype == np.uint8


@pytest.mark.parametrize(
    ("robot", "change", "message"),
    [
        ("droid", {"observation/joint_position": None}, "missing key 'observation/joint_position'"),
        (
            "droid",
            {"observation/joint_position": np.zeros(6)},
            "'observation/joint_position' must have length 7",
        ),
        (
            "droid",
            {"observation/gripper_position": [0.1, 0.2]},
            "'observation/gripper_position' must have length 1",
        ),
        (
            "droid",
            {"observation/wrist_image_left": None},
            "missing key 'observation/wrist_image_left' (camera)",
        ),
        ("droid", {"observation/exterior_image_1_left": np.zeros((9, 9, 3), np.int32)}, "got int32"),
        ("libero", {"observation/state": np.full(8, np.inf)}, "'observation/state' contains NaN or infinity"),
        ("libero", {"observation/image": np.full((4, 4, 3), 2.0)}, "float images must be in [0, 1]"),
        ("aloha", {"state": np.zeros(7)}, "'state' must have length 14"),
        ("aloha", {"images": [1, 2]}, "'images' must be a map of camera name -> image"),
        (
            "aloha",
            {"images": {"cam_top": np.zeros((3, 4, 4), np.uint8)}},
            "unknown ALOHA cameras ['cam_top']",
        ),
        ("aloha", {"images": {}}, "missing images/cam_high"),
        ("aloha", {"prompt": b"\xff"}, "'prompt' must be a string"),
    ],
)
def test_wrong_observations_name_the_key(robot: str, change: dict[str, Any], message: str) -> None:
    ex = {**EXAMPLES[robot](0), **change}
    ex = {k: v for k, v in ex.items() if v is not None}
    with pytest.raises(RobotFormatError, match=re.escape(message)):
        robot_format(robot).inputs(ex)


def test_generic_is_the_identity_and_presets_describe_their_keys() -> None:
    generic = robot_format("generic")
    msg = {"observation/state": [1.0], "prompt": "x"}
    assert generic.inputs(msg) is msg and generic.describe() == {"robot": "generic"}
    assert robot_format("generic", default_prompt="fold").inputs({})["prompt"] == "fold"
    assert robot_format("aloha", default_prompt="fold the towel").inputs(
        make_aloha_example() | {"prompt": None}
    )
    for name, dim in ACTION_DIMS.items():
        meta = robot_format(name).describe()
        assert meta["robot"] == name and robot_format(name).action_dim == dim
        paths = [tuple(f["path"]) for f in meta["observation"]]
        example = EXAMPLES[name](0)
        for path in paths:  # every described key is one openpi's example sends
            value: Any = example
            for key in path:
                value = value[key]
            if isinstance(value, np.ndarray):
                shape = next(f["shape"] for f in meta["observation"] if tuple(f["path"]) == path)
                assert list(value.shape) == shape, (name, path)
    aloha = robot_format("aloha").describe()
    assert aloha["camera_keys"] == [
        f"images/{c}" for c in ("cam_high", "cam_left_wrist", "cam_right_wrist", "cam_low")
    ]
    assert aloha["required_camera_keys"] == ["images/cam_high"] and set(ALOHA_CAMERAS) >= {"cam_low"}
    droid = robot_format("droid").describe()
    assert droid["state_key"] is None and droid["state_dim"] == 8
    assert droid["state_keys"] == ["observation/joint_position", "observation/gripper_position"]
    with pytest.raises(ValueError, match="unknown robot 'ur5'"):
        robot_format("ur5")
    with pytest.raises(ValueError, match="no delta actions"):
        robot_format("droid", delta_actions=True)
