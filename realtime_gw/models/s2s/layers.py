"""Moshi's transformer layers regrouped for a batched decode step, over the published weight table.

``TemporalLayer`` is one layer of the temporal transformer in the duck type of the shared ring-KV
transformer (``streaming.layers.RingTransformer``): pre-norm RMS (float32 inside, eps 1e-8), one fused
QKV GEMM, RoPE, grouped attention over the slot's ring, the output projection fused with the residual
add, then the gated SiLU MLP. Moshi rotates interleaved pairs ``(2j, 2j+1)``; the shared kernels rotate
halves ``(j, j + D/2)``, so the query and key rows of each head are permuted once from one layout to the
other (scores are unchanged: q and k get the same permutation; transformers' Mimi conversion does the same).

``Depformer`` emits a frame's ``dep_q`` audio codebooks one after another (its sub-steps), each with its
own weights (``weights_per_step``), attending to the frame's earlier sub-steps only (no positional
embedding): the first sub-step reads the frame's text token, sub-step ``s`` the code sampled at ``s - 1``.
PersonaPlex's has 16 sub-steps (the model's 8 codebooks, then the user's 8); a call may run only the
first ``sub_steps`` of them: at inference the user's are always forced to what the user said and, the
attention being causal, they cannot change the model's 8, so the serving step stops after those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from realtime_gw.models.kernels import attend, gated_mlp, linear_add, qkv_heads, rope_attend
from realtime_gw.models.s2s.config import MoshiShape
from realtime_gw.models.s2s.sampling import Sampler

Weights = dict[str, torch.Tensor]


@dataclass
class RmsNormF32:
    """``moshi.modules.transformer.RMSNorm`` of ``norm="rms_norm_f32"``: computed in float32, cast back."""

    alpha: torch.Tensor
    eps: float = 1e-8

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        var = self.eps + torch.mean(xf * xf, dim=-1, keepdim=True)
        return (xf * (self.alpha.float().view(-1) * torch.rsqrt(var))).to(x.dtype)


def deinterleave_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a q or k projection from interleaved RoPE pairs to halves, per head."""
    out_dim, in_dim = w.shape
    d = out_dim // heads
    return w.view(heads, d // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


@dataclass
class TemporalLayer:
    norm1: RmsNormF32
    norm2: RmsNormF32
    w_qkv: torch.Tensor
    w_o: torch.Tensor
    w_in: torch.Tensor
    w_out: torch.Tensor
    heads: int
    head_dim: int

    @property
    def kv_heads(self) -> int:
        return self.heads

    @classmethod
    def of(cls, weights: Weights, i: int, shape: MoshiShape) -> TemporalLayer:
        p = f"transformer.layers.{i}."
        d, h = shape.dim, shape.num_heads
        qkv = weights[p + "self_attn.in_proj_weight"]
        with torch.no_grad():
            w_qkv = torch.cat(
                [deinterleave_rows(qkv[:d], h), deinterleave_rows(qkv[d : 2 * d], h), qkv[2 * d :]]
            ).contiguous()
        return cls(
            norm1=RmsNormF32(weights[p + "norm1.alpha"]),
            norm2=RmsNormF32(weights[p + "norm2.alpha"]),
            w_qkv=w_qkv,
            w_o=weights[p + "self_attn.out_proj.weight"],
            w_in=weights[p + "gating.linear_in.weight"],
            w_out=weights[p + "gating.linear_out.weight"],
            heads=h,
            head_dim=shape.head_dim,
        )

    def __call__(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        write: Any,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask_add: torch.Tensor,
    ) -> torch.Tensor:
        qk, v = qkv_heads(self.norm1(x), self.w_qkv, None, self.heads, self.heads)
        o = rope_attend(qk, v, self.heads, cos, sin, write, keys, values, mask_add, self.head_dim**-0.5)
        x = linear_add(x, o, self.w_o, None)
        return gated_mlp(self.norm2(x), self.w_in, self.w_out, x)


class Depformer:
    """``__call__(b, h, text, seeds, steps) -> (b, dep_q)`` audio codes of one frame for rows ``[0, b)``
    (the first ``sub_steps`` of them when given)."""

    def __init__(self, weights: Weights, shape: MoshiShape, slots: int, sampler: Sampler) -> None:
        self.shape = shape
        self.sampler = sampler
        dd, q = shape.depformer_dim, shape.dep_q
        self.heads = shape.depformer_num_heads
        self.head_dim = shape.depformer_head_dim
        with torch.no_grad():  # every sub-step's input projection of the frame in one GEMM
            self.w_in = torch.cat([weights[f"depformer_in.{s}.weight"] for s in range(q)]).contiguous()
        self.text_emb = weights["depformer_text_emb.weight"]
        self.emb = [weights[f"depformer_emb.{s}.weight"] for s in range(q - 1)]
        self.heads_out = [weights[f"linears.{s}.weight"] for s in range(q)]
        self.layers: list[dict[str, Any]] = []
        for i in range(shape.depformer_num_layers):
            p = f"depformer.layers.{i}."
            qkv = weights[p + "self_attn.in_proj_weight"].view(q, 3 * dd, dd)
            out = weights[p + "self_attn.out_proj.weight"].view(q, dd, dd)
            self.layers.append({
                "norm1": RmsNormF32(weights[p + "norm1.alpha"]),
                "norm2": RmsNormF32(weights[p + "norm2.alpha"]),
                "qkv": [qkv[s] for s in range(q)],
                "o": [out[s] for s in range(q)],
                "in": [weights[p + f"gating.{s}.linear_in.weight"] for s in range(q)],
                "out": [weights[p + f"gating.{s}.linear_out.weight"] for s in range(q)],
            })  # fmt: skip
        dev, dtype = self.text_emb.device, self.text_emb.dtype
        kv = (slots, self.heads, q, self.head_dim)
        self.k = [torch.zeros(kv, device=dev, dtype=dtype) for _ in self.layers]
        self.v = [torch.zeros(kv, device=dev, dtype=dtype) for _ in self.layers]

    def __call__(
        self, b: int, h: torch.Tensor, text: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor,
        force: torch.Tensor | None = None, sub_steps: int | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """``h (b, 1, dim)``: the temporal transformer's normed output; ``force (b, >= sub_steps)`` with -1
        where the sampled code stands, else the code that replaces it (and feeds the next sub-step).
        Runs sub-steps ``[0, sub_steps)`` (default all ``dep_q``) -> ``(b, sub_steps)``."""
        prev = text
        codes = []
        dd = self.shape.depformer_dim
        n = self.shape.dep_q if sub_steps is None else sub_steps
        inputs = F.linear(h, self.w_in[: n * dd])  # (b, 1, n * depformer_dim)
        for s in range(n):
            emb = self.text_emb if s == 0 else self.emb[s - 1]
            x = inputs[..., s * dd : (s + 1) * dd] + emb[prev][:, None]
            for i, layer in enumerate(self.layers):
                qkv = F.linear(layer["norm1"](x), layer["qkv"][s]).view(b, 1, 3, self.heads, self.head_dim)
                self.k[i][:b, :, s] = qkv[:, 0, 1]
                self.v[i][:b, :, s] = qkv[:, 0, 2]
                o = attend(qkv[:, :, 0], self.k[i][:b, :, : s + 1], self.v[i][:b, :, : s + 1], None,
                           self.head_dim**-0.5)  # fmt: skip
                x = linear_add(x, o, layer["o"][s], None)
                x = gated_mlp(layer["norm2"](x), layer["in"][s], layer["out"][s], x)
            logits = F.linear(x[:, 0], self.heads_out[s])
            tok = self.sampler(logits, seeds, steps, 1 + s)
            if force is not None:
                tok = torch.where(force[:, s] >= 0, force[:, s], tok)
            codes.append(tok)
            prev = tok
        return torch.stack(codes, dim=1)
