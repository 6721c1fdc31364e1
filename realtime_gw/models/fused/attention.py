"""Grouped-query attention of few queries over a long K/V cache (flash-decoding), in Triton; imported
lazily (``realtime_gw.models.fused.available`` says whether it can run).

Decode attention reads the whole cache for one or two query rows per KV head: it is bound by the bytes of
K and V, and a batched GEMV (cuBLAS's ``gemv``, two of them around a softmax) reaches about a third of
HBM's rate there. One kernel does it instead: each program takes one KV head of one batch row, a block of
folded query rows (``kernels.attend``'s order, row ``s * groups + g``) and a share of the keys (a
*split*), streams K/V blocks with an online softmax in float32, and writes its output, or its partial
(accumulator, max, sum) that ``_combine_kernel`` merges when the keys were split. Splits are chosen so
that a few programs per SM are resident (one row of a short batch would leave most SMs idle).

Two launchers:
- ``attention``: the fused decoders' (``qwen3_frame``, ``pi0_expert``): queries as token rows ``(B *
  seq, heads * D)``, a causal bound (shared or per batch row) or an additive mask shared by the KV heads;
- ``decode``: ``kernels.attend``'s: queries ``(B, S, H, D)`` of any strides, an additive or bool mask
  broadcastable to ``(B, KV, S * G, L)``, each batch row's count of leading key columns that may be
  visible (the kernel does not read K/V past it), and FP8 (e4m3) K/V with a float32 scale per (row,
  head, column), dequantized as they are loaded (half the bytes of bf16).

Masked scores get the mask's value added (``finfo(dtype).min`` for a bool mask's False, as the eager path
converts it), so a row with every key masked averages them, as eager; keys past the cache's end or a
row's visible count are never read. A row that sees no key at all gets zeros. Float32 inputs use IEEE
dots (no TF32). Every kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``) on CPU tensors.
"""

# ruff: noqa: SIM108  (a Triton kernel branches on constexprs in statements, not expressions)
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from realtime_gw.models.fused import interpreted
from realtime_gw.models.fused.tuning import Tuner

INTERPRETED = interpreted()
MASK_NONE, MASK_ADD, MASK_BOOL = 0, 1, 2


@triton.jit
def _attention_kernel(
    q_ptr, kc_ptr, vc_ptr, mask_ptr, o_ptr, pos_ptr, part_o_ptr, part_ml_ptr, vis_ptr, ks_ptr, vs_ptr,
    S, G, KVH, L, D, col0, scale, split_len, M, H, mask_fill,
    s_qb, s_qs, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_mr, s_ml, s_o,
    s_ksb, s_ksh, s_vsb, s_vsh,
    CAUSAL: tl.constexpr, ROW_POS: tl.constexpr, MASK: tl.constexpr, ROW_VISIBLE: tl.constexpr,
    KV_SCALED: tl.constexpr, IEEE: tl.constexpr, SPLIT: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_q, bh, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, kh = bh // KVH, bh % KVH
    b64 = b.to(tl.int64)
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
    q = tl.load(q_ptr + b64 * s_qb + s[:, None] * s_qs + head[:, None] * s_qh + dd[None, :], mask=q_mask, other=0.0)
    if DOT_F32:  # the interpreter's 16-bit dots are wrong: float32 there (IEEE, so the parity is tighter)
        q = q.to(tl.float32)
    k_base = kc_ptr + b64 * s_kb + kh * s_kh
    v_base = vc_ptr + b64 * s_vb + kh * s_vh
    m_base = mask_ptr + b64 * s_mb + kh * s_mh + r[:, None] * s_mr
    m_i = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], dtype=tl.float32)
    l_start = pid_s * split_len  # this program's share of the keys (all of them without SPLIT)
    l_end = tl.minimum(L, l_start + split_len)
    if ROW_VISIBLE:  # keys at or past the row's visible count are masked: not read at all
        l_end = tl.minimum(l_end, tl.load(vis_ptr + b))
    for l0 in range(l_start, l_end, BLOCK_L):
        lj = l0 + tl.arange(0, BLOCK_L)
        l_ok = lj < l_end
        kv_mask = l_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + lj[:, None] * s_kl + dd[None, :], mask=kv_mask, other=0.0).to(q.dtype)
        v = tl.load(v_base + lj[:, None] * s_vl + dd[None, :], mask=kv_mask, other=0.0).to(q.dtype)
        if IEEE or DOT_F32:
            sc = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            sc = tl.dot(q, tl.trans(k))
        if KV_SCALED:  # FP8 keys: each column's scale, with the softmax scale
            ksc = tl.load(ks_ptr + b64 * s_ksb + kh * s_ksh + lj, mask=l_ok, other=0.0)
            sc = sc * (ksc * scale)[None, :]
        else:
            sc = sc * scale
        if MASK == 1:
            am = tl.load(m_base + lj[None, :] * s_ml, mask=r_ok[:, None] & l_ok[None, :], other=0.0)
            sc += am.to(tl.float32)
        elif MASK == 2:
            am = tl.load(m_base + lj[None, :] * s_ml, mask=r_ok[:, None] & l_ok[None, :], other=1)
            sc += tl.where(am != 0, 0.0, mask_fill)
        if CAUSAL:
            sc = tl.where(lj[None, :] <= base + s[:, None], sc, float("-inf"))
        sc = tl.where(l_ok[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key yet stays 0
        p = tl.exp(sc - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if KV_SCALED:  # FP8 values: each column's scale folded into its probability
            p = p * tl.load(vs_ptr + b64 * s_vsb + kh * s_vsh + lj, mask=l_ok, other=0.0)[None, :]
        if IEEE or DOT_F32:
            pv = tl.dot(p.to(q.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(q.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if SPLIT:  # partial results, merged by _combine_kernel: (split, token, head) rows
        part = (pid_s * M + tok) * H + head
        tl.store(part_o_ptr + part[:, None] * D + dd[None, :], acc, mask=q_mask)
        tl.store(part_ml_ptr + part * 2, m_i, mask=r_ok)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=r_ok)
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # no key seen: zeros
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
    m_all = tl.where(m_all == float("-inf"), 0.0, m_all)  # every split empty: weights 0, not NaN
    w = tl.where(m_s == float("-inf"), 0.0, tl.exp(m_s - m_all))
    acc = tl.load(
        part_o_ptr + part[:, None] * D + dd[None, :], mask=sp_ok[:, None] & d_ok[None, :], other=0.0
    )
    den = tl.sum(l_s * w, axis=0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(den == 0.0, 1.0, den)
    tl.store(o_ptr + tok.to(tl.int64) * s_o + head * D + dd, out.to(o_ptr.dtype.element_ty), mask=d_ok)


TARGET_PROGRAMS = 128
"""``attention`` (the fused decoders) splits a long cache's keys until about this many programs run
(flash-decoding: with few queries, one program per query block would leave most SMs idle). Its tuner
also tries twice this, and 64-row query blocks where there are that many rows (fewer re-reads of the
keys: PI0's 408)."""
ATTENTION_TUNER = Tuner("fused attention")


@dataclass(frozen=True)
class Tiles:
    """``decode``'s launch shape: keys a loop step, warps, software-pipeline stages, and how many programs
    per SM the key splits aim for (``waves``)."""

    block_l: int = 64
    num_warps: int = 4
    num_stages: int = 3
    waves: int = 4


DECODE_TILES = Tiles()
"""The tiles ``decode`` uses unless given others (``loadtest/bench/decode_attention_gpu.py`` sweeps them)."""


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _pow2(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, triton.next_power_of_2(max(1, n))))


def _splits(length: int, block_l: int, programs: int, target: int, cap: int) -> tuple[int, int]:
    """(splits, keys per split): enough splits that about ``target`` programs run, each a whole number
    of key blocks."""
    splits = min(triton.cdiv(length, block_l), max(1, triton.cdiv(target, programs)), cap)
    split_len = triton.cdiv(triton.cdiv(length, splits), block_l) * block_l
    return triton.cdiv(length, split_len), split_len


def _launch(
    q: torch.Tensor,
    q_strides: tuple[int, int, int],
    o: torch.Tensor,
    batch: int,
    seq: int,
    heads: int,
    k: torch.Tensor,
    v: torch.Tensor,
    length: int,
    scale: float,
    splits: int,
    split_len: int,
    block_l: int,
    *,
    mask: torch.Tensor | None = None,
    mask_strides: tuple[int, int, int, int] = (0, 0, 0, 0),
    mask_fill: float = 0.0,
    causal_from: int | torch.Tensor | None = None,
    visible: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    block_q: int | None = None,
) -> torch.Tensor:
    """Both launchers' kernel call: queries of batch rows ``[0, batch)`` -> ``o`` as ``(batch * seq, heads
    * D)`` rows."""
    kvh, d = k.shape[1], k.shape[3]
    rows = seq * (heads // kvh)
    block_q, block_d = block_q or _pow2(rows, 16, 32), _pow2(d, 16, 256)
    m = batch * seq
    part_o = part_ml = q
    if splits > 1:
        part_o = torch.empty(splits, m, heads, d, device=q.device, dtype=torch.float32)
        part_ml = torch.empty(splits, m, heads, 2, device=q.device, dtype=torch.float32)
    kind = MASK_NONE if mask is None else MASK_BOOL if mask.dtype == torch.bool else MASK_ADD
    if kind == MASK_BOOL and mask is not None:
        mask = mask.view(torch.uint8)
    scaled = k_scale is not None and v_scale is not None
    extra = {} if num_stages is None else {"num_stages": num_stages}
    _attention_kernel[(triton.cdiv(rows, block_q), batch * kvh, splits)](
        q, k, v, mask if mask is not None else q, o,
        causal_from if isinstance(causal_from, torch.Tensor) else q, part_o, part_ml,
        visible if visible is not None else q, k_scale if scaled else q, v_scale if scaled else q,
        seq, heads // kvh, kvh, length, d, causal_from if isinstance(causal_from, int) else 0, scale, split_len,
        m, heads, mask_fill,
        *q_strides, *k.stride()[:3], *v.stride()[:3], *mask_strides, o.stride(0),
        *(k_scale.stride()[:2] if scaled else (0, 0)), *(v_scale.stride()[:2] if scaled else (0, 0)),
        CAUSAL=causal_from is not None, ROW_POS=isinstance(causal_from, torch.Tensor), MASK=kind,
        ROW_VISIBLE=visible is not None, KV_SCALED=scaled, IEEE=q.dtype == torch.float32, SPLIT=splits > 1,
        DOT_F32=INTERPRETED and q.dtype != torch.float32,
        BLOCK_Q=block_q, BLOCK_L=block_l, BLOCK_D=block_d, num_warps=num_warps, **extra,
    )  # fmt: skip
    if splits > 1:
        _combine_kernel[(m, heads)](
            part_o, part_ml, o, m, heads, d, splits, o.stride(0),
            BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d, num_warps=4,
        )  # fmt: skip
    return o


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
    kvh, d = k_cache.shape[1], k_cache.shape[3]
    assert m % seq == 0 and m // seq <= k_cache.shape[0]
    rows = seq * (heads // kvh)
    block_d = _pow2(d, 16, 256)
    cap = max_splits or (4 if INTERPRETED else 64)  # the interpreter runs programs one by one
    mask_strides = (0, 0, 0, 0)
    if mask is not None:
        mask_strides = (0 if mask.shape[0] == 1 else mask.stride(0), 0, mask.stride(2), mask.stride(3))
    o = torch.empty_like(q)

    def launch(plan: tuple[int, int, int]) -> None:
        block_q, block_l, split_len = plan
        _launch(
            q, (seq * q.stride(0), q.stride(0), d), o, m // seq, seq, heads, k_cache, v_cache, length, scale,
            triton.cdiv(length, split_len), split_len, block_l, mask=mask, mask_strides=mask_strides,
            causal_from=causal_from, num_warps=8 if block_d >= 128 else 4, block_q=block_q,
        )  # fmt: skip

    plans = _attention_plans(rows, (m // seq) * kvh, length, d, cap)
    key = (m, seq, heads, kvh, d, length, cap, q.dtype, causal_from is not None,
           isinstance(causal_from, torch.Tensor), mask is not None)  # fmt: skip
    launch(ATTENTION_TUNER.pick(key, plans, launch, q.device))
    return o


def _attention_plans(rows: int, programs_per_q: int, length: int, d: int, cap: int) -> list[tuple[int, int, int]]:
    """(query block, key block, split length) candidates for ``attention``, the default first, without
    duplicates."""
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
        splits, split_len = _splits(length, block_l, programs, target, cap)
        plans.append((block_q, block_l, split_len))
    return list(dict.fromkeys(plans))


def decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    *,
    visible: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    tiles: Tiles | None = None,
    max_splits: int | None = None,
) -> torch.Tensor:
    """``kernels.attend`` as one kernel (and a merge): ``q (B, S, H, D)`` over ``k``/``v (B, KV, L, D)``
    (column slices of a cache; FP8 with ``k_scale``/``v_scale (B, KV, L)`` float32) -> ``(B, S, H * D)``.

    ``mask``: additive or bool, broadcastable to ``(B, KV, S * G, L)`` (G = H / KV, rows ``s * G + g``).
    ``visible (B,)`` int32: row b's keys at columns ``>= visible[b]`` are masked (and not read)."""
    b, s, h, d = q.shape
    kvh, length = k.shape[1], k.shape[2]
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    t = tiles or DECODE_TILES
    rows = s * (h // kvh)
    block_l = min(t.block_l, _pow2(length, 16, t.block_l))
    programs = triton.cdiv(rows, _pow2(rows, 16, 32)) * b * kvh
    if INTERPRETED or q.device.type != "cuda":
        target, cap = 4 * programs, max_splits or 4  # the interpreter runs programs one by one
    else:
        target, cap = t.waves * _sm_count(q.device), max_splits or 64
    splits, split_len = _splits(length, block_l, programs, target, cap)
    mask_strides = (0, 0, 0, 0)
    fill = 0.0
    if mask is not None:
        mask = mask.expand(b, kvh, rows, length)
        mask_strides = mask.stride()
        fill = float(torch.finfo(q.dtype).min)
    o = torch.empty(b, s, h * d, device=q.device, dtype=q.dtype)
    _launch(
        q, (q.stride(0), q.stride(1), q.stride(2)), o.view(b * s, h * d), b, s, h, k, v, length, scale,
        splits, split_len, block_l, mask=mask, mask_strides=mask_strides, mask_fill=fill, visible=visible,
        k_scale=k_scale, v_scale=v_scale, num_warps=t.num_warps, num_stages=None if INTERPRETED else t.num_stages,
    )  # fmt: skip
    return o


@triton.jit
def _round_e4m3(y):
    """``y`` (float32, ``|y| <= 448``) rounded to the nearest e4m3 value, ties to even, still in float32:
    the cast that follows is then exact (Triton's interpreter rounds some casts across a power of two
    the wrong way; the GPU's cast would round the same as this)."""
    bits = y.to(tl.int32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000).to(tl.float32, bitcast=True)  # 3 mantissa bits
    a = tl.abs(y)
    small = (a + 16384.0) - 16384.0  # subnormal e4m3: multiples of 2^-9 (float32's step at 2^14)
    return tl.where(a < 0.015625, tl.where(y < 0, -small, small), normal)


@triton.jit
def _quantize_column(
    x_ptr, s_xb, s_xh, s_xs, c_ptr, s_cb, s_ch, s_cl, sc_ptr, s_sb, s_sh, b, h, s, col, D,
    FP8_MAX: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    dd = tl.arange(0, BLOCK_D)
    ok = dd < D
    x = tl.load(x_ptr + b * s_xb + h * s_xh + s * s_xs + dd, mask=ok, other=0.0).to(tl.float32)
    scale = tl.div_rn(tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12), FP8_MAX)
    y = _round_e4m3(tl.clamp(tl.div_rn(x, scale), -FP8_MAX, FP8_MAX))
    tl.store(c_ptr + b * s_cb + h * s_ch + col * s_cl + dd, y.to(c_ptr.dtype.element_ty), mask=ok)
    tl.store(sc_ptr + b * s_sb + h * s_sh + col, scale)


@triton.jit
def _write_fp8_kernel(
    k_ptr, v_ptr, cols_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, S, KVH, D,
    s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_colb, s_cols,
    s_kcb, s_kch, s_kcl, s_vcb, s_vch, s_vcl, s_ksb, s_ksh, s_vsb, s_vsh,
    FP8_MAX: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    h = pid % KVH
    s = (pid // KVH) % S
    b = (pid // (KVH * S)).to(tl.int64)
    col = tl.load(cols_ptr + b * s_colb + s * s_cols)
    _quantize_column(k_ptr, s_kb, s_kh, s_ks, kc_ptr, s_kcb, s_kch, s_kcl, ks_ptr, s_ksb, s_ksh, b, h, s, col, D,
                     FP8_MAX, BLOCK_D)  # fmt: skip
    _quantize_column(v_ptr, s_vb, s_vh, s_vs, vc_ptr, s_vcb, s_vch, s_vcl, vs_ptr, s_vsb, s_vsh, b, h, s, col, D,
                     FP8_MAX, BLOCK_D)  # fmt: skip


def write_fp8(
    k: torch.Tensor,
    v: torch.Tensor,
    cols: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
) -> None:
    """``kernels.write_columns`` for a layer's K and V into FP8 caches in one kernel: ``k``/``v (B, KV, S,
    D)`` quantized per (row, head, position) as ``fp8.quantize_rows`` does, into columns ``cols (B, S)``
    of ``k_cache``/``v_cache (B, KV, L, D)``, their scales into ``k_scale``/``v_scale (B, KV, L)``."""
    b, kvh, s, d = k.shape
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and k_cache.stride(-1) == 1 and k_scale.stride(-1) == 1
    _write_fp8_kernel[(b * s * kvh,)](
        k, v, cols, k_cache, v_cache, k_scale, v_scale, s, kvh, d,
        *k.stride()[:3], *v.stride()[:3], *cols.stride(),
        *k_cache.stride()[:3], *v_cache.stride()[:3], *k_scale.stride()[:2], *v_scale.stride()[:2],
        FP8_MAX=float(torch.finfo(k_cache.dtype).max), BLOCK_D=_pow2(d, 16, 256), num_warps=1,
    )  # fmt: skip
