"""Shared helpers for the pure OpenPI session tests: a small policy spec and observations to match it."""

from __future__ import annotations

from typing import Any

import numpy as np

from realtime_gw.records.policy import PolicySpec

H, A = 10, 2  # action horizon and action dim of ``spec()``
EXT1, WRIST = "observation/exterior_image_1_left", "observation/wrist_image_left"


def spec() -> PolicySpec:
    return PolicySpec(model="test", action_horizon=H, action_dim=A, state_dim=3)


def obs(i: int = 0, **extra: Any) -> dict[str, Any]:
    """A two-camera observation whose pixels and state are all ``i``."""
    o: dict[str, Any] = {
        EXT1: np.full((4, 6, 3), i, np.uint8),
        WRIST: np.full((4, 6, 3), i, np.uint8),
        "observation/state": np.full(3, float(i)),
        "prompt": "stack the blocks",
    }
    o.update(extra)
    return o
