"""Conversations stepped through a speech-to-speech backend directly (no stage worker): the shared
driver of the Moshi and PersonaPlex backend tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from realtime_gw.records.s2s import S2sAudio, S2sFrame, S2sOpen

FRAME = 1920
"""Samples in one 80 ms frame at 24 kHz."""


def noise_frames(seed: int, frames: int) -> list[S2sAudio]:
    """``frames`` 80 ms frames of loud noise, the same for a seed."""
    rng = np.random.default_rng(seed)
    pcm = (rng.standard_normal(frames * FRAME) * 4000).astype("<i2")
    return [S2sAudio(pcm[i * FRAME : (i + 1) * FRAME].tobytes()) for i in range(frames)]


def talk(
    backend: Any, plan: dict[str, tuple[S2sOpen, int, int]], steps: int, audio: dict[str, list[S2sAudio]]
) -> dict[str, list[S2sFrame]]:
    """``plan``: name -> (opening, first step, last step): each conversation opens at its first step
    (between two steps of the others) and is released after its last, hearing one frame of its
    ``audio`` per step (its first frame at its first step); every frame each one said."""
    states: dict[str, Any] = {}
    frames: dict[str, list[S2sFrame]] = {name: [] for name in plan}
    try:
        for t in range(steps):
            for name, (request, first, _) in plan.items():
                if t == first:
                    states[name] = backend.open(request)
            work = [(st, [audio[n][t - plan[n][1]]]) for n, st in states.items()]
            for n, result in zip(states, backend.step(work), strict=True):
                assert result.error is None
                frames[n] += result.outputs
            for name, (_, _, last) in plan.items():
                if t == last:
                    backend.release(states.pop(name))
    finally:
        for st in states.values():
            backend.release(st)
    return frames
