"""PI0 input preparation as openpi / LeRobot do it: images, prompt tokens, normalization statistics.

Runs on the policy worker's thread (never on the event loop).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F


# -- images -----------------------------------------------------------------------------------------------
def image_to_model(img: np.ndarray | None, size: tuple[int, int]) -> tuple[torch.Tensor, bool]:
    """uint8 (H, W, 3) -> float32 (3, h, w) in [-1, 1], resized with padding; None -> masked black image."""
    x, present = image_to_uint8(img, size)
    return scale_pixels(x), present


def image_to_uint8(img: np.ndarray | None, size: tuple[int, int]) -> tuple[torch.Tensor, bool]:
    """uint8 (H, W, 3) -> uint8 (3, h, w), resized with padding; None -> black (masked) image.

    Lossless for the model: resizing rounds to whole levels anyway, so keeping uint8 until the device
    (``scale_pixels`` there) moves 4x fewer bytes and keeps the float work off the worker thread."""
    h, w = size
    if img is None:
        # openpi feeds black (-1 after scaling) for an absent camera and masks its tokens out.
        return torch.zeros((3, h, w), dtype=torch.uint8), False
    # Frames arrive as read-only views on the message; torch wants writable memory, so copy once.
    x = torch.tensor(img).permute(2, 0, 1)
    if x.shape[1:] != (h, w):
        x = resize_with_pad(x.float(), h, w).to(torch.uint8)
    return x, True


def scale_pixels(x: torch.Tensor) -> torch.Tensor:
    """uint8 levels -> float32 in [-1, 1] (openpi's x / 127.5 - 1)."""
    return x.float() / 127.5 - 1.0


def resize_with_pad(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Keep the aspect ratio, fit inside (h, w), pad the rest with black (openpi's resize_with_pad)."""
    cur_h, cur_w = x.shape[1:]
    ratio = max(cur_w / w, cur_h / h)
    new_h, new_w = max(1, int(cur_h / ratio)), max(1, int(cur_w / ratio))
    resized = F.interpolate(
        x[None], size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=True
    )[0]
    resized = resized.round().clamp(0, 255)  # match a uint8 round-trip like PIL's
    top, left = (h - new_h) // 2, (w - new_w) // 2
    out = torch.zeros((3, h, w), dtype=x.dtype)
    out[:, top : top + new_h, left : left + new_w] = resized
    return out


# -- prompt -----------------------------------------------------------------------------------------------
class PromptTokenizer(Protocol):
    name: str
    bos_id: int

    def encode(self, text: str) -> list[int]: ...


def tokenize_prompt(tok: PromptTokenizer, prompt: str, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """openpi's PaligemmaTokenizer layout: BOS + cleaned prompt + "\\n", right-padded to max_len."""
    cleaned = prompt.strip().replace("_", " ").replace("\n", " ")
    ids = ([tok.bos_id] + tok.encode(cleaned) + tok.encode("\n"))[:max_len]
    tokens = np.zeros(max_len, dtype=np.int64)
    mask = np.zeros(max_len, dtype=bool)
    tokens[: len(ids)] = ids
    mask[: len(ids)] = True
    return tokens, mask


# -- normalization ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NormStats:
    """Mean/std (z-score) statistics, the normalization PI0 was trained with."""

    state_mean: np.ndarray
    state_std: np.ndarray
    actions_mean: np.ndarray
    actions_std: np.ndarray

    def state(self, x: np.ndarray) -> np.ndarray:
        return (x - self.state_mean) / (self.state_std + 1e-6)

    def actions(self, x: np.ndarray) -> np.ndarray:
        return x * (self.actions_std + 1e-6) + self.actions_mean


def load_norm_stats(path: str | Path, state_dim: int, action_dim: int) -> NormStats:
    """openpi's ``norm_stats.json`` (``{"norm_stats": {"state": {"mean", "std"}, "actions": {...}}}``).

    The outer ``norm_stats`` wrapper is optional; vectors longer than the robot's dims are cut.
    """
    doc: Any = json.loads(Path(path).read_text())
    stats = doc.get("norm_stats", doc)

    def vec(feature: str, field: str, dim: int) -> np.ndarray:
        try:
            v = np.asarray(stats[feature][field], dtype=np.float32)
        except (KeyError, TypeError) as e:
            raise ValueError(f"{path}: missing {feature}.{field} ({e})") from None
        if v.ndim != 1 or v.shape[0] < dim:
            raise ValueError(f"{path}: {feature}.{field} has shape {v.shape}, need at least ({dim},)")
        return v[:dim]

    return NormStats(
        state_mean=vec("state", "mean", state_dim),
        state_std=vec("state", "std", state_dim),
        actions_mean=vec("actions", "mean", action_dim),
        actions_std=vec("actions", "std", action_dim),
    )
