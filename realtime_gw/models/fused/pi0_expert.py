"""The PI0 / π0.5 action expert's velocity on the fused kernels (``ops``): the same function as
``Pi0Functional.velocity``, six kernels a layer.

Per layer: norm (Gemma's static one, or π0.5's adaptive scale and shift) + QKV, rotary + K/V into the
suffix columns of the static cache, attention over the whole cache under the suffix mask, o-proj +
(gated) residual, norm + gate|up + GeGLU, down + (gated) residual; then the final norm fused into
``action_out_proj``. The time/action embeddings stay the model's own modules.

RTC's guided step needs the vector-Jacobian product through the expert: there the layers run as
``FusedLayers``, an autograd Function with the layers' backward written out (torch GEMMs over the same
fused weights, in the model dtype; the GLU's and each norm's derivative one kernel each, ``backward``;
attention's backward over the cache recomputes the probabilities).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from realtime_gw.models.fused import ops
from realtime_gw.models.fused.attention import attention
from realtime_gw.models.fused.backward import glu_backward, norm_backward_add
from realtime_gw.models.policy.expert import AdaptiveNorm, Norm, StaticNorm, normalize


def _activation(act: Any) -> int:
    """The fused GLU activation equal to the layer's own (probed on a few values)."""
    probe = torch.linspace(-4, 4, 33)
    got = act(probe)
    if torch.allclose(got, F.gelu(probe, approximate="tanh"), atol=1e-6):
        return ops.ACT_GELU_TANH
    if torch.allclose(got, F.silu(probe), atol=1e-6):
        return ops.ACT_SILU
    raise NotImplementedError(f"the fused expert has no kernel for the activation {act!r}")


class FusedExpert:
    """``velocity(cache, x, time, state)`` of a ``Pi0Functional`` on the fused kernels."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.expert = fn.expert
        self.blocks = fn.dit_blocks
        for blk in self.blocks:
            for w in (blk.qkv, blk.o, blk.gate_up, blk.down):
                if not isinstance(w, torch.Tensor) or not w.is_contiguous():
                    raise NotImplementedError("the fused expert takes plain contiguous weights (no FP8)")
        self.act = _activation(self.blocks[0].act)
        out = fn.model.action_out_proj
        self.out_w, self.out_b = out.weight.detach(), out.bias.detach() if out.bias is not None else None

    def _norm(
        self, norm: Norm, mod: tuple[torch.Tensor, ...] | None
    ) -> tuple[dict[str, Any], torch.Tensor | None]:
        """(``ops.linear``'s norm arguments, the residual gate or None)."""
        if isinstance(norm, StaticNorm):
            return {"norm": norm.weight, "eps": norm.eps}, None
        assert isinstance(norm, AdaptiveNorm) and mod is not None
        scale1, shift, gate = mod
        i = norm.index
        return {"norm": scale1[:, i], "norm_shift": shift[:, i], "eps": norm.eps}, gate[:, i]

    def velocity(self, cache: Any, x: torch.Tensor, time: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """``Pi0Functional.velocity`` on the fused kernels. Where autograd records (RTC's guided step: ``x``
        requires grad), the layers run as ``FusedLayers``, whose backward gives the vector-Jacobian
        product; the embedding, final norm and output projection are then the model's own, under autograd."""
        fn = self.fn
        h, mod = self.expert.embed(x, time, state)
        b, n, hidden = h.shape
        mods = None
        if mod is not None:  # (B, norms, 3, 1, hidden): one op each for all the norms' scale, shift, gate
            m = mod.detach()  # the time's, not the actions': no gradient flows into it
            mods = (1.0 + m[:, :, 0, 0].float(), m[:, :, 1, 0].float(), m[:, :, 2, 0])
        chunk = fn.chunk
        if torch.is_grad_enabled() and h.requires_grad:
            rows = FusedLayers.apply(h.reshape(b * n, hidden), self, cache, n, mods)
            out, _ = normalize(rows.view(b, n, hidden), self.expert.final_norm, mod)
            return fn.model.action_out_proj(out[:, -chunk:])
        with torch.no_grad():
            rows = self.layers(h.reshape(b * n, hidden), cache, n, mods)
            last = (
                torch.arange(b, device=x.device)[:, None] * n
                + (n - chunk)
                + torch.arange(chunk, device=x.device)
            )
            final, _ = self._norm(self.expert.final_norm, mods)
            out = ops.linear(
                rows, self.out_w, self.out_b, gather=last.view(-1), rows_per_group=chunk, **final
            )
        return out.view(b, chunk, -1)

    def layers(
        self,
        rows: torch.Tensor,
        cache: Any,
        n: int,
        mods: tuple[torch.Tensor, ...] | None,
        saved: list[tuple[torch.Tensor, ...]] | None = None,
    ) -> torch.Tensor:
        """The expert's layers over ``rows (B * n, hidden)``; with ``saved``, each layer's input, its
        rotated queries and its mid-layer residual are appended (what ``FusedLayers.backward`` reads)."""
        fn = self.fn
        for i, blk in enumerate(self.blocks):
            kc, vc = cache.k[i], cache.v[i]
            norm1, gate1 = self._norm(blk.norm1, mods)
            qkv = ops.linear(rows, blk.qkv, blk.qkv_bias, rows_per_group=n, **norm1)
            q = ops.rope_write(
                qkv,
                n,
                fn.heads,
                fn.kv_heads,
                fn.head_dim,
                cache.rope_cos,
                cache.rope_sin,
                kc,
                vc,
                cache.prefix_len,
            )
            o = attention(q, n, fn.heads, kc, vc, cache.total, blk.scale, mask=cache.suffix_mask)
            mid = ops.linear(o, blk.o, blk.o_bias, residual=rows, gate=gate1, rows_per_group=n)
            norm2, gate2 = self._norm(blk.norm2, mods)
            gu = ops.linear(mid, blk.gate_up, blk.gate_up_bias, glu=self.act, rows_per_group=n, **norm2)
            if saved is not None:
                saved.append((rows, q, mid))
            rows = ops.linear(gu, blk.down, blk.down_bias, residual=mid, gate=gate2, rows_per_group=n)
        return rows


class FusedLayers(torch.autograd.Function):
    """The expert's layers on the fused kernels, differentiable w.r.t. their input rows (RTC's
    vector-Jacobian product). The backward is written out: per layer, the transposed GEMMs of down,
    gate|up, o and QKV, the GLU's and the norms' derivatives, rotary's transpose, and attention's
    backward over the whole cache, of which only the suffix's own K/V columns lead back to the rows
    (the prefix's K/V are constants of the step). The time's modulations are constants too."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        rows: torch.Tensor,
        fused: FusedExpert,
        cache: Any,
        n: int,
        mods: tuple[torch.Tensor, ...] | None,
    ) -> torch.Tensor:
        saved: list[tuple[torch.Tensor, ...]] = []
        out = fused.layers(rows.detach(), cache, n, mods, saved)
        ctx.fused, ctx.cache, ctx.n, ctx.mods, ctx.saved = fused, cache, n, mods, saved
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        fused, cache, n, mods = ctx.fused, ctx.cache, ctx.n, ctx.mods
        fn = fused.fn
        heads, kvh, d = fn.heads, fn.kv_heads, fn.head_dim
        g = heads // kvh
        dx = grad.float()
        m = dx.shape[0]
        b = m // n
        p0 = cache.prefix_len
        for i in reversed(range(len(fused.blocks))):
            blk = fused.blocks[i]
            x0, q, mid = ctx.saved[i]
            dt = x0.dtype
            norm1, gate1 = fused._norm(blk.norm1, mods)
            norm2, gate2 = fused._norm(blk.norm2, mods)
            # down + residual: x2 = mid + g2 * (a @ Wd.T + bd)
            dz = dx if gate2 is None else dx * _per_row(gate2, n)
            da = dz.to(dt) @ blk.down
            gu = ops.linear(mid, blk.gate_up, blk.gate_up_bias, rows_per_group=n, **norm2)
            dh2 = glu_backward(gu, da, fused.act, dt) @ blk.gate_up
            dx = norm_backward_add(dx, mid, dh2, norm2["norm"], norm2["eps"], n)
            # o-proj + residual: mid = x0 + g1 * (o @ Wo.T + bo)
            dz = dx if gate1 is None else dx * _per_row(gate1, n)
            do = (dz.to(dt) @ blk.o).view(b, n, kvh, g, d).permute(0, 2, 1, 3, 4).reshape(b, kvh, n * g, d)
            qf = q.view(b, n, kvh, g, d).permute(0, 2, 1, 3, 4).reshape(b, kvh, n * g, d)
            # GEMMs in the model dtype (float32 accumulation, as the eager backward's), softmax in float32
            keys, values = cache.k[i], cache.v[i]
            scores = (qf @ keys.transpose(-1, -2)).float() * blk.scale + cache.suffix_mask.float()
            probs = torch.softmax(scores, dim=-1)
            dprobs = (do @ values.transpose(-1, -2)).float()
            dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdim=True))
            dq = (dscores.to(dt) @ keys).float() * blk.scale  # (B, KV, n * G, D)
            suffix = slice(p0, p0 + n)
            dk = (dscores.transpose(-1, -2)[:, :, suffix].to(dt) @ qf).float() * blk.scale  # (B, KV, n, D)
            dv = (probs.transpose(-1, -2)[:, :, suffix].to(dt) @ do).float()
            dq = dq.view(b, kvh, n, g, d).permute(0, 2, 1, 3, 4).reshape(b, n, heads, d)
            cos, sin = cache.rope_cos.float(), cache.rope_sin.float()  # (B, n, 1, D)
            dqk = torch.cat([dq, dk.transpose(1, 2)], dim=2)
            dqk = dqk * cos + (dqk * sin).roll(d // 2, dims=-1)  # rotary's transpose
            dqkv = torch.cat([dqk, dv.transpose(1, 2)], dim=2).reshape(m, -1)
            dh1 = dqkv.to(dt) @ blk.qkv
            dx = norm_backward_add(dx, x0, dh1, norm1["norm"], norm1["eps"], n)
        return dx.to(grad.dtype), None, None, None, None


def _per_row(t: torch.Tensor, n: int) -> torch.Tensor:
    """A per-batch-row ``(B, hidden)`` vector repeated over each row's ``n`` tokens; ``(hidden,)`` as is."""
    return t.float() if t.dim() == 1 else t.float().repeat_interleave(n, dim=0)
