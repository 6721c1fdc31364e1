"""The Kyutai STT text LM stepped once per 80 ms frame for many slots at once, greedy.

The reference (``KyutaiSpeechToTextForConditionalGeneration.generate``) feeds, at position 0, the text
BOS with the audio BOS in every codebook, and at position ``p >= 1`` the text token it predicted at
``p - 1`` with the codes of audio frame ``p - 1``; each position's input is the sum of its ``1 + K`` token
embeddings. Position 0 is the same for every stream, so its K/V and its greedy token are computed once
(``_bos``) and copied into a slot at reset; after that, one step = one audio frame = one position.

Per slot: a ring K/V of ``sliding_window`` columns per layer with each column's absolute position
(the window mask stays exact after wrap-around; the window includes the query, as transformers' sliding
mask and moshi's ``context``), the position, and the last token. Inactive rows of a step write into a
scratch column and keep everything else. Attention reads columns ``[0, length)`` (a length bucket: before
the ring wraps, only the positions seen so far), so short utterances do not pay for the whole window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from realtime_gw.models.kernels import (
    apply_rope,
    attend,
    fuse_linears,
    linear_add,
    qkv_heads,
    rope_cos_sin,
)
from realtime_gw.models.speech.streaming.layers import ring_mask


def rope_frequencies(rotary: Any, device: torch.device) -> tuple[torch.Tensor, float]:
    """The rotary module's inverse frequencies, recomputed in float32 from its config: a model cast to
    bfloat16 also casts that buffer, and bfloat16 frequencies would turn positions hundreds of frames in
    by up to radians."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind = rotary.rope_type
    init = rotary.compute_default_rope_parameters if kind == "default" else ROPE_INIT_FUNCTIONS[kind]
    inv_freq, scale = init(rotary.config)
    return inv_freq.float().to(device), float(scale)


@dataclass
class FusedLmLayer:
    """A ``KyutaiSpeechToTextDecoderLayer`` regrouped for decode: one QKV GEMM, the output projection
    fused with the residual add; its RMS norms and gated MLP are the reference modules themselves."""

    ln1: Any
    ln2: Any
    mlp: Any
    w_qkv: torch.Tensor
    b_qkv: torch.Tensor | None
    w_o: torch.Tensor
    heads: int
    kv_heads: int
    head_dim: int
    scale: float

    @classmethod
    def of(cls, layer: Any) -> FusedLmLayer:
        att = layer.self_attn
        if att.q_proj.use_flexible_linear:
            raise NotImplementedError("per-codebook (flexible) linears are the depth decoder's, not the LM's")
        w_qkv, b_qkv = fuse_linears(att.q_proj.linear, att.k_proj.linear, att.v_proj.linear)
        return cls(
            ln1=layer.input_layernorm,
            ln2=layer.post_attention_layernorm,
            mlp=layer.mlp,
            w_qkv=w_qkv,
            b_qkv=b_qkv,
            w_o=att.o_proj.linear.weight,
            heads=att.num_heads,
            kv_heads=att.num_key_value_heads,
            head_dim=att.head_dim,
            scale=float(att.scaling),
        )


class KyutaiLmRuntime:
    """``step(b, length, codes, active)`` -> the greedy text token of each slot in ``[0, b)``."""

    def __init__(self, model: Any, slots: int) -> None:
        cfg = model.config
        self.config = cfg
        lm = model.model
        emb = lm.embed_tokens
        self.table = emb.embed_tokens.weight
        self.dtype = self.table.dtype
        dev = self.table.device
        self.device = dev
        self.num_codebooks = int(cfg.num_codebooks)
        self.audio_offsets = emb.audio_tokens_offsets[1:].to(dev)  # (K,): codebook k starts at vocab + k*cbv
        self.layers = [FusedLmLayer.of(layer) for layer in lm.layers]
        self.norm = lm.norm
        self.w_head = model.lm_head.weight
        self.window = int(cfg.sliding_window or cfg.max_position_embeddings)
        self.ring = self.window  # one position per step: the write at q evicts q - window, outside q's window
        self.inv_freq, self.rope_scale = rope_frequencies(lm.layers[0].self_attn.rotary_emb, dev)
        self.k_ring: list[torch.Tensor] = []
        self.v_ring: list[torch.Tensor] = []
        for layer in self.layers:
            shape = (slots, layer.kv_heads, self.ring + 1, layer.head_dim)  # +1: scratch column
            self.k_ring.append(torch.zeros(shape, device=dev, dtype=self.dtype))
            self.v_ring.append(torch.zeros(shape, device=dev, dtype=self.dtype))
        self.kpos = torch.full((slots, self.ring + 1), -1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(slots, dtype=torch.long, device=dev)
        self.last_tok = torch.zeros(slots, dtype=torch.long, device=dev)
        self._bos()

    # -- position 0, once ----------------------------------------------------------------------------------
    @torch.no_grad()
    def _bos(self) -> None:
        """K/V and greedy token of position 0 (text BOS + audio BOS everywhere), through slot 0."""
        cfg = self.config
        self.kpos[0] = -1
        self.pos[0] = 0
        self.last_tok[0] = int(cfg.bos_token_id)
        codes = torch.full(
            (1, self.num_codebooks), int(cfg.audio_bos_token_id), dtype=torch.long, device=self.device
        )
        self.bos_token = int(self.step(1, 1, codes, torch.ones(1, dtype=torch.bool, device=self.device))[0])
        self.bos_k = [k[0, :, 0].clone() for k in self.k_ring]
        self.bos_v = [v[0, :, 0].clone() for v in self.v_ring]

    @torch.no_grad()
    def reset(self, slots: torch.Tensor) -> None:
        """Fresh streams in ``slots`` (device index tensor): position 0 already in, next position 1."""
        n = slots.shape[0]
        self.kpos.index_fill_(0, slots, -1)
        self.kpos[slots, 0] = 0
        for k, v, bk, bv in zip(self.k_ring, self.v_ring, self.bos_k, self.bos_v, strict=True):
            k[slots, :, 0] = bk.expand(n, -1, -1)
            v[slots, :, 0] = bv.expand(n, -1, -1)
        self.pos.index_fill_(0, slots, 1)
        self.last_tok.index_fill_(0, slots, self.bos_token)

    # -- the step ------------------------------------------------------------------------------------------
    def embed(self, text: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Sum of the text embedding and each codebook's: ``(b,)``, ``(b, K)`` -> ``(b, 1, hidden)``."""
        ids = torch.cat([text[:, None], codes + self.audio_offsets], dim=1)
        return self.table[ids].sum(dim=1, keepdim=True)

    def step(self, b: int, length: int, codes: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """One position for slots ``[0, b)`` (codes of their latest audio frame); attends to ring columns
        ``[0, length)``. Advances active slots and returns each row's greedy token ``(b,)``."""
        qpos = self.pos[:b]
        col = torch.where(active, qpos % self.ring, self.ring)
        kpos = self.kpos[:b]
        kpos.scatter_(1, col[:, None], qpos[:, None])
        l0 = self.layers[0]
        mask_add = ring_mask(kpos[:, :length], qpos[:, None], self.window, active, self.ring, l0.heads,
                             l0.kv_heads, self.dtype)  # fmt: skip
        cos, sin = rope_cos_sin(qpos[:, None], self.inv_freq, self.rope_scale, self.dtype)
        cos, sin = cos[:, :, None], sin[:, :, None]  # (b, 1, 1, D): broadcast over heads
        x = self.embed(self.last_tok[:b], codes)
        idx_base = col[:, None, None, None]
        for i, layer in enumerate(self.layers):
            kr, vr = self.k_ring[i][:b], self.v_ring[i][:b]
            qk, v = qkv_heads(layer.ln1(x), layer.w_qkv, layer.b_qkv, layer.heads, layer.kv_heads)
            qk = apply_rope(qk, cos, sin)
            idx = idx_base.expand(b, layer.kv_heads, 1, layer.head_dim)
            kr.scatter_(2, idx, qk[:, :, layer.heads :].transpose(1, 2))
            vr.scatter_(2, idx, v.transpose(1, 2))
            o = attend(qk[:, :, : layer.heads], kr[:, :, :length], vr[:, :, :length], mask_add, layer.scale)
            x = linear_add(x, o, layer.w_o, None)
            x = x + layer.mlp(layer.ln2(x))
        logits = torch.nn.functional.linear(self.norm(x[:, 0]), self.w_head)
        tok = logits.argmax(dim=-1)
        self.last_tok[:b] = torch.where(active, tok, self.last_tok[:b])
        self.pos[:b].add_(active.long())
        return tok
