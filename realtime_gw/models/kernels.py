"""GPU building blocks shared by the codec talker, the streaming Mimi decoder and PI0's fast sampler.

One copy of each: fused projections, grouped-query attention (a fused kernel or two GEMMs), rotary
tables in roll form, additive masks in attention's folded row order, CUDA-graph capture into one pool,
and bucket lookup. Norms, K/V writes and MLP shapes differ per architecture and stay in their files.

Decisions where the copies had drifted apart:
- Attention folds the query heads that share a KV head into the query axis **query-major** (row
  ``s * groups + g``): with one KV head (PI0) the fold is a view, and a mask built per query row
  repeats over groups. ``additive_mask`` builds rows in that order.
- Masked scores get ``finfo(dtype).min``, not ``-inf``: a row with every key masked stays finite.
- A fused projection keeps every bias: a layer without one contributes zeros (``cat_bias``); dropping
  all biases because one projection lacks one would change the function.
- Graph capture runs in ``thread_local`` mode: other stage workers' threads keep using the GPU while
  one captures, and the global mode would make their calls (or this capture) fail.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from realtime_gw.models.fp8 import Fp8Weight, Weight, linear


# -- fused projections ---------------------------------------------------------------------------------------
def cat_bias(*linears: Any) -> torch.Tensor | None:
    """The biases of ``linears`` as one vector for their fused matrix; None when none has a bias."""
    if all(m.bias is None for m in linears):
        return None
    return torch.cat(
        [m.bias if m.bias is not None else m.weight.new_zeros(m.weight.shape[0]) for m in linears]
    )


def fuse_linears(*linears: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of one GEMM computing every linear's output side by side (a copy, made once)."""
    with torch.no_grad():
        return torch.cat([m.weight for m in linears]).contiguous(), cat_bias(*linears)


def linear_add(residual: torch.Tensor, x: torch.Tensor, w: Weight, b: torch.Tensor | None) -> torch.Tensor:
    """residual + x @ w.T (+ b): one GEMM with the residual as its C operand when there is no bias (and
    the weight is not FP8, whose GEMM has no C operand)."""
    if b is not None or isinstance(w, Fp8Weight):
        return residual + linear(x, w, b)
    d = residual.shape[-1]
    return torch.addmm(residual.reshape(-1, d), x.reshape(-1, x.shape[-1]), w.t()).view(residual.shape)


def qkv_heads(
    x: torch.Tensor, w: Weight, b: torch.Tensor | None, heads: int, kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One fused QKV projection of ``x (B, S, hidden)`` -> (q and k heads, v heads), laid out
    ``(B, S, heads + kv_heads, D)`` and ``(B, S, kv_heads, D)`` (views of one output): q and k get
    their norms and rotary together."""
    bsz, s, _ = x.shape
    qkv = linear(x, w, b).view(bsz, s, heads + 2 * kv_heads, -1)
    return qkv[:, :, : heads + kv_heads], qkv[:, :, heads + kv_heads :]


# -- rotary embeddings ---------------------------------------------------------------------------------------
def signed_rope(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' (cos, sin) tables -> (cos, sign-folded sin) for ``apply_rope``.

    transformers rotates with cat(-x2, x1) = roll(x, D/2) * [-1..., +1...]; folding the sign into sin
    makes the rotation one roll and one addcmul instead of a slice/neg/cat chain."""
    half = sin.shape[-1] // 2
    return cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin, shape ``positions.shape + (D,)``, computed in float32 as transformers does
    (its rotary module's ``inv_freq`` and ``attention_scaling``), then cast."""
    freqs = positions.float()[..., None] * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = signed_rope(emb.cos() * scale, emb.sin() * scale)
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotate ``x (..., D)`` by tables broadcastable to it (``signed_rope``/``rope_cos_sin``)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


# -- attention -----------------------------------------------------------------------------------------------
def additive_mask(mask: torch.Tensor, kv_heads: int, groups: int, dtype: torch.dtype) -> torch.Tensor:
    """Bool ``(B, S, L)`` (True = may attend) -> additive ``(B, kv_heads, S * groups, L)`` in ``attend``'s
    folded row order, materialised once per step so every layer reads it as a view. Pass
    ``kv_heads=1`` (and B = 1) for a mask shared by all KV heads (and rows): it then broadcasts."""
    b, s, length = mask.shape
    add = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    add = add[:, None, :, None].expand(b, kv_heads, s, groups, length)
    return add.reshape(b, kv_heads, s * groups, length)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    fused: bool = False,
) -> torch.Tensor:
    """Grouped-query attention without repeating K/V: q ``(B, S, H, D)`` over k/v ``(B, KV, L, D)``
    (column slices of a cache are fine) -> ``(B, S, H * D)``.

    Query heads sharing a KV head are folded into the query axis, query-major (row ``s * G + g``, head
    ``kv * G + g``). ``mask``: additive (``additive_mask``) or bool, broadcastable to
    ``(B, KV, S * G, L)``. ``fused`` runs PyTorch's SDPA (long query sequences); otherwise two batched
    GEMMs and a softmax (float32 inside), which spread few queries over a long cache across the GPU
    better than a fused kernel's handful of thread blocks."""
    b, s, h, d = q.shape
    kvh = k.shape[1]
    g = h // kvh
    qf = q.view(b, s, kvh, g, d).transpose(1, 2).reshape(b, kvh, s * g, d)
    if fused:
        out = F.scaled_dot_product_attention(qf, k, v, attn_mask=mask, scale=scale)
    else:
        out = _attend_gemm(qf, k, v, mask, scale)
    return out.view(b, kvh, s, g, d).transpose(1, 2).reshape(b, s, h * d)


def _attend_gemm(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Folded q ``(B, KV, N, D)`` over k/v ``(B, KV, L, D)`` as bmm / baddbmm (the mask is the C operand)."""
    b, kvh, n, d = q.shape
    keys = k.shape[2]
    q3, k3, v3 = q.reshape(b * kvh, n, d), k.reshape(b * kvh, keys, d), v.reshape(b * kvh, keys, d)
    if mask is None:
        scores = torch.bmm(q3, k3.transpose(1, 2)) * scale
    else:
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(
                ~mask, torch.finfo(q.dtype).min
            )
        if mask.shape[0] == 1 and mask.shape[1] == 1:
            c = mask[0]  # shared by every batch row and KV head: baddbmm broadcasts it
        else:
            c = mask.expand(b, kvh, n, keys).reshape(b * kvh, n, keys)
        scores = torch.baddbmm(c, q3, k3.transpose(1, 2), alpha=scale)
    probs = torch.softmax(scores, dim=-1)  # float32 inside even for bf16 scores: one kernel, not three
    return torch.bmm(probs, v3).view(b, kvh, n, d)


# -- layer passes over a static KV cache ----------------------------------------------------------------------
def layers_at_positions(
    layers: Sequence[Any],
    h: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: Sequence[torch.Tensor],
    v_cache: Sequence[torch.Tensor],
    cols: torch.Tensor,
    length: int,
    mask_add: torch.Tensor,
) -> torch.Tensor:
    """``layers`` for rows ``[0, b)`` whose queries sit at different positions: row r's K/V are written at
    its cache columns ``cols[r]`` (``(b,)`` for one position a row, ``(b, S)`` for S), by scatter;
    attention reads columns ``[0, length)``."""
    b = h.shape[0]
    cols = cols.view(b, -1)
    for i, layer in enumerate(layers):
        kc, vc = k_cache[i][:b], v_cache[i][:b]
        idx = cols[:, None, :, None].expand(b, kc.shape[1], cols.shape[1], kc.shape[3])

        def write(
            k: torch.Tensor,
            v: torch.Tensor,
            kc: torch.Tensor = kc,
            vc: torch.Tensor = vc,
            idx: torch.Tensor = idx,
        ) -> None:
            kc.scatter_(2, idx, k)
            vc.scatter_(2, idx, v)

        h = layer(h, cos, sin, write, kc[:, :, :length], vc[:, :, :length], mask_add)
    return h


def layers_over_span(
    layers: Sequence[Any],
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: Sequence[torch.Tensor],
    v_cache: Sequence[torch.Tensor],
    start: int,
    end: int,
    mask: torch.Tensor,
) -> torch.Tensor:
    """``layers`` over positions ``[start, end)``, the same for every row (a code predictor's pass):
    K/V written into that span of the caches, attention over ``[0, end)``."""
    b = x.shape[0]
    for j, layer in enumerate(layers):
        kc, vc = k_cache[j][:b], v_cache[j][:b]

        def write(k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor = kc, vc: torch.Tensor = vc) -> None:
            kc[:, :, start:end] = k
            vc[:, :, start:end] = v

        x = layer(x, cos, sin, write, kc[:, :, :end], vc[:, :, :end], mask)
    return x


# -- CUDA graphs ---------------------------------------------------------------------------------------------
class GraphCapture:
    """Captures CUDA graphs for one owner on ``device``: one memory pool and one capture stream for all
    of them. They replay one at a time and keep nothing between replays, so they share memory; the
    caching allocator reuses a pool's blocks only on the stream that allocated them, hence one stream
    (and a stream of our own: two owners capturing at once on a shared stream would collide)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._pool: Any = None
        self._stream: Any = None

    def capture(
        self,
        body: Callable[[], object],
        warmup: Callable[[], object] | None = None,
        warmup_runs: int = 1,
    ) -> Any:
        """Run ``warmup`` (default ``body``) ``warmup_runs`` times on a side stream (lazy init, cuBLAS
        handles, compiles, autograd), then record ``body`` into a ``torch.cuda.CUDAGraph``.

        Raises before running anything when ``device`` is not a CUDA device."""
        with torch.cuda.device(self.device):
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
                self._stream = torch.cuda.Stream()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup_runs):
                    (warmup or body)()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(
                graph, pool=self._pool, stream=self._stream, capture_error_mode="thread_local"
            ):
                body()
        return graph


# -- buckets -------------------------------------------------------------------------------------------------
def pow2_buckets(limit: int, start: int) -> list[int]:
    """``start``, doubling, below ``limit``, then ``limit`` itself: [1, 2, 4, 6] for (6, 1)."""
    out, b = [], start
    while b < limit:
        out.append(b)
        b *= 2
    return [*out, limit]


def bucket_for(buckets: Sequence[int], n: int) -> int:
    """The smallest of the (ascending) ``buckets`` that holds ``n``."""
    i = bisect.bisect_left(buckets, n)
    if i == len(buckets):
        raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")
    return buckets[i]
