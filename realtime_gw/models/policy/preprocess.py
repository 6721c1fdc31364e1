"""PI0 input preparation as openpi does it: images, prompt tokens (normalization statistics: ``norm_stats``).

Runs on the policy worker's thread (never on the event loop).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from realtime_gw.models.policy.norm_stats import NormStats, load_norm_stats
from realtime_gw.protocols import images

__all__ = ["NormStats", "load_norm_stats"]  # their home is norm_stats; imported from here too


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
    # openpi's resize (PIL bilinear, black bars), byte for byte. Frames arrive as read-only views on the
    # message; torch wants writable memory, so copy once.
    return torch.tensor(images.resize_with_pad(img, h, w)).permute(2, 0, 1), True


def scale_pixels(x: torch.Tensor) -> torch.Tensor:
    """uint8 levels -> float32 in [-1, 1] (openpi's x / 127.5 - 1)."""
    return x.float() / 127.5 - 1.0


def resize_with_pad(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """(3, H, W) levels 0..255 -> (3, h, w): ``protocols.images.resize_with_pad`` (openpi's) on a tensor."""
    levels = x.round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
    return torch.from_numpy(images.resize_with_pad(levels, h, w)).permute(2, 0, 1).to(x.dtype)


# -- prompt -----------------------------------------------------------------------------------------------
class PromptTokenizer(Protocol):
    name: str
    bos_id: int

    def encode(self, text: str) -> list[int]: ...


def tokenize_prompt(
    tok: PromptTokenizer, prompt: str, max_len: int, state: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """openpi's ``PaligemmaTokenizer.tokenize``, right-padded (0) to ``max_len`` and cut there.

    PI0: BOS + cleaned prompt + "\\n". With ``state`` (the normalized state, for checkpoints that read
    it as text, openpi's ``discrete_state_input``): BOS + "Task: <prompt>, State: <bins>;\\nAction: ", each
    dim one of 256 bins over [-1, 1]."""
    cleaned = prompt.strip().replace("_", " ").replace("\n", " ")
    if state is not None:
        bins = np.digitize(state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
        text = f"Task: {cleaned}, State: {' '.join(map(str, bins))};\nAction: "
        ids = ([tok.bos_id] + tok.encode(text))[:max_len]
    else:
        ids = ([tok.bos_id] + tok.encode(cleaned) + tok.encode("\n"))[:max_len]
    tokens = np.zeros(max_len, dtype=np.int64)
    mask = np.zeros(max_len, dtype=bool)
    tokens[: len(ids)] = ids
    mask[: len(ids)] = True
    return tokens, mask
