"""openpi's own example observations, re-created: ``make_droid_example()``, ``make_libero_example()`` and
``make_aloha_example()`` from ``src/openpi/policies/{droid,libero,aloha}_policy.py`` (what openpi's policy
tests and ``serve_policy`` examples feed a policy server), with the same keys, shapes, dtypes and value
ranges. openpi draws from NumPy's global generator; these take a seed so a test can send the same
observation twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def make_droid_example(seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "observation/exterior_image_1_left": rng.integers(256, size=(224, 224, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(256, size=(224, 224, 3), dtype=np.uint8),
        "observation/joint_position": rng.random(7),
        "observation/gripper_position": rng.random(1),
        "prompt": "do something",
    }


def make_libero_example(seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "observation/state": rng.random(8),
        "observation/image": rng.integers(256, size=(224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(256, size=(224, 224, 3), dtype=np.uint8),
        "prompt": "do something",
    }


def make_aloha_example(seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "state": np.ones((14,)),
        "images": {
            name: rng.integers(256, size=(3, 224, 224), dtype=np.uint8)
            for name in ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist")
        },
        "prompt": "do something",
    }


EXAMPLES = {"droid": make_droid_example, "libero": make_libero_example, "aloha": make_aloha_example}
ACTION_DIMS = {"droid": 8, "libero": 7, "aloha": 14}
"""What openpi's output transforms return: DROID the first 8 dims, LIBERO 7, ALOHA 14."""
