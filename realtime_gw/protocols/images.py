"""openpi's image conventions, pure (NumPy and PIL): what a robot may send, and the resize every model sees.

openpi's policies accept a camera frame as uint8 in 0..255 or float in [0, 1], channels last (H, W, 3)
or first (3, H, W) — LeRobot datasets store float32 (C, H, W) — and convert it to uint8 (H, W, 3)
(``_parse_image`` in ``src/openpi/policies/droid_policy.py``: ``(255 * image).astype(np.uint8)``,
channels first when ``shape[0] == 3``). Every image is then resized to the model's size with the aspect
ratio kept and black padding (``openpi_client.image_tools.resize_with_pad``, PIL bilinear). Both are
here, byte for byte as openpi computes them; ``to_uint8_hwc`` runs in the session (cheap: a view and at
most one cast), ``resize_with_pad`` on the policy worker's thread (a few ms per large frame).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image


class ImageFormatError(ValueError):
    """The frame is not an image openpi would accept; the message says what to send instead."""


def to_uint8_hwc(name: str, value: Any, max_side: int) -> np.ndarray:
    """A camera frame as openpi takes it -> uint8 (H, W, 3), without resizing: channels first when
    ``shape[0] == 3`` (openpi's DROID and LIBERO rule; its ALOHA policy takes channels first only, and a
    channels-last ALOHA frame is accepted here too). Floats must be finite and in [0, 1]."""
    if not isinstance(value, np.ndarray):
        raise ImageFormatError(
            f"{name!r} must be an image array, uint8 (H, W, 3) or (3, H, W), got {type(value).__name__}"
        )
    if value.dtype != np.uint8 and value.dtype.kind != "f":
        raise ImageFormatError(
            f"{name!r} must be uint8 (0..255) or float (0..1), got {value.dtype} (shape {value.shape})"
        )
    if value.ndim != 3:
        raise ImageFormatError(f"{name!r} must have shape (H, W, 3) or (3, H, W), got {value.shape}")
    chw = value.shape[0] == 3
    if not chw and value.shape[2] != 3:
        raise ImageFormatError(f"{name!r} must have shape (H, W, 3) or (3, H, W), got {value.shape}")
    img = value.transpose(1, 2, 0) if chw else value
    h, w = img.shape[:2]
    if not (0 < h <= max_side and 0 < w <= max_side):
        raise ImageFormatError(f"{name!r} is {h}x{w}; each side must be between 1 and {max_side}")
    if img.dtype.kind == "f":
        lo, hi = float(img.min()), float(img.max())
        if not (np.isfinite(lo) and np.isfinite(hi) and lo >= 0.0 and hi <= 1.0):
            raise ImageFormatError(
                f"{name!r} is a float image with values in [{lo:g}, {hi:g}]; float images must be in [0, 1] "
                "(send uint8 for 0..255)"
            )
        img = (255 * img).astype(np.uint8)  # openpi truncates, it does not round
    return img


def resize_with_pad(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 (H, W, 3) -> uint8 (height, width, 3): fit inside with the aspect kept (PIL bilinear), centred on
    black. The same bytes as ``openpi_client.image_tools.resize_with_pad``; a frame already that size is
    returned as is."""
    cur_h, cur_w = img.shape[:2]
    if (cur_h, cur_w) == (height, width):
        return img
    ratio = max(cur_w / width, cur_h / height)
    # (at least one pixel: openpi would fail on a 1-pixel-high panorama; nothing else differs)
    new_h, new_w = max(1, int(cur_h / ratio)), max(1, int(cur_w / ratio))
    resized = Image.fromarray(np.ascontiguousarray(img)).resize((new_w, new_h), resample=Image.BILINEAR)
    canvas = Image.new(resized.mode, (width, height), 0)
    canvas.paste(resized, (max(0, int((width - new_w) / 2)), max(0, int((height - new_h) / 2))))
    return np.array(canvas)
