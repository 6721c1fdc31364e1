"""Moshi's LM stepped once per 80 ms frame for many slots at once: ``moshi.models.lm.LMGen.step``, batched.

Per slot, as the reference keeps per batch row: a small token cache of ``max_delay + 2`` columns per
stream (17 streams: the text, the model's 8 codebooks, the user's 8), the step count, and the temporal
transformer's ring K/V (``streaming.layers.RingTransformer``: ``context`` positions seen, each column's
absolute position kept, so the ring forgets and never stops). One step, for rows ``[0, b)``:

1. the user's codes of this frame go into their streams ``delay`` steps ahead;
2. the input of step ``o`` is every stream's token at ``o`` (the start ids while ``o <= delay``): the sum
   of their embeddings;
3. the temporal transformer (one position), its out-norm, the text head: the text token is sampled
   (temperature / top-k of the text);
4. the depformer samples the model's codebooks of the frame from it;
5. both go into the cache at ``o + 1``; the frame that is complete (``o + 1 - max_delay``, each stream
   at its delay) is the output once ``o >= max_delay``.

``silent`` rows (``S2sSilence``) get the text padding id and the codec's silence codes instead of what
was sampled, written into their own context like any token: the model hears itself stay silent.

PersonaPlex (``user_lead = 1``): its ``LMGen.step`` writes the user's frame into the cache and runs the
model on the column before it, so a user frame is read one step after it arrives (the model answers one
80 ms frame later than Moshi; the tokens at each column are the same). Its session starts with a prompt
(``prompt.py``: the voice prompt, the text persona) whose columns are known in advance: ``prefill`` runs
them through the temporal transformer in one pass into the slot's ring and leaves the cache as the
reference's is after its last prompt step, with the model's delayed codebooks of the next column
``forced`` (the prompt's, as the reference's ``provided`` flags keep them).
Inactive rows keep every state (masked writes; the ring writes its scratch column), so shapes are
static and the step records into a CUDA graph.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from realtime_gw.models.s2s.config import MoshiShape
from realtime_gw.models.s2s.layers import Depformer, RmsNormF32, TemporalLayer, Weights
from realtime_gw.models.s2s.sampling import Sampler
from realtime_gw.models.speech.streaming.layers import RingTransformer


def moshi_inv_freq(head_dim: int, max_period: float, device: torch.device) -> torch.Tensor:
    """RoPE frequencies as ``moshi.modules.rope.apply_rope`` computes them."""
    ds = torch.arange(head_dim // 2, device=device, dtype=torch.float32)
    return torch.exp(ds * (-math.log(max_period) * 2 / head_dim))


class MoshiLmRuntime:
    """``step(b, length, user_codes, active)`` -> (frame tokens ``(b, 1 + own_q)``, valid ``(b,)``)."""

    def __init__(
        self, weights: Weights, shape: MoshiShape, slots: int, text: Sampler, audio: Sampler, user_lead: int = 0,
        kv_dtype: torch.dtype | None = None,
    ) -> None:  # fmt: skip
        """``kv_dtype``: the ring K/V's (default the weights' dtype; FP8: e4m3 with per-column scales)."""
        self.shape = shape
        self.user_lead = user_lead
        """Columns ahead of the step's input where the user's frame goes (PersonaPlex: 1)."""
        self.text_sampler = text
        emb = weights["text_emb.weight"]
        dev, dtype = emb.device, emb.dtype
        self.device, self.dtype = dev, dtype
        self.text_table = emb
        self.audio_table = torch.cat([weights[f"emb.{k}.weight"] for k in range(shape.n_q)])
        self.audio_offsets = torch.arange(shape.n_q, device=dev) * (shape.card + 1)
        self.out_norm = RmsNormF32(weights["out_norm.alpha"])
        self.text_linear = weights["text_linear.weight"]
        layers = [TemporalLayer.of(weights, i, shape) for i in range(shape.num_layers)]
        inv_freq = moshi_inv_freq(shape.head_dim, shape.max_period, dev)
        self.ring = RingTransformer(layers, slots, shape.context, 1, inv_freq, 1.0, dev, dtype, kv_dtype)
        self.depformer = Depformer(weights, shape, slots, audio)
        streams = shape.n_q + 1
        self.delays = torch.tensor(shape.delays, device=dev, dtype=torch.long)
        self.initial = torch.tensor(
            [shape.text_card] + [shape.card] * shape.n_q, device=dev, dtype=torch.long
        )
        ct = shape.max_delay + 2 + user_lead
        self.cache = torch.zeros(slots, streams, ct, device=dev, dtype=torch.long)
        self.forced = torch.zeros(slots, shape.own_q + 1, ct, device=dev, dtype=torch.bool)
        """The model's own tokens given, not sampled, at a column (a prompt's last delayed codes)."""
        self.seeds = torch.zeros(slots, device=dev, dtype=torch.long)
        self.silent = torch.zeros(slots, device=dev, dtype=torch.bool)
        self.silence_codes = torch.zeros(shape.own_q, device=dev, dtype=torch.long)
        """The codec's codes of a silent frame (set by the engine from its encoder)."""

    @property
    def pos(self) -> torch.Tensor:
        """Each slot's steps so far (its temporal-transformer position)."""
        return self.ring.pos

    @property
    def columns(self) -> int:
        """Ring columns a step may read (length buckets stop here)."""
        return self.ring.ring

    @torch.no_grad()
    def reset(self, slots: torch.Tensor) -> None:
        self.ring.reset(slots)
        self.cache.index_fill_(0, slots, 0)
        self.forced.index_fill_(0, slots, False)
        self.silent.index_fill_(0, slots, False)

    def slot_tensors(self) -> list[torch.Tensor]:
        return [*self.ring.slot_tensors(), self.cache, self.forced, self.seeds, self.silent]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(b, 1 + n_q)`` stream tokens -> ``(b, 1, dim)``: the text's embedding plus every audio stream's."""
        audio = self.audio_table[tokens[:, 1:] + self.audio_offsets].sum(dim=1)
        return (self.text_table[tokens[:, 0]] + audio)[:, None]

    def step(
        self, b: int, length: int, user_codes: torch.Tensor, active: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shape = self.shape
        nm = shape.own_q + 1  # the text and the model's codebooks
        o = self.ring.pos[:b].clone()
        cache = self.cache[:b]
        ct = cache.shape[2]
        act3 = active[:, None, None]
        # 1. the user's codes, each stream at its delay
        at = ((o[:, None] + self.user_lead + self.delays[None, nm:]) % ct)[..., None]
        user = cache[:, nm:]
        user.scatter_(2, at, torch.where(act3, user_codes[..., None], user.gather(2, at)))
        # 2. this step's input tokens
        now = (o % ct)[:, None, None].expand(b, shape.n_q + 1, 1)
        tokens = cache.gather(2, now)[..., 0]
        start = (o[:, None] <= self.delays[None]) | ~active[:, None]
        tokens = torch.where(start, self.initial[None], tokens)
        # 3. temporal transformer, text
        h = self.out_norm(self.ring(self.embed(tokens), b, active, length))
        seeds, silent = self.seeds[:b], self.silent[:b]
        nxt = ((o + 1) % ct)[:, None, None].expand(b, nm, 1)
        mine = cache[:, :nm]
        given = torch.where(self.forced[:b].gather(2, nxt)[..., 0], mine.gather(2, nxt)[..., 0], -1)
        text = self.text_sampler(F.linear(h[:, 0], self.text_linear), seeds, o, 0)
        text = torch.where(silent, shape.text_padding_id, torch.where(given[:, 0] >= 0, given[:, 0], text))
        # 4. the model's codebooks (the user's sub-steps, if the depformer has them, are never run)
        force = torch.where(silent[:, None], self.silence_codes[None], given[:, 1:])
        audio = self.depformer(b, h, text, seeds, o, force, shape.own_q)
        # 5. into the cache at o + 1; the complete frame out
        new = torch.cat([text[:, None], audio], dim=1)[..., None]
        mine.scatter_(2, nxt, torch.where(act3, new, mine.gather(2, nxt)))
        forced = self.forced[:b]  # consumed: a column's given tokens serve once
        forced.scatter_(2, nxt, forced.gather(2, nxt) & ~act3)
        done = ((o[:, None] + 1 - shape.max_delay + self.delays[None, :nm]) % ct)[..., None]
        frame = mine.gather(2, done)[..., 0]
        return frame, o >= shape.max_delay
