"""Triton kernels of the small decoders' fused layers, and their launchers (imported lazily:
``realtime_gw.models.fused.available`` says whether they can run).

Decode at small batch is a chain of GEMVs over bf16 weights, each cheap; what costs is the number of
kernels. These fold a decoder layer into six (seven when attention splits a long cache):

- ``linear``: ``y = epilogue(prologue(x) @ W.T)`` with the RMSNorm (static weight, or per-batch-row
  scale and shift: π0.5's adaptive norm) in the prologue, the input rows optionally gathered from an
  embedding table, and in the epilogue the bias, a (gated) residual add or SwiGLU/GeGLU over a fused
  gate|up matrix. Few rows: a broadcast-multiply GEMV over many thin column tiles (enough programs to
  keep HBM busy); 16 rows or more: ``tl.dot`` tiles.
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

ACT_SILU, ACT_GELU_TANH = 1, 2
GEMV_BLOCK_N, GEMV_BLOCK_K = 8, 256
"""The GEMV tiles (weight rows, and columns a step, at 1-2 input rows): thin, for many programs."""
INTERPRETED = interpreted()
EPI_STORE, EPI_RESIDUAL, EPI_GLU = 0, 1, 2


@triton.jit
def _act(x, ACT: tl.constexpr):
    if ACT == 1:
        y = x / (1.0 + tl.exp(-x))
    else:  # GELU, tanh approximation (Gemma's gelu_pytorch_tanh); 1 + tanh(u) = 2 / (1 + e^-2u)
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        y = 0.5 * x * (2.0 / (1.0 + tl.exp(-2.0 * u)))
    return y


@triton.jit
def _linear_kernel(
    x_ptr, idx_ptr, w_ptr, b_ptr, y_ptr, res_ptr, nw_ptr, nb_ptr, gate_ptr,
    M, N, K, HALF_ROWS,
    sxm, s_idx, sym, srm, rows_per_group, s_nw, s_nb, s_gate, eps,
    NORM: tl.constexpr, NORM_SHIFT: tl.constexpr, GATHER: tl.constexpr, HAS_BIAS: tl.constexpr,
    EPI: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    if GATHER:
        rows = tl.load(idx_ptr + rm * s_idx, mask=m_ok, other=0).to(tl.int64)
    else:
        rows = rm.to(tl.int64)
    x_rows = x_ptr + rows * sxm
    grp = rm // rows_per_group
    if NORM:
        ss = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            xv = tl.load(x_rows[:, None] + rk[None, :], mask=m_ok[:, None] & (rk < K)[None, :], other=0.0)
            xf = xv.to(tl.float32)
            ss += tl.sum(xf * xf, axis=1)
        rstd = 1.0 / tl.sqrt(ss / K + eps)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        xk_mask = m_ok[:, None] & k_ok[None, :]
        xv = tl.load(x_rows[:, None] + rk[None, :], mask=xk_mask, other=0.0)
        if NORM:
            nw = tl.load(nw_ptr + grp[:, None] * s_nw + rk[None, :], mask=xk_mask, other=0.0)
            xf = xv.to(tl.float32) * rstd[:, None] * nw.to(tl.float32)
            if NORM_SHIFT:
                xf += tl.load(nb_ptr + grp[:, None] * s_nb + rk[None, :], mask=xk_mask, other=0.0).to(
                    tl.float32
                )
            xv = xf
        wk_mask = n_ok[:, None] & k_ok[None, :]
        w = tl.load(w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :], mask=wk_mask, other=0.0)
        xv = xv.to(w.dtype)  # the normalized input rounds to the model dtype, as the eager norm's output
        if DOT:
            if IEEE:
                acc += tl.dot(xv, tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(xv, tl.trans(w))
        else:
            acc += tl.sum(xv.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
        if EPI == 2:
            w2 = tl.load(
                w_ptr + (rn[:, None] + HALF_ROWS).to(tl.int64) * K + rk[None, :], mask=wk_mask, other=0.0
            )
            if DOT:
                if IEEE:
                    acc2 += tl.dot(xv, tl.trans(w2), input_precision="ieee")
                else:
                    acc2 += tl.dot(xv, tl.trans(w2))
            else:
                acc2 += tl.sum(xv.to(tl.float32)[:, None, :] * w2.to(tl.float32)[None, :, :], axis=2)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if EPI == 2:
            acc2 += tl.load(b_ptr + HALF_ROWS + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out_mask = m_ok[:, None] & n_ok[None, :]
    if EPI == 2:
        y = _act(acc, ACT) * acc2
    elif EPI == 1:
        r = tl.load(res_ptr + rm[:, None].to(tl.int64) * srm + rn[None, :], mask=out_mask, other=0.0)
        if GATED:
            g = tl.load(gate_ptr + grp[:, None] * s_gate + rn[None, :], mask=out_mask, other=0.0)
            y = r.to(tl.float32) + g.to(tl.float32) * acc
        else:
            y = r.to(tl.float32) + acc
    else:
        y = acc
    tl.store(
        y_ptr + rm[:, None].to(tl.int64) * sym + rn[None, :], y.to(y_ptr.dtype.element_ty), mask=out_mask
    )


def _pow2(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, triton.next_power_of_2(max(1, n))))


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm: torch.Tensor | None = None,
    norm_shift: torch.Tensor | None = None,
    eps: float = 1e-6,
    rows_per_group: int = 1,
    residual: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    glu: int = 0,
    gather: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``x (M, K)`` (rows may be strided) or, with ``gather``, rows ``gather (M,)`` of the table ``x``,
    times ``w (N, K).T``.

    ``norm``: RMSNorm of each row first, times ``norm`` (``(K,)``, or ``(groups, K)``: group = row //
    ``rows_per_group``), plus ``norm_shift`` (same layout) when given. Epilogue: ``+ bias``; then
    ``residual + y`` (``residual + gate * y`` with ``gate (groups, N)``), or with ``glu`` (ACT_SILU /
    ACT_GELU_TANH) ``act(y[:, :N/2]) * y[:, N/2:]`` over a fused gate|up ``w``."""
    n_rows_w, k = w.shape
    assert w.is_contiguous() and x.stride(-1) == 1
    m = gather.shape[0] if gather is not None else x.shape[0]
    n = n_rows_w // 2 if glu else n_rows_w
    y = out if out is not None else torch.empty(m, n, device=x.device, dtype=out_dtype or w.dtype)
    dot = m >= 16
    if dot:
        block_m, block_k = _pow2(m, 16, 64), _pow2(k, 16, 64)
        block_n = 32 if n >= 2048 else 16  # enough column tiles to spread one GEMM over the SMs
    else:
        block_m, block_k = _pow2(m, 2, 8), _pow2(k, 16, GEMV_BLOCK_K if m <= 2 else 128)
        block_n = GEMV_BLOCK_N if n <= 2048 or m > 2 else 2 * GEMV_BLOCK_N
    if INTERPRETED:  # one program per row block: the interpreter runs programs one after another
        block_m, block_n, block_k = _pow2(m, 2, 64), _pow2(n, 16, 256), _pow2(k, 16, 256)
    dummy = w
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    nw = norm if norm is not None else dummy
    nb = norm_shift if norm_shift is not None else dummy
    g = gate if gate is not None else dummy
    res = residual if residual is not None else dummy
    _linear_kernel[grid](
        x, gather if gather is not None else dummy, w, bias if bias is not None else dummy, y, res, nw, nb, g,
        m, n, k, n,
        x.stride(0), gather.stride(0) if gather is not None else 0, y.stride(0), residual.stride(0) if residual is not None else 0,
        rows_per_group,
        nw.stride(0) if norm is not None and norm.dim() == 2 else 0,
        nb.stride(0) if norm_shift is not None and norm_shift.dim() == 2 else 0,
        g.stride(0) if gate is not None and gate.dim() == 2 else 0,
        eps,
        NORM=norm is not None, NORM_SHIFT=norm_shift is not None, GATHER=gather is not None,
        HAS_BIAS=bias is not None, EPI=EPI_GLU if glu else EPI_RESIDUAL if residual is not None else EPI_STORE,
        GATED=gate is not None, ACT=glu or ACT_SILU, DOT=dot, IEEE=w.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=4,
    )  # fmt: skip
    return y


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
