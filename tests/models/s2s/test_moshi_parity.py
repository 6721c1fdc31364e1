"""Moshi against Kyutai's own ``moshi`` package (``moshi==0.2.13``) on the tiny shape, same weights: the
LM's per-frame logits against ``LMModel.forward`` teacher-forced, greedy tokens against ``LMGen``
streaming, Mimi codes against its ``MimiModel``, and the whole frame (encode, LM, decode) end to end.
The tiny context is 6 frames: every run here wraps the ring several times."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from realtime_gw.models.s2s.engine import MoshiEngine
from realtime_gw.models.s2s.lm import MoshiLmRuntime
from realtime_gw.models.s2s.sampling import Sampler
from realtime_gw.models.speech.kyutai.encoder import StreamingMimiEncoder
from tests.models.s2s.moshi_reference import LMGen, Reference, reference

GREEDY = Sampler(0.0, 0)
STEPS = 20  # > 3 contexts


@pytest.fixture(scope="module")
def ref() -> Reference:
    return reference()


@dataclass
class TeacherForcing:
    """Samples nothing: records the logits of each (step, channel) and answers the teacher's token."""

    token: Callable[[int, int], int]
    logits: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)

    def __call__(self, logits: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor, channel: int) -> torch.Tensor:
        step = int(steps[0])
        self.logits[(step, channel)] = logits[0].detach().float().clone()
        return torch.tensor([self.token(step, channel)])


def _active() -> torch.Tensor:
    return torch.ones(1, dtype=torch.bool)


@torch.no_grad()
def test_per_frame_logits_match_lmmodel_forward_teacher_forced(ref: Reference) -> None:
    shape = ref.checkpoint.shape
    gen = torch.Generator().manual_seed(3)
    codes = torch.cat([
        torch.randint(0, shape.text_card, (1, 1, STEPS), generator=gen),
        torch.randint(0, shape.card, (1, shape.n_q, STEPS), generator=gen),
    ], dim=1)  # fmt: skip
    out = ref.lm.forward(codes)
    delays = shape.delays

    def teacher(step: int, channel: int) -> int:
        t = step - delays[channel]  # the model's streams: what the frame at t holds
        return int(codes[0, channel, t]) if t >= 0 else 0

    forcing = TeacherForcing(teacher)
    rt = MoshiLmRuntime(ref.checkpoint.weights, shape, 1, forcing, forcing)  # type: ignore[arg-type]
    nm = shape.dep_q + 1
    for o in range(STEPS):
        user = codes[0, nm:, o - 1] if o else torch.zeros(shape.dep_q, dtype=torch.long)  # heard at step o
        rt.step(1, rt.columns, user[None], _active())
    compared = 0
    for o in range(STEPS):
        torch.testing.assert_close(forcing.logits[(o, 0)], out.text_logits[0, 0, o].float(), atol=2e-4, rtol=1e-4)
        for j in range(shape.dep_q):
            t = o - delays[1 + j]
            if t >= 0 and bool(out.mask[0, j, t]):
                torch.testing.assert_close(forcing.logits[(o, 1 + j)], out.logits[0, j, t].float(), atol=2e-4, rtol=1e-4)
                compared += 1
    assert compared == STEPS * shape.dep_q - sum(delays[1 : 1 + shape.dep_q])  # all but a delayed one's first


def _lmgen_frames(ref: Reference, user: torch.Tensor) -> list[torch.Tensor]:
    gen = LMGen(ref.lm, use_sampling=False)
    frames = []
    with gen.streaming(1):
        for o in range(user.shape[0]):
            out = gen.step(user[o][None, :, None])
            if out is not None:
                frames.append(out[0, :, 0].clone())
    return frames


@torch.no_grad()
def test_greedy_tokens_match_lmgen_streaming(ref: Reference) -> None:
    shape = ref.checkpoint.shape
    user = torch.randint(0, shape.card, (STEPS, shape.dep_q), generator=torch.Generator().manual_seed(4))
    expected = _lmgen_frames(ref, user)
    rt = MoshiLmRuntime(ref.checkpoint.weights, shape, 1, GREEDY, GREEDY)
    got = []
    for o in range(STEPS):
        frame, valid = rt.step(1, rt.columns, user[o][None], _active())
        if bool(valid[0]):
            got.append(frame[0].clone())
    assert len(got) == len(expected) == STEPS - shape.max_delay
    assert torch.stack(got).tolist() == torch.stack(expected).tolist()


def _speech_like(frames: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(frames * 1920) / 24000
    tone = np.sin(2 * np.pi * (180 + 60 * np.sin(2 * np.pi * 1.3 * t)) * t) * 8000
    return (tone + rng.standard_normal(t.shape) * 1500).clip(-32768, 32767).astype(np.int16)


@torch.no_grad()
def test_mimi_codes_match_its_mimimodel(ref: Reference) -> None:
    frames = 14  # 28 encoder-transformer positions over a 5-position window
    pcm = _speech_like(frames, 5)
    x = torch.from_numpy(pcm.astype(np.float32) / 32768.0)
    expected = ref.mimi.encode(x[None, None])[0]  # (8, frames)
    enc = StreamingMimiEncoder(ref.checkpoint.mimi, 1, ref.checkpoint.shape.dep_q)
    got = [enc.step(1, x[i * 1920 : (i + 1) * 1920][None], _active())[0] for i in range(frames)]
    assert torch.stack(got, dim=1).tolist() == expected.tolist()


@torch.no_grad()
def test_a_whole_frame_matches_mimi_lmgen_mimi_greedy(ref: Reference) -> None:
    """The engine's frame (encode, LM, decode) against Kyutai's pipeline as its server runs it."""
    shape, ck = ref.checkpoint.shape, ref.checkpoint
    pcm = _speech_like(STEPS, 6)
    x = torch.from_numpy(pcm.astype(np.float32) / 32768.0)
    user = ref.mimi.encode(x[None, None])[0].T  # (STEPS, 8)
    expected = torch.stack(_lmgen_frames(ref, user))  # (STEPS - 1, 9)
    voice = ref.mimi.decode(expected[:, 1:].T[None])[0, 0]  # the model's voice, frames 1.. of the stream
    engine = MoshiEngine(ck.weights, ck.mimi, shape, 2, text=GREEDY, audio=GREEDY, cuda_graphs=False)
    slot = engine.alloc_seeded(0)
    tokens, out = [], []
    for o in range(STEPS):
        frame, valid, audio = engine.step([slot], pcm[o * 1920 : (o + 1) * 1920][None], [False])
        assert bool(valid[0]) == (o >= shape.max_delay)
        if valid[0]:
            tokens.append(frame[0])
            out.append(audio[0])
        else:
            assert not audio.any()  # the first step has no frame yet: silence
    assert np.stack(tokens).tolist() == expected.tolist()
    ours = np.concatenate(out).astype(np.float32) / 32768.0
    np.testing.assert_allclose(ours, voice.numpy().clip(-1, 1), atol=3 / 32768)
