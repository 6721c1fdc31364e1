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
- ``attention``: grouped-query attention of few queries over a cache, online softmax, rows in
  ``kernels.attend``'s folded order (``s * groups + g``), an additive mask or a causal bound (per batch
  row or shared); a long cache's keys split over programs and merged by a second kernel.
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
from realtime_gw.models.fused.tuning import Tuner

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
def _attention_kernel(
    q_ptr, kc_ptr, vc_ptr, mask_ptr, o_ptr, pos_ptr, part_o_ptr, part_ml_ptr,
    S, G, KVH, L, D, col0, scale, split_len, M, H,
    s_q, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mr, s_o,
    CAUSAL: tl.constexpr, ROW_POS: tl.constexpr, HAS_MASK: tl.constexpr, IEEE: tl.constexpr,
    SPLIT: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_q, bh, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, kh = bh // KVH, bh % KVH
    r = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)  # folded query rows s * G + g
    r_ok = r < S * G
    s, g = r // G, r % G
    tok = (b * S + s).to(tl.int64)
    head = kh * G + g
    if ROW_POS:  # causal from each batch row's own position
        base = tl.load(pos_ptr + b).to(tl.int32)
    else:
        base = col0
    dd = tl.arange(0, BLOCK_D)
    d_ok = dd < D
    q_mask = r_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + tok[:, None] * s_q + head[:, None] * D + dd[None, :], mask=q_mask, other=0.0)
    k_base = kc_ptr + b.to(tl.int64) * s_kb + kh * s_kh
    v_base = vc_ptr + b.to(tl.int64) * s_vb + kh * s_vh
    m_i = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], dtype=tl.float32)
    l_start = pid_s * split_len  # this program's share of the keys (all of them without SPLIT)
    l_end = tl.minimum(L, l_start + split_len)
    for l0 in range(l_start, l_end, BLOCK_L):
        lj = l0 + tl.arange(0, BLOCK_L)
        l_ok = lj < l_end
        kv_mask = l_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + lj[:, None] * s_kl + dd[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + lj[:, None] * s_vl + dd[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            sc = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        else:
            sc = tl.dot(q, tl.trans(k)) * scale
        if HAS_MASK:
            am = tl.load(
                mask_ptr + b.to(tl.int64) * s_mb + r[:, None] * s_mr + lj[None, :],
                mask=r_ok[:, None] & l_ok[None, :],
                other=0.0,
            )
            sc += am.to(tl.float32)
        if CAUSAL:
            sc = tl.where(lj[None, :] <= base + s[:, None], sc, float("-inf"))
        sc = tl.where(l_ok[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key yet stays 0
        p = tl.exp(sc - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if SPLIT:  # partial results, merged by _combine_kernel: (split, token, head) rows
        part = (pid_s * M + tok) * H + head
        tl.store(part_o_ptr + part[:, None] * D + dd[None, :], acc, mask=q_mask)
        tl.store(part_ml_ptr + part * 2, m_i, mask=r_ok)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=r_ok)
    else:
        out = acc / l_i[:, None]
        tl.store(
            o_ptr + tok[:, None] * s_o + head[:, None] * D + dd[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=q_mask,
        )


@triton.jit
def _combine_kernel(
    part_o_ptr, part_ml_ptr, o_ptr, M, H, D, SPLITS, s_o,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    tok, head = tl.program_id(0), tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    sp_ok = sp < SPLITS
    dd = tl.arange(0, BLOCK_D)
    d_ok = dd < D
    part = (sp * M + tok).to(tl.int64) * H + head
    m_s = tl.load(part_ml_ptr + part * 2, mask=sp_ok, other=float("-inf"))
    l_s = tl.load(part_ml_ptr + part * 2 + 1, mask=sp_ok, other=0.0)
    m_all = tl.max(m_s, axis=0)
    w = tl.where(m_s == float("-inf"), 0.0, tl.exp(m_s - m_all))
    acc = tl.load(
        part_o_ptr + part[:, None] * D + dd[None, :], mask=sp_ok[:, None] & d_ok[None, :], other=0.0
    )
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l_s * w, axis=0)
    tl.store(o_ptr + tok.to(tl.int64) * s_o + head * D + dd, out.to(o_ptr.dtype.element_ty), mask=d_ok)


TARGET_PROGRAMS = 128
"""Attention over a long cache splits its keys until about this many programs run (flash-decoding):
with few queries, one program per query block would leave most SMs idle. The tuner also tries twice this,
and 64-row query blocks where there are that many rows (fewer re-reads of the keys: PI0's 408)."""
ATTENTION_TUNER = Tuner("fused attention")


def _attention_plans(rows: int, programs_per_q: int, length: int, d: int, cap: int) -> list[tuple[int, int, int]]:
    """(query block, key block, split length) candidates, the default first, without duplicates."""
    block_d = _pow2(d, 16, 256)
    block_l = 16 if length <= 16 else 32 if block_d >= 128 else 64
    shapes = [(_pow2(rows, 16, 32), TARGET_PROGRAMS)]
    if not INTERPRETED:
        shapes.append((shapes[0][0], 2 * TARGET_PROGRAMS))
        if rows >= 64 and block_d <= 256:
            shapes.append((64, TARGET_PROGRAMS))
    plans = []
    for block_q, target in shapes:
        programs = triton.cdiv(rows, block_q) * programs_per_q
        splits = min(triton.cdiv(length, block_l), max(1, target // programs), cap)
        plans.append((block_q, block_l, triton.cdiv(triton.cdiv(length, splits), block_l) * block_l))
    return list(dict.fromkeys(plans))


def attention(
    q: torch.Tensor,
    seq: int,
    heads: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    length: int,
    scale: float,
    *,
    causal_from: int | torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    max_splits: int | None = None,
) -> torch.Tensor:
    """Queries ``q (B * seq, heads * D)`` over cache columns ``[0, length)`` of ``k_cache``/``v_cache
    (B, KV, L, D)`` -> ``(B * seq, heads * D)``. ``causal_from``: query s sees columns ``<= causal_from +
    s`` (a ``(B,)`` tensor: each batch row's own); ``mask``: additive ``(B or 1, 1, seq * groups, >=
    length)`` in ``kernels.additive_mask``'s rows. A long cache is split over several programs, then
    merged (``max_splits`` caps the split count; 1: one pass). The query block and split count are the
    fastest of a few for the shape, timed on the device on its first call (``ATTENTION_TUNER``)."""
    m = q.shape[0]
    bsz, kvh, _, d = k_cache.shape
    groups = heads // kvh
    o = torch.empty_like(q)
    rows = seq * groups
    block_d = _pow2(d, 16, 256)
    s_mb = 0 if mask is None or mask.shape[0] == 1 else mask.stride(0)
    assert m % seq == 0 and m // seq <= bsz
    cap = max_splits or (4 if INTERPRETED else 64)  # the interpreter runs programs one by one
    flags = dict(
        CAUSAL=causal_from is not None, ROW_POS=isinstance(causal_from, torch.Tensor), HAS_MASK=mask is not None,
        IEEE=q.dtype == torch.float32,
    )  # fmt: skip

    def launch(plan: tuple[int, int, int]) -> None:
        block_q, block_l, split_len = plan
        splits = triton.cdiv(length, split_len)
        part_o = part_ml = q
        if splits > 1:
            part_o = torch.empty(splits, m, heads, d, device=q.device, dtype=torch.float32)
            part_ml = torch.empty(splits, m, heads, 2, device=q.device, dtype=torch.float32)
        _attention_kernel[(triton.cdiv(rows, block_q), (m // seq) * kvh, splits)](
            q, k_cache, v_cache, mask if mask is not None else q, o,
            causal_from if isinstance(causal_from, torch.Tensor) else q, part_o, part_ml,
            seq, groups, kvh, length, d, causal_from if isinstance(causal_from, int) else 0, scale, split_len, m, heads,
            q.stride(0), *k_cache.stride()[:3], *v_cache.stride()[:3], s_mb,
            mask.stride(2) if mask is not None else 0, o.stride(0), **flags, SPLIT=splits > 1,
            BLOCK_Q=block_q, BLOCK_L=block_l, BLOCK_D=block_d, num_warps=8 if block_d >= 128 else 4,
        )  # fmt: skip
        if splits > 1:
            _combine_kernel[(m, heads)](
                part_o, part_ml, o, m, heads, d, splits, o.stride(0),
                BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d, num_warps=4,
            )  # fmt: skip

    plans = _attention_plans(rows, (m // seq) * kvh, length, d, cap)
    key = (m, seq, heads, kvh, d, length, cap, q.dtype, *flags.values())
    launch(ATTENTION_TUNER.pick(key, plans, launch, q.device))
    return o


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
