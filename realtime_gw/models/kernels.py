"""GPU building blocks shared by the codec talker, the streaming Mimi decoder and PI0's fast sampler.

One copy of each: fused projections, grouped-query attention (a fused kernel or two GEMMs), rotary
tables in roll form, additive masks in attention's folded row order, CUDA-graph capture into one pool,
and bucket lookup; of a decode layer (``layers_at_positions``'s duck type), the part after the QKV
projection that every such layer shares (``rope_attend``: rotary, K/V write, attention) and the SwiGLU
MLP (``gated_mlp``: Moshi's and the Qwen3 talker's). Norms, K/V writes, residual scales and the other MLP
shapes differ per architecture and stay in their files.

Decisions where the copies had drifted apart:
- Attention folds the query heads that share a KV head into the query axis **query-major** (row
  ``s * groups + g``): with one KV head (PI0) the fold is a view, and a mask built per query row
  repeats over groups. ``additive_mask`` builds rows in that order.
- Masked scores get ``finfo(dtype).min``, not ``-inf``: a row with every key masked stays finite.
- A fused projection keeps every bias: a layer without one contributes zeros (``cat_bias``); dropping
  all biases because one projection lacks one would change the function.
- Few queries over a long cache on CUDA (decode) run one Triton kernel (``fused.attention.decode``:
  split keys, float32 online softmax, FP8 K/V dequantized on load) instead of the two GEMMs, which
  reach a third of HBM's rate as batched GEMVs; the GEMMs stay the CPU path and the reference.
- Graph capture runs in ``thread_local`` mode: other stage workers' threads keep using the GPU while
  one captures, and the global mode would make their calls (or this capture) fail.
"""

from __future__ import annotations

import bisect
import functools
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from realtime_gw.models.fp8 import Fp8Weight, ScaledKv, Weight, linear, quantize_rows


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


def gated_mlp(
    x: torch.Tensor,
    w_in: torch.Tensor,
    w_out: torch.Tensor,
    residual: torch.Tensor,
    b_in: torch.Tensor | None = None,
    b_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``residual + linear_out(silu(a) * b)``, ``[a, b] = linear_in(x)``: SwiGLU with its gate and up
    projections as one GEMM (Qwen3's gate|up, Moshi's ``ActivationGating``)."""
    h = F.linear(x, w_in, b_in)
    half = h.shape[-1] // 2
    return linear_add(residual, F.silu(h[..., :half]) * h[..., half:], w_out, b_out)


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


@dataclass(frozen=True, slots=True)
class KeyMask:
    """A mask as ``attend`` takes it (additive or bool) with each batch row's count of leading key
    columns that may be visible, ``visible (B,)`` int32: keys at or past it are masked in ``mask`` too, so
    the decode kernel need not read them (a young stream in a batch of old ones reads its own keys only)."""

    mask: torch.Tensor
    visible: torch.Tensor


DECODE_KERNEL: Literal["auto", "always", "never"] = "auto"
"""``attend``'s choice of the decode kernel: ``auto`` where it pays (CUDA, few query rows per KV head,
``DECODE_MIN_KEYS`` keys or more, D of 64 or 128); ``always`` wherever it can run (tests, under Triton's
interpreter); ``never``: the GEMMs (benchmarks' baseline)."""
DECODE_MIN_KEYS = 256
DECODE_MAX_ROWS = 16
"""Query rows per KV head (S * G) up to which attention is decode-shaped."""


@functools.cache
def _triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def _decode_kernels_on(device: torch.device) -> bool:
    """Whether the decode kernels (attention, the FP8 column writes) may run on ``device``."""
    if DECODE_KERNEL == "never" or not _triton_importable():
        return False
    if DECODE_KERNEL == "always":
        from realtime_gw.models.fused import available

        return available(device)
    return device.type == "cuda"


def _use_decode_kernel(q: torch.Tensor, keys: int, rows: int, quantized: bool) -> bool:
    if q.shape[-1] not in (64, 128) or q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    if torch.is_grad_enabled() and q.requires_grad:  # the kernel has no backward (RTC's guidance needs one)
        return False
    if not _decode_kernels_on(q.device):
        return False
    return DECODE_KERNEL == "always" or quantized or (keys >= DECODE_MIN_KEYS and rows <= DECODE_MAX_ROWS)


def attend(
    q: torch.Tensor,
    k: torch.Tensor | ScaledKv,
    v: torch.Tensor | ScaledKv,
    mask: torch.Tensor | KeyMask | None,
    scale: float,
    fused: bool = False,
) -> torch.Tensor:
    """Grouped-query attention without repeating K/V: q ``(B, S, H, D)`` over k/v ``(B, KV, L, D)``
    (column slices of a cache are fine; ``ScaledKv``: FP8 with per-column scales) -> ``(B, S, H * D)``.

    Query heads sharing a KV head are folded into the query axis, query-major (row ``s * G + g``, head
    ``kv * G + g``). ``mask``: additive (``additive_mask``) or bool, broadcastable to
    ``(B, KV, S * G, L)``, or a ``KeyMask``. ``fused`` runs PyTorch's SDPA (long query sequences);
    decode shapes on CUDA run ``fused.attention.decode``; otherwise two batched GEMMs and a softmax
    (float32 inside)."""
    b, s, h, d = q.shape
    kvh, keys = k.shape[1], k.shape[2]
    g = h // kvh
    visible = None
    if isinstance(mask, KeyMask):
        mask, visible = mask.mask, mask.visible
    quantized = isinstance(k, ScaledKv)
    if not fused and _use_decode_kernel(q, keys, s * g, quantized):
        from realtime_gw.models.fused.attention import decode

        if isinstance(k, ScaledKv) and isinstance(v, ScaledKv):
            return decode(q, k.data, v.data, mask, scale, visible=visible, k_scale=k.scale, v_scale=v.scale)
        assert isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
        return decode(q, k, v, mask, scale, visible=visible)
    if isinstance(k, ScaledKv):
        k = k.dequantize(q.dtype)
    if isinstance(v, ScaledKv):
        v = v.dequantize(q.dtype)
    qf = q.view(b, s, kvh, g, d).transpose(1, 2).reshape(b, kvh, s * g, d)
    if fused:
        out = F.scaled_dot_product_attention(qf, k, v, attn_mask=mask, scale=scale)
    else:
        out = _attend_gemm(qf, k, v, mask, scale)
    return out.view(b, kvh, s, g, d).transpose(1, 2).reshape(b, s, h * d)


def rope_attend(
    qk: torch.Tensor,
    v: torch.Tensor,
    heads: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    write: Callable[[torch.Tensor, torch.Tensor], None],
    keys: torch.Tensor | ScaledKv,
    values: torch.Tensor | ScaledKv,
    mask: torch.Tensor | KeyMask | None,
    scale: float,
) -> torch.Tensor:
    """A decode layer's attention after its QKV projection (``qkv_heads``, and its q/k norms if any):
    rotary on the query and key heads ``qk (B, S, heads + KV, D)``, the new K/V ``(B, KV, S, D)`` stored
    by ``write`` before attention reads ``keys``/``values`` -> ``(B, S, heads * D)``."""
    qk = apply_rope(qk, cos, sin)
    write(qk[:, :, heads:].transpose(1, 2), v.transpose(1, 2))
    return attend(qk[:, :, :heads], keys, values, mask, scale)


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
def write_columns(cache: torch.Tensor, scale: torch.Tensor | None, idx: torch.Tensor, x: torch.Tensor) -> None:
    """``x (B, KV, S, D)`` into ``cache`` at columns ``idx`` (``(B, KV, S, D)``, as ``scatter_``); an FP8
    cache gets ``x`` quantized per (row, head, column) and each column's scale into ``scale (B, KV, L)``."""
    if scale is None:
        cache.scatter_(2, idx, x)
        return
    data, sc = quantize_rows(x)
    cache.view(torch.uint8).scatter_(2, idx, data.view(torch.uint8))  # scatter has no FP8 kernels
    scale.scatter_(2, idx[..., 0], sc[..., 0])


def layers_at_positions(
    layers: Sequence[Any],
    h: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: Sequence[torch.Tensor],
    v_cache: Sequence[torch.Tensor],
    cols: torch.Tensor,
    length: int,
    mask_add: torch.Tensor | KeyMask,
    scales: tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]] | None = None,
) -> torch.Tensor:
    """``layers`` for rows ``[0, b)`` whose queries sit at different positions: row r's K/V are written at
    its cache columns ``cols[r]`` (``(b,)`` for one position a row, ``(b, S)`` for S), by scatter;
    attention reads columns ``[0, length)``. ``scales``: (K scales, V scales) ``(slots, KV, L)`` of FP8
    caches (layers then read ``ScaledKv`` s)."""
    b = h.shape[0]
    cols = cols.view(b, -1)
    for i, layer in enumerate(layers):
        kc, vc = k_cache[i][:b], v_cache[i][:b]
        ks, vs = (scales[0][i][:b], scales[1][i][:b]) if scales is not None else (None, None)
        idx = cols[:, None, :, None].expand(b, kc.shape[1], cols.shape[1], kc.shape[3])

        def write(
            k: torch.Tensor,
            v: torch.Tensor,
            kc: torch.Tensor = kc,
            vc: torch.Tensor = vc,
            ks: torch.Tensor | None = ks,
            vs: torch.Tensor | None = vs,
            idx: torch.Tensor = idx,
        ) -> None:
            if ks is not None and vs is not None and _decode_kernels_on(k.device):
                from realtime_gw.models.fused.attention import write_fp8

                write_fp8(k, v, cols, kc, vc, ks, vs)  # one kernel for what is ~20 small ones eagerly
                return
            write_columns(kc, ks, idx, k)
            write_columns(vc, vs, idx, v)

        keys: torch.Tensor | ScaledKv = kc[:, :, :length]
        values: torch.Tensor | ScaledKv = vc[:, :, :length]
        if ks is not None and vs is not None:
            keys, values = ScaledKv(kc[:, :, :length], ks[:, :, :length]), ScaledKv(vc[:, :, :length], vs[:, :, :length])
        h = layer(h, cos, sin, write, keys, values, mask_add)
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


def fine_buckets(limit: int, fine_from: int = 32, per_doubling: int = 4) -> list[int]:
    """Powers of two up to ``fine_from``, then ``per_doubling`` evenly spaced sizes in each doubling above
    it, then ``limit`` itself: [1, 2, 4, 8, 16, 32, 40, 48, 56, 64, 80, ...]. For a step whose time grows
    with the batch (attention over a long context), a batch pays at most ~1/``per_doubling`` of a
    doubling in padding above ``fine_from``, not up to half of it."""
    out = pow2_buckets(min(limit, fine_from), 1)[:-1]
    low = fine_from
    while low < limit:
        out += [low + low * i // per_doubling for i in range(per_doubling)]
        low *= 2
    return sorted({b for b in out if b < limit}) + [limit]


def chosen_buckets(chosen: Sequence[int], limit: int) -> list[int]:
    """The batch buckets a setting names, up to ``limit`` (the slots): those below it, and ``limit``."""
    if any(b < 1 for b in chosen):
        raise ValueError(f"batch buckets must be positive batch sizes, got {list(chosen)}")
    return sorted({b for b in chosen if b < limit} | {limit})


def bucket_for(buckets: Sequence[int], n: int) -> int:
    """The smallest of the (ascending) ``buckets`` that holds ``n``."""
    i = bisect.bisect_left(buckets, n)
    if i == len(buckets):
        raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")
    return buckets[i]
