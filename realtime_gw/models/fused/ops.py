"""Triton kernels of the small decoders' fused layers, and their launchers (imported lazily:
``realtime_gw.models.fused.available`` says whether they can run).

Decode at small batch is a chain of GEMVs over bf16 weights, each cheap; what costs is the number of
kernels. These fold a decoder layer into six (seven when attention splits a long cache):

- ``linear``: ``y = epilogue(prologue(x) @ W.T)`` with the RMSNorm (static weight, or per-batch-row
  scale and shift: π0.5's adaptive norm) in the prologue, the input rows optionally gathered from an
  embedding table, and in the epilogue the bias, a (gated) residual add or SwiGLU/GeGLU over a fused
  gate|up matrix (``gemm``: its tiles, K split over programs where the tiles are few, chosen per shape
  by timing on the device).
- ``rope_write``: q/k head norms (Qwen3), rotary (sign-folded sin, as ``kernels.apply_rope``), the new
  K/V into their cache columns, the query heads out.
- attention: ``fused.attention`` (grouped-query attention of few queries over a cache, split over
  programs when the cache is long), shared with ``kernels.attend``.
- ``sample``: greedy or top-k sampling of one row per program, on draws the caller made with torch's
  generator (so the codes equal the eager sampler's, draw for draw).

Float32 inputs use IEEE dots (no TF32): the parity tests compare them to the eager path. Every kernel
runs under Triton's interpreter (``TRITON_INTERPRET=1``) on CPU tensors, which is how the test suite
checks them.
"""

# ruff: noqa: SIM108  (a Triton kernel branches on constexprs in statements, not expressions)
from __future__ import annotations

import torch
import triton
import triton.language as tl

from realtime_gw.models.fused import interpreted
from realtime_gw.models.fused.gemm import (  # noqa: F401  (the linear layer's public names, here too)
    ACT_GELU_TANH,
    ACT_SILU,
    EPI_GLU,
    EPI_RESIDUAL,
    EPI_STORE,
    linear,
)

INTERPRETED = interpreted()


def _pow2(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, triton.next_power_of_2(max(1, n))))


@triton.jit
def _rope_write_kernel(
    qkv_ptr, q_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, qkn_ptr, cols_ptr,
    S, H, KVH, D, HALF, col0,
    s_qkv, s_q, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_cb, s_cs, eps,
    QK_NORM: tl.constexpr, ROW_COLS: tl.constexpr, BLOCK_HEADS: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    m = tl.program_id(0)
    b, s = m // S, m % S
    if ROW_COLS:  # each batch row writes its own cache column (the talker: streams at their own positions)
        col = tl.load(cols_ptr + b).to(tl.int32) + s
    else:
        col = col0 + s
    hh = tl.arange(0, BLOCK_HEADS)[:, None]  # q heads, then k heads, then v heads
    d = tl.arange(0, BLOCK_H)[None, :]
    ok = (hh < H + 2 * KVH) & (d < HALF)
    base = qkv_ptr + m.to(tl.int64) * s_qkv + hh * D
    lo_in = tl.load(base + d, mask=ok, other=0.0)
    dt = lo_in.dtype
    lo = lo_in.to(tl.float32)
    hi = tl.load(base + HALF + d, mask=ok, other=0.0).to(tl.float32)
    rot = hh < H + KVH  # q and k heads: norms and rotary; v heads pass through
    if QK_NORM:  # rms_norm (model dtype out), then the head's weight (model dtype), as the eager layer
        r = 1.0 / tl.sqrt((tl.sum(lo * lo, axis=1) + tl.sum(hi * hi, axis=1)) / D + eps)[:, None]
        w_lo = tl.load(qkn_ptr + hh * D + d, mask=ok & rot, other=0.0).to(tl.float32)
        w_hi = tl.load(qkn_ptr + hh * D + HALF + d, mask=ok & rot, other=0.0).to(tl.float32)
        lo = tl.where(rot, ((lo * r).to(dt).to(tl.float32) * w_lo).to(dt).to(tl.float32), lo)
        hi = tl.where(rot, ((hi * r).to(dt).to(tl.float32) * w_hi).to(dt).to(tl.float32), hi)
    c = cos_ptr + b * s_cb + s * s_cs + d
    t = sin_ptr + b * s_cb + s * s_cs + d
    d_ok = d < HALF
    c_lo = tl.load(c, mask=d_ok, other=0.0).to(tl.float32)
    c_hi = tl.load(c + HALF, mask=d_ok, other=0.0).to(tl.float32)
    s_lo = tl.load(t, mask=d_ok, other=0.0).to(tl.float32)
    s_hi = tl.load(t + HALF, mask=d_ok, other=0.0).to(tl.float32)
    # x * cos + roll(x, D/2) * sin_signed: the roll swaps the halves
    lo, hi = tl.where(rot, lo * c_lo + hi * s_lo, lo), tl.where(rot, hi * c_hi + lo * s_hi, hi)
    is_q = hh < H
    is_k = rot & (hh >= H)
    q_dst = q_ptr + m.to(tl.int64) * s_q + hh * D + d
    k_dst = kc_ptr + b.to(tl.int64) * s_kb + (hh - H) * s_kh + col * s_kl + d
    v_dst = vc_ptr + b.to(tl.int64) * s_vb + (hh - H - KVH) * s_vh + col * s_vl + d
    tl.store(q_dst, lo.to(dt), mask=ok & is_q)
    tl.store(q_dst + HALF, hi.to(dt), mask=ok & is_q)
    tl.store(k_dst, lo.to(dt), mask=ok & is_k)
    tl.store(k_dst + HALF, hi.to(dt), mask=ok & is_k)
    tl.store(v_dst, lo.to(dt), mask=ok & ~rot)
    tl.store(v_dst + HALF, hi.to(dt), mask=ok & ~rot)


def rope_write(
    qkv: torch.Tensor,
    seq: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    col0: int,
    qk_norm: torch.Tensor | None = None,
    qk_eps: float = 1e-6,
    cols: torch.Tensor | None = None,
) -> torch.Tensor:
    """``qkv (B * seq, (heads + 2 kv_heads) * D)`` -> the query heads ``(B * seq, heads * D)``; the key
    and value heads go to cache columns ``col0 + s`` (``cols[b] + s`` with ``cols (B,)``) of
    ``k_cache``/``v_cache (B, KV, L, D)``.
    ``cos``/``sin`` (signed, ``kernels.rope_cos_sin``): ``(seq, D)``, or ``(B, seq, ..., D)``."""
    m = qkv.shape[0]
    q = torch.empty(m, heads * head_dim, device=qkv.device, dtype=qkv.dtype)
    s_cb, s_cs = (0, cos.stride(0)) if cos.dim() == 2 else (cos.stride(0), cos.stride(1))
    assert cos.stride() == sin.stride() and cos.stride(-1) == 1 and k_cache.stride(-1) == 1
    half = head_dim // 2
    _rope_write_kernel[(m,)](
        qkv, q, k_cache, v_cache, cos, sin, qk_norm if qk_norm is not None else qkv,
        cols if cols is not None else qkv, seq, heads, kv_heads, head_dim, half, col0,
        qkv.stride(0), q.stride(0), *k_cache.stride()[:3], *v_cache.stride()[:3], s_cb, s_cs, qk_eps,
        QK_NORM=qk_norm is not None, ROW_COLS=cols is not None, BLOCK_HEADS=triton.next_power_of_2(heads + 2 * kv_heads),
        BLOCK_H=triton.next_power_of_2(half), num_warps=4,
    )  # fmt: skip
    return q


@triton.jit
def _kth_largest(s, k):
    """The k-th largest of ``s`` (float32), by a binary search over the order-preserving integer keys
    of its bits: 32 counting passes over the row instead of a sort."""
    bits = s.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
    lo = tl.full([], -2147483648, tl.int64)
    hi = tl.full([], 2147483647, tl.int64)
    for _ in range(32):
        mid = lo + (hi - lo + 1) // 2
        many = tl.sum((key >= mid).to(tl.int32)) >= k
        lo = tl.where(many, mid, lo)
        hi = tl.where(many, hi, mid - 1)
    kb = lo.to(tl.int32)
    return tl.where(kb >= 0, kb, kb ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _sample_kernel(
    logits_ptr, draws_ptr, out_ptr, V, s_l, s_d, s_o, temperature, top_k,
    DO_SAMPLE: tl.constexpr, TOP_K: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    v = tl.arange(0, BLOCK_V)
    ok = v < V
    x = tl.load(logits_ptr + row * s_l + v, mask=ok, other=float("-inf")).to(tl.float32)
    if DO_SAMPLE:
        s = x / temperature
        if TOP_K:  # keep what is >= the k-th largest (ties kept), as the eager masked_fill(s < kth)
            s = tl.where(s < _kth_largest(s, top_k), float("-inf"), s)
        e = tl.exp(s - tl.max(s))
        p = e / tl.sum(e)
        q = tl.load(draws_ptr + row * s_d + v, mask=ok, other=1.0)
        x = tl.where(ok, p / q, -1.0)
    tl.store(out_ptr + row * s_o, tl.argmax(x, 0).to(tl.int64))


def sample(
    logits: torch.Tensor,
    out: torch.Tensor,
    do_sample: bool,
    temperature: float,
    top_k: int,
    draws: torch.Tensor | None = None,
) -> None:
    """``talker.sample`` in one kernel: codes of ``logits (b, V)`` into ``out (b,)`` (int64, may be a
    strided column). Sampling takes ``draws``: ``Exp(1)`` draws ``(b, V)`` float32 (the eager sampler's
    ``exponential_``, made by the caller on torch's generator)."""
    b, vocab = logits.shape
    k = min(top_k, vocab)
    if do_sample:
        assert draws is not None and draws.shape == logits.shape and draws.stride(-1) == 1
    _sample_kernel[(b,)](
        logits, draws if draws is not None else logits, out, vocab,
        logits.stride(0), draws.stride(0) if draws is not None else 0, out.stride(0), temperature, k,
        DO_SAMPLE=do_sample, TOP_K=do_sample and k > 0, BLOCK_V=triton.next_power_of_2(vocab),
        num_warps=4,
    )  # fmt: skip
