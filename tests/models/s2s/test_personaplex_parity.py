"""PersonaPlex against its architecture reference (``personaplex_reference.py``: NVIDIA's ``LMGen`` ported
over Kyutai's ``LMModel`` at 16 depformer sub-steps), tiny shape, float32 on the CPU, same weights:

- the prompt prefilled in one pass writes the ring the same prompt stepped frame by frame writes;
- after the prompt (a voice and a persona), greedy tokens match the reference stepping the prompt frame by
  frame and then the conversation, over a context that wraps;
- the 16-sub-step depformer's logits match ``LMModel.forward_depformer_training`` teacher-forced, and the
  serving step's 8 sub-steps are the first 8 of them;
- the published layout loads strictly, every sub-step's tensors included.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from realtime_gw.models.s2s.checkpoint import LM_FILE
from realtime_gw.models.s2s.config import personaplex_tiny
from realtime_gw.models.s2s.lm import MoshiLmRuntime
from realtime_gw.models.s2s.personaplex import PersonaPlexBackend
from realtime_gw.models.s2s.prompt import (
    SILENCE_FRAMES,
    VoiceEmbeddings,
    prefill,
    prompt_columns,
    prompt_frames,
)
from realtime_gw.models.s2s.sampling import Sampler
from realtime_gw.models.s2s.voices import VoicePrompts
from realtime_gw.records.s2s import S2sOpen
from tests.models.s2s.moshi_reference import Reference, reference, save_published
from tests.models.s2s.personaplex_reference import PersonaPlexGen

GREEDY = Sampler(0.0, 0)
SHAPE = replace(personaplex_tiny(), context=24)
VOICE_FRAMES, PERSONA_TOKENS, STEPS = 5, 4, 40  # a prompt of 21 frames, then > 1.5 contexts


@pytest.fixture(scope="module")
def ref() -> Reference:
    return reference(SHAPE)


def _prompt(seed: int) -> tuple[np.ndarray, list[int], tuple[int, ...], tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    voice = rng.integers(0, SHAPE.card, (VOICE_FRAMES, SHAPE.own_q))
    persona = [int(t) for t in rng.integers(4, SHAPE.text_card, PERSONA_TOKENS)]
    silence = tuple(int(c) for c in rng.integers(0, SHAPE.card, SHAPE.own_q))
    sine = tuple(int(c) for c in rng.integers(0, SHAPE.card, SHAPE.own_q))
    return voice, persona, silence, sine


def _runtime(ref: Reference, slots: int, kv_dtype: torch.dtype | None = None) -> MoshiLmRuntime:
    return MoshiLmRuntime(ref.checkpoint.weights, SHAPE, slots, GREEDY, GREEDY, user_lead=1, kv_dtype=kv_dtype)


def _dequantized(ring: torch.Tensor, scales: list[torch.Tensor] | None, i: int) -> torch.Tensor:
    """Layer ``i``'s ring as float (an FP8 ring times its per-column scales)."""
    return ring.float() * scales[i][..., None] if scales is not None else ring.float()


@torch.no_grad()
@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn], ids=["model", "fp8"])
def test_prompt_prefilled_in_one_pass_writes_the_ring_of_the_prompt_stepped_frame_by_frame(
    ref: Reference, kv_dtype: torch.dtype | None
) -> None:
    lm = _runtime(ref, 2, kv_dtype)
    lm.reset(torch.tensor([0, 1]))
    voice, persona, silence, sine = _prompt(1)
    frames = torch.from_numpy(prompt_frames(voice, persona, silence, sine))
    p = frames.shape[0]
    prefill(lm, 1, frames)
    cols = prompt_columns(frames, SHAPE.delays, lm.initial)
    active = torch.ones(1, dtype=torch.bool)
    for t in range(p - 1):  # slot 0: one position a step, as the reference's steps write it
        lm.ring(lm.embed(cols[t : t + 1]), 1, active)
    ring = lm.ring
    assert int(ring.pos[0]) == int(ring.pos[1]) == p - 1
    assert torch.equal(ring.kpos[0], ring.kpos[1])
    ks, vs = ring.scales if ring.scales is not None else (None, None)
    tol = 1e-5 if kv_dtype is None else 0.07  # FP8: one e4m3 step (2^-3 relative) either side of a rounding
    for i in range(len(ring.k_ring)):
        for cache, scales in ((ring.k_ring, ks), (ring.v_ring, vs)):
            kv = _dequantized(cache[i], scales, i)
            torch.testing.assert_close(kv[1, :, : p - 1], kv[0, :, : p - 1], rtol=tol, atol=tol)


@torch.no_grad()
def test_greedy_tokens_after_a_voice_and_persona_match_the_reference_stepping_them(ref: Reference) -> None:
    voice, persona, silence, sine = _prompt(2)
    user = torch.randint(0, SHAPE.card, (STEPS, SHAPE.own_q), generator=torch.Generator().manual_seed(5))
    want = []
    with PersonaPlexGen(ref.lm, silence, sine) as gen:
        gen.step_system_prompts(torch.from_numpy(voice), persona)
        for t in range(STEPS):
            out = gen.step(input_tokens=user[t].view(1, -1, 1))
            assert out is not None
            want.append(out[0, : SHAPE.own_q + 1, 0])
    lm = _runtime(ref, 3)
    lm.reset(torch.arange(3))
    prefill(lm, 0, torch.from_numpy(prompt_frames(voice, persona, silence, sine)))
    active = torch.ones(1, dtype=torch.bool)
    for t in range(STEPS):
        frame, valid = lm.step(1, lm.columns, user[t][None], active)
        assert bool(valid[0])
        assert frame[0].tolist() == want[t].tolist(), f"step {t}"
    assert int(lm.pos[0]) > SHAPE.context  # the ring wrapped


@torch.no_grad()
def test_a_published_voice_file_prefills_what_its_codes_prefill(ref: Reference, tmp_path: Path) -> None:
    """A voice as NVIDIA ships it (``NAME.pt``, saved by the fork's ``save_voice_prompt_embeddings`` while it
    steps the voice's codes): read by the voice store, prefilled, the conversation's greedy tokens are the
    reference's stepping those codes."""
    voice, persona, silence, sine = _prompt(3)
    user = torch.randint(0, SHAPE.card, (12, SHAPE.own_q), generator=torch.Generator().manual_seed(8))
    want = []
    with PersonaPlexGen(ref.lm, silence, sine) as gen:
        saved = gen.step_system_prompts(torch.from_numpy(voice), persona, save_voice=True)
        for t in range(len(user)):
            out = gen.step(input_tokens=user[t].view(1, -1, 1))
            assert out is not None
            want.append(out[0, : SHAPE.own_q + 1, 0].tolist())
    assert saved is not None and saved["embeddings"].shape == (VOICE_FRAMES - 1, 1, 1, SHAPE.dim)
    torch.save(saved, tmp_path / "NATF2.pt")
    published = VoicePrompts.open(tmp_path, _no_encoding, SHAPE).prompt("NATF2")
    assert isinstance(published, VoiceEmbeddings) and published.frames == VOICE_FRAMES
    lm = _runtime(ref, 1)
    lm.reset(torch.arange(1))
    placeholders = np.zeros_like(voice)  # the voice's codes are in its embeddings and cache only
    prefill(lm, 0, torch.from_numpy(prompt_frames(placeholders, persona, silence, sine)), published)
    active = torch.ones(1, dtype=torch.bool)
    got = [lm.step(1, lm.columns, user[t][None], active)[0][0].tolist() for t in range(len(user))]
    assert got == want


def _no_encoding(pcm: np.ndarray) -> np.ndarray:
    raise AssertionError("a published voice is not encoded")


def test_a_file_that_is_not_a_voice_is_refused_by_name(tmp_path: Path) -> None:
    torch.save({"embeddings": torch.zeros(3, 1, 1, SHAPE.dim + 1), "cache": torch.zeros(1, 17, 4)}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match=r"x.pt: embeddings \(3, 1, 1, 65\) are not"):
        VoicePrompts.open(tmp_path, _no_encoding, SHAPE)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="expected the keys 'embeddings' and 'cache'"):
        VoicePrompts.open(tmp_path, _no_encoding, SHAPE)


class Recorder:
    """A sampler that records each sub-step's logits and answers its argmax."""

    def __init__(self) -> None:
        self.logits: dict[int, torch.Tensor] = {}

    def __call__(self, logits: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor, channel: int) -> torch.Tensor:
        self.logits[channel] = logits[0].clone()
        return logits.argmax(dim=-1)


@torch.no_grad()
def test_sixteen_sub_step_depformer_matches_the_teacher_forced_forward(ref: Reference) -> None:
    frames = 4
    gen = torch.Generator().manual_seed(6)
    seq = torch.cat([
        torch.randint(0, SHAPE.text_card, (1, 1, frames), generator=gen),
        torch.randint(0, SHAPE.card, (1, SHAPE.n_q, frames), generator=gen),
    ], dim=1)  # fmt: skip
    h = torch.randn(1, frames, SHAPE.dim, generator=gen)
    want = ref.lm.forward_depformer_training(seq, h)  # (1, 16, T, card)
    lm = _runtime(ref, 1)
    zero = torch.zeros(1, dtype=torch.long)
    for t in range(frames):
        full, part = Recorder(), Recorder()
        lm.depformer.sampler = full
        codes = lm.depformer(1, h[:, t : t + 1], seq[:, 0, t], zero, zero, seq[:, 1:, t])
        assert codes.shape == (1, SHAPE.dep_q) and torch.equal(codes[0], seq[0, 1:, t])
        for s in range(SHAPE.dep_q):
            torch.testing.assert_close(full.logits[1 + s], want[0, s, t], rtol=1e-4, atol=1e-4)
        lm.depformer.sampler = part
        mine = lm.depformer(1, h[:, t : t + 1], seq[:, 0, t], zero, zero, seq[:, 1:, t], SHAPE.own_q)
        assert mine.shape == (1, SHAPE.own_q) and sorted(part.logits) == list(range(1, SHAPE.own_q + 1))
        for s in range(SHAPE.own_q):
            torch.testing.assert_close(part.logits[1 + s], full.logits[1 + s])


def test_the_published_layout_loads_strictly_with_its_sixteen_sub_steps(ref: Reference, tmp_path: Path) -> None:
    """A file with every sub-step (``linears.15`` ...) loads as published, persona text through its
    SentencePiece model; a file without sub-steps 8..15 is refused by name (NVIDIA's loader would copy
    them from 0..7)."""
    save_published(ref, tmp_path)
    backend = PersonaPlexBackend(path=str(tmp_path), slots=1, temperature=0, text_temperature=0)
    ck = backend.checkpoint
    assert not ck.random_init and ck.shape.dep_q == 16 and backend.info["prompt_codes"] == "this codec's"
    for name in ("linears.15.weight", "depformer_emb.14.weight", "depformer.layers.0.gating.15.linear_in.weight"):
        assert torch.equal(ck.weights[name], ref.checkpoint.weights[name])
    persona = backend.checkpoint.text.encode("<system> w3x w4x <system>", SHAPE.text_card)  # SentencePiece's
    assert len(backend.prompt(S2sOpen(persona="w3x w4x"))[0]) == 2 * SILENCE_FRAMES + len(persona) > 2 * SILENCE_FRAMES
    lm = load_file(str(tmp_path / LM_FILE))
    save_file({k: v for k, v in lm.items() if not k.startswith(("linears.15", "depformer_in.15"))}, str(tmp_path / LM_FILE))
    with pytest.raises(ValueError, match=r"missing \['depformer_in.15.weight', 'linears.15.weight'\]"):
        PersonaPlexBackend(path=str(tmp_path), slots=1)
