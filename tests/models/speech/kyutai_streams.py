"""Kyutai ASR test helpers: speech-like PCM, transformers' reference tokens for it, and a driver that runs
many streams through a backend step by step as a worker would (one 80 ms frame pushed per step each)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from realtime_gw.models.runtime import END_OF_INPUT
from realtime_gw.models.speech.asr_kyutai import KyutaiAsrBackend
from realtime_gw.models.speech.kyutai.checkpoint import KyutaiCheckpoint
from realtime_gw.models.speech.kyutai.config import FRAME_SAMPLES
from realtime_gw.records.voice import AsrStreamRequest


def speechlike(seed: int, frames: float) -> np.ndarray:
    """PCM16 noise with a moving envelope (so codes change frame to frame); ``frames`` may be fractional."""
    rng = np.random.default_rng(seed)
    n = int(frames * FRAME_SAMPLES)
    env = 0.2 + 0.8 * np.abs(np.sin(np.linspace(0, 3 * np.pi, n)))
    return (rng.standard_normal(n) * 6000 * env).clip(-32768, 32767).astype(np.int16)


def reference_tokens(ck: KyutaiCheckpoint, pcm: np.ndarray) -> list[int]:
    """``generate`` on the audio padded as the reference's feature extractor pads it; BOS dropped."""
    audio = np.concatenate([pcm, np.zeros(ck.timing.flush_samples, np.int16)]).astype(np.float32) / 32768
    with torch.no_grad():
        out = ck.model.generate(input_values=torch.from_numpy(audio)[None, None])
    return out[0, 1:].tolist()


@dataclass
class Turn:
    """One stream: opens at worker step ``start``, pushes one frame of ``pcm`` per step (the last may be
    partial), then END_OF_INPUT the step after; or is cancelled (released) at step ``cancel_at``."""

    pcm: np.ndarray
    start: int = 0
    cancel_at: int | None = None
    # filled by drive()
    tokens: list[int] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    """The stream's slot after each of its steps (catch-up moves streams)."""
    end_step: int | None = None
    final_step: int | None = None
    frames_left_at_end: int | None = None
    """Frames the stream had yet to step when its END_OF_INPUT arrived (flush included)."""
    end_to_final_s: float | None = None
    """Wall time from the start of the step that took END_OF_INPUT to the end of the step that gave the
    final (the worker steps themselves: no waiting for a step in flight)."""


def drive(backend: KyutaiAsrBackend, turns: list[Turn], max_steps: int = 500) -> None:
    """Worker steps until every turn has its final transcript or was cancelled; fills each turn's record."""
    open_: dict[int, Any] = {}
    chunks: dict[int, list[Any]] = {}
    finished: set[int] = set()
    ended_at: dict[int, float] = {}
    for step in range(max_steps):
        t_step = time.perf_counter()
        for k, turn in enumerate(turns):
            if turn.start == step:
                open_[k] = backend.open(AsrStreamRequest(sample_rate=24000))
                data = turn.pcm.astype("<i2").tobytes()
                frame = 2 * FRAME_SAMPLES
                chunks[k] = [data[i : i + frame] for i in range(0, len(data), frame)] + [END_OF_INPUT]
            if turn.cancel_at == step and k in open_:
                backend.release(open_.pop(k))
                finished.add(k)
        work, keys = [], []
        for k, state in open_.items():
            inputs = chunks[k][:1]
            del chunks[k][:1]
            if inputs and inputs[0] is END_OF_INPUT:
                turn = turns[k]
                turn.end_step = step
                audio = len(turn.pcm) + backend.timing.prefix_samples
                total = (audio + backend.flush_samples) // FRAME_SAMPLES - 1
                turn.frames_left_at_end = total - state.steps
                ended_at[k] = t_step
            if inputs or backend.has_work(state):
                work.append((state, inputs))
                keys.append(k)
        for k, (state, _), result in zip(keys, work, backend.step(work), strict=True):
            turn = turns[k]
            turn.outputs += result.outputs
            turn.slots.append(state.slot)
            assert result.error is None, result.error
            if result.done:
                turn.final_step, turn.tokens = step, list(state.tokens)
                turn.end_to_final_s = time.perf_counter() - ended_at[k]
                backend.release(open_.pop(k))
                finished.add(k)
        for k, state in open_.items():
            turns[k].tokens = list(state.tokens)
        if len(finished) == len(turns):
            return
    raise AssertionError(f"streams still open after {max_steps} steps")
