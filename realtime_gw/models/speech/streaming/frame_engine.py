"""The engine contract of the frame-per-step TTS backends (``tts_base.FrameTtsLoop``).

Torch-free, so ``tts_base`` stays light; ``streaming.slot_engine.SlotEngine`` (the Mimi codec LM's and
Qwen3-TTS's engines) satisfies it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class FrameEngine(Protocol):
    """What ``FrameTtsLoop`` asks of its engine (``streaming.slot_engine.SlotEngine``: the Mimi codec LM's and
    Qwen3-TTS's): fixed slots on one device, each advanced one 80 ms frame per ``step``."""

    pipelined: bool
    """Whether a frame's decoding runs behind the next frame's talker (``launch``/``flush``/``take``)."""
    max_positions: int
    """Frames one slot holds: a stream ends at its slot's last frame."""
    frames: list[int]
    """Frames each slot has made so far."""

    @property
    def graph_count(self) -> int: ...

    def capture_all(self) -> float:
        """Capture every CUDA graph bucket; the seconds it took (0 when it runs without graphs)."""
        ...

    def step(self, slots: Sequence[int], tokens: Sequence[int], eos_ok: Sequence[bool]) -> tuple[Any, Any]:
        """One frame for every listed slot: (codes ``[n, codebooks]``, PCM16 ``[n, 1920]``)."""
        ...

    def launch(self, slots: Sequence[int], tokens: Sequence[int], eos_ok: Sequence[bool]) -> Any:
        """Pipelined ``step``: the frame's codes now, its PCM for ``take`` after the next launch/flush."""
        ...

    def flush(self) -> None:
        """Wait for the frame being decoded: its PCM is ready for ``take``."""
        ...

    def take(self, slot: int) -> Any:
        """The oldest decoded PCM16 frame of ``slot`` not taken yet (None: none)."""
        ...

    def free(self, slot: int) -> None: ...
