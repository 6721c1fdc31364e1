"""PersonaPlex's session prompt (the voice prompt and the text persona), prefilled in one parallel pass.

NVIDIA's ``LMGen.step_system_prompts`` (github.com/NVIDIA/personaplex, ``moshi/models/lm.py``) steps the
model once per prompt frame before the conversation, every token of every stream given (``provided``):

1. the voice prompt: one frame per 80 ms of the voice sample (Mimi codes, the sample at -24 LUFS) as the
   model's OWN audio streams, its text stream at the padding id 3, the user's streams at the codes of a
   440 Hz sine (``SINE_TOKENS``);
2. 0.5 s of silence (6 frames): the model's streams at the codes of silence (``SILENCE_TOKENS``), text 3,
   the user's the sine;
3. the persona: one frame per SentencePiece token of ``"<system> {persona} <system>"`` in the text stream,
   the model's audio the silence codes, the user's the sine;
4. 6 frames of silence again.

Nothing of those steps is sampled (every output is replaced by the given token), so the prompt is a
teacher-forced sequence known in advance: its columns (each stream at its delay, the start ids where a
column precedes a stream's delay, as the reference's cache holds them) go through the temporal
transformer in ONE causal pass over positions ``[0, P - 1)`` into the slot's ring K/V; the slot then
stands where the reference stands after its last prompt step: position ``P - 1``, the cache holding
column ``P - 1`` (the next input) and the delayed streams' prompt codes of column ``P`` (the model's
``forced``). An empty persona has no persona frames, a session without a voice no voice frames (the
reference always has a voice and crashes on an empty persona; the stage serves both).

A voice as NVIDIA ships it (``voices.tgz``: ``NATF2.pt`` ..., ``VoiceEmbeddings``) is not codes but what
the reference saved while stepping the voice (``save_voice_prompt_embeddings``): the temporal
transformer's input embedding of each voice column but the last, and its token cache after the voice.
Replayed (``step_embeddings``), those embeddings stand for the voice columns' tokens, and the cache gives
the voice's last column and its delayed codes in the next; ``prefill`` takes them in the same one pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from realtime_gw.models.kernels import additive_mask, layers_at_positions, rope_cos_sin
from realtime_gw.models.s2s.lm import MoshiLmRuntime

SILENCE_FRAMES = 6
"""``LMGen.audio_silence_frame_cnt`` as the reference server builds it: ``int(0.5 * frame_rate)``."""
TEXT_PROMPT_PAD = 3
"""``LMGen.zero_text_code``: the text of the voice and silence frames."""
SILENCE_TOKENS = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
"""The published Mimi's codes of a silent frame (``lm.SILENCE_TOKENS``)."""
SINE_TOKENS = (430, 1268, 381, 1611, 1095, 1495, 56, 472)
"""The published Mimi's codes of a frame of 440 Hz sine at amplitude 0.5 (``lm.SINE_TOKENS``)."""
SINE_HZ, SINE_AMPLITUDE = 440.0, 0.5


@dataclass(frozen=True)
class VoiceEmbeddings:
    """A published voice (``NAME.pt``: ``{"embeddings": (V - 1, 1, 1, dim), "cache": (1, streams, ct)}``)."""

    embeddings: torch.Tensor
    """``(V - 1, dim)``: the input of the voice's columns ``[0, V - 1)``."""
    cache: torch.Tensor
    """``(streams, ct)``: the reference's token cache after the voice's ``V`` steps (column c at c % ct)."""

    @property
    def frames(self) -> int:
        return int(self.embeddings.shape[0]) + 1


def system_text(persona: str) -> str:
    """``server.wrap_with_system_tags``: the persona between ``<system>`` tags (kept if already there)."""
    cleaned = persona.strip()
    if cleaned.startswith("<system>") and cleaned.endswith("<system>"):
        return cleaned
    return f"<system> {cleaned} <system>"


def prompt_frames(
    voice: np.ndarray | None, persona_tokens: Sequence[int], silence: Sequence[int], sine: Sequence[int]
) -> np.ndarray:
    """The prompt as frames ``(P, 1 + 2 q)``: text, the model's q codes, the user's q codes per frame.
    ``voice``: ``(F, q)`` Mimi codes of the voice sample or None."""
    q = len(silence)
    rows: list[np.ndarray] = []

    def frames(text: Sequence[int], own: np.ndarray) -> None:
        n = len(text)
        block = np.empty((n, 1 + 2 * q), np.int64)
        block[:, 0] = text
        block[:, 1 : 1 + q] = own
        block[:, 1 + q :] = np.asarray(sine)[None]
        rows.append(block)

    quiet = np.asarray(silence, np.int64)[None]
    if voice is not None and len(voice):
        frames([TEXT_PROMPT_PAD] * len(voice), np.asarray(voice, np.int64))
    frames([TEXT_PROMPT_PAD] * SILENCE_FRAMES, quiet)
    if persona_tokens:
        frames(list(persona_tokens), quiet)
    frames([TEXT_PROMPT_PAD] * SILENCE_FRAMES, quiet)
    return np.concatenate(rows)


def prompt_columns(frames: torch.Tensor, delays: Sequence[int], initial: torch.Tensor) -> torch.Tensor:
    """The reference's cache columns ``[0, P]`` of a prompt of ``P`` frames ``(P, streams)``: stream k at
    column c holds frame ``c - delay_k``, or its start id while ``c <= delay_k`` (frame 0 is never read,
    as in the reference). Column ``P`` holds only the delayed streams' last frame (others: start ids)."""
    p, streams = frames.shape
    cols = initial[None].expand(p + 1, streams).clone()
    for k, d in enumerate(delays):
        c = torch.arange(d + 1, min(p + d, p + 1), device=frames.device)
        cols[c, k] = frames[c - d, k]
    return cols


@torch.no_grad()
def prefill(lm: MoshiLmRuntime, slot: int, frames: torch.Tensor, voice: VoiceEmbeddings | None = None) -> None:
    """Write the prompt ``frames (P, 1 + n_q)`` into ``slot`` (freshly reset): the ring K/V of positions
    ``[0, P - 1)`` in one pass, the token cache and the forced codes of the next column. ``voice``: a
    published voice whose ``frames`` lead the prompt (their codes in ``frames`` are placeholders)."""
    shape = lm.shape
    p = frames.shape[0]
    ring = lm.ring
    if p < 2:
        raise ValueError("a prompt has at least two frames")
    if p - 1 > ring.window:
        raise ValueError(f"the prompt is {p} frames; the model's context is {ring.window}")
    if int(lm.pos[slot]) != 0:
        raise RuntimeError(f"slot {slot} is not fresh (position {int(lm.pos[slot])})")
    cols = prompt_columns(frames.to(lm.device), shape.delays, lm.initial)
    s = p - 1
    if voice is not None:  # its last column, and its delayed codes in the next, from its saved cache
        v, ct_ref = voice.frames, voice.cache.shape[1]
        if not 2 <= v < p:
            raise ValueError(f"a published voice of {v} frames in a prompt of {p}")
        cache = voice.cache.to(lm.device)
        cols[v - 1] = cache[:, (v - 1) % ct_ref]
        delayed = lm.delays > 0
        cols[v, delayed] = cache[delayed, v % ct_ref]
    x = lm.embed(cols[:s])[None, :, 0]  # (1, S, dim)
    if voice is not None:
        x[0, : voice.frames - 1] = voice.embeddings.to(device=lm.device, dtype=x.dtype)
    qpos = torch.arange(s, device=lm.device)[None]  # (1, S)
    ring.kpos[slot, :s] = qpos[0]  # one pass does not wrap: S <= window < ring columns
    kp = ring.kpos[slot : slot + 1, None, :s]
    mask = (kp >= 0) & (kp <= qpos[:, :, None])
    l0 = ring.layers[0]
    mask_add = additive_mask(mask, l0.kv_heads, l0.heads // l0.kv_heads, x.dtype)
    cos, sin = rope_cos_sin(qpos, ring.inv_freq, ring.rope_scale, x.dtype)
    keys = [k[slot : slot + 1] for k in ring.k_ring]
    values = [v[slot : slot + 1] for v in ring.v_ring]
    scales = None  # an FP8 ring: the slot's rows of its per-column scales are written beside the K/V
    if ring.scales is not None:
        scales = ([t[slot : slot + 1] for t in ring.scales[0]], [t[slot : slot + 1] for t in ring.scales[1]])
    layers_at_positions(ring.layers, x, cos[:, :, None], sin[:, :, None], keys, values, qpos, s, mask_add, scales)
    ring.pos[slot] = s
    ct = lm.cache.shape[2]
    lm.cache[slot, :, (s % ct)] = cols[s]
    lm.cache[slot, :, (p % ct)] = cols[p]
    nm = shape.own_q + 1
    delayed = lm.delays[:nm] > 0  # the model's streams whose prompt frame P - 1 sits in column P
    lm.forced[slot, :, p % ct] = delayed
