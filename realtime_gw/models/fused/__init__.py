"""Fused Triton kernels for the small decoders (the Qwen3-TTS code predictor, the PI0 / π0.5 action
expert), imported lazily: the gateway runs without Triton, and the eager paths stay the reference.

``ops`` holds the kernels; ``qwen3_frame`` and ``pi0_expert`` build a model's layers from them.
"""

from __future__ import annotations

import importlib.util
import os

import torch


def triton_importable() -> bool:
    """Whether the ``triton`` package is installed (without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreted() -> bool:
    """Whether Triton runs its kernels through its interpreter (``TRITON_INTERPRET=1``: CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def available(device: torch.device | str) -> bool:
    """Whether the fused kernels can run on ``device``: a CUDA device with Triton installed, or any
    device under Triton's interpreter (the CPU tests)."""
    if not triton_importable():
        return False
    return interpreted() or torch.device(device).type == "cuda"


def resolve(setting: bool, device: torch.device | str) -> bool:
    """A ``*_fused`` setting on ``device``: on when asked for, on CUDA, with Triton installed. Never on
    the CPU, even under the interpreter (which only the kernels' tests ask for, by argument): there the
    eager path is the fast one."""
    return setting and torch.device(device).type == "cuda" and triton_importable()
