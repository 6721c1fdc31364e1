"""The fused linear layer (``ops.linear``): ``y = epilogue(prologue(x) @ W.T)`` in one kernel, or two when
its K dimension is split over programs; its tiles chosen per shape on the device (``tuning.Tuner``).

Prologue: the RMSNorm (static weight, or per-batch-row scale and shift: π0.5's adaptive norm), the input
rows optionally gathered from an embedding table. Epilogue: the bias, a (gated) residual add, or
SwiGLU/GeGLU over a fused gate|up matrix.

Tiles by rows (``candidates``): 1-2 rows are a GEMV, a broadcast multiply over thin column tiles (many
programs keep HBM busy; wider K steps, fewer iterations); 3-15 rows either that or ``tl.dot`` tiles of
16 masked rows; from 16 rows ``tl.dot`` tiles. Where the (row, column) tiles are too few to fill the SMs
(a long K over few columns, PI0's down projection: 64 programs of 64 serial steps each), K is split over
programs that write float32 partial sums, and a second kernel adds them in a fixed order and applies the
epilogue (deterministic: the same result at every run).

Float32 inputs use IEEE dots (no TF32): the parity tests compare them to the eager path.
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

ACT_SILU, ACT_GELU_TANH = 1, 2
EPI_STORE, EPI_RESIDUAL, EPI_GLU = 0, 1, 2
INTERPRETED = interpreted()
TUNER = Tuner("fused linear")


@triton.jit
def _act(x, ACT: tl.constexpr):
    if ACT == 1:
        y = x / (1.0 + tl.exp(-x))
    else:  # GELU, tanh approximation (Gemma's gelu_pytorch_tanh); 1 + tanh(u) = 2 / (1 + e^-2u)
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        y = 0.5 * x * (2.0 / (1.0 + tl.exp(-2.0 * u)))
    return y


@triton.jit
def _epilogue(
    acc, acc2, rm, rn, m_ok, n_ok, grp, b_ptr, y_ptr, res_ptr, gate_ptr, HALF_ROWS, sym, srm, s_gate,
    HAS_BIAS: tl.constexpr, EPI: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr,
):  # fmt: skip
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


@triton.jit
def _linear_kernel(
    x_ptr, idx_ptr, w_ptr, b_ptr, y_ptr, res_ptr, nw_ptr, nb_ptr, gate_ptr, part_ptr,
    M, N, K, HALF_ROWS, k_split,
    sxm, s_idx, sym, srm, rows_per_group, s_nw, s_nb, s_gate, eps,
    NORM: tl.constexpr, NORM_SHIFT: tl.constexpr, GATHER: tl.constexpr, HAS_BIAS: tl.constexpr,
    EPI: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr,
    SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    if GATHER:
        rows = tl.load(idx_ptr + rm * s_idx, mask=m_ok, other=0).to(tl.int64)
    else:
        rows = rm.to(tl.int64)
    x_rows = x_ptr + rows * sxm
    grp = rm // rows_per_group
    if NORM:  # the whole row's scale, whatever share of K this program multiplies
        ss = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            xv = tl.load(x_rows[:, None] + rk[None, :], mask=m_ok[:, None] & (rk < K)[None, :], other=0.0)
            xf = xv.to(tl.float32)
            ss += tl.sum(xf * xf, axis=1)
        rstd = 1.0 / tl.sqrt(ss / K + eps)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_lo = pid_k * k_split  # this program's share of K (all of it without SPLIT)
    k_hi = tl.minimum(K, k_lo + k_split)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < k_hi
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
    if SPLIT:  # float32 partial sums (split, M, N), the GLU's second half at column N + n
        width = N * (2 if EPI == 2 else 1)
        part = part_ptr + (pid_k * M + rm[:, None]).to(tl.int64) * width + rn[None, :]
        tl.store(part, acc, mask=m_ok[:, None] & n_ok[None, :])
        if EPI == 2:
            tl.store(part + N, acc2, mask=m_ok[:, None] & n_ok[None, :])
    else:
        _epilogue(acc, acc2, rm, rn, m_ok, n_ok, grp, b_ptr, y_ptr, res_ptr, gate_ptr, HALF_ROWS, sym, srm,
                  s_gate, HAS_BIAS, EPI, GATED, ACT)  # fmt: skip


@triton.jit
def _split_sum_kernel(
    part_ptr, b_ptr, y_ptr, res_ptr, gate_ptr, M, N, HALF_ROWS, SPLITS, sym, srm, rows_per_group, s_gate,
    HAS_BIAS: tl.constexpr, EPI: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    mask = m_ok[:, None] & n_ok[None, :]
    width = N * (2 if EPI == 2 else 1)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for s in range(SPLITS):  # in split order: the same sum at every run
        part = part_ptr + (s * M + rm[:, None]).to(tl.int64) * width + rn[None, :]
        acc += tl.load(part, mask=mask, other=0.0)
        if EPI == 2:
            acc2 += tl.load(part + N, mask=mask, other=0.0)
    _epilogue(acc, acc2, rm, rn, m_ok, n_ok, rm // rows_per_group, b_ptr, y_ptr, res_ptr, gate_ptr, HALF_ROWS,
              sym, srm, s_gate, HAS_BIAS, EPI, GATED, ACT)  # fmt: skip


@dataclass(frozen=True)
class Tiles:
    """One launch config of ``_linear_kernel``: tile shape, ``tl.dot`` or broadcast multiply, how many
    programs share K (``splits``: a target; the launch rounds each share to whole ``block_k`` steps)."""

    block_m: int
    block_n: int
    block_k: int
    dot: bool
    splits: int = 1
    warps: int = 4
    stages: int = 3

    def __str__(self) -> str:
        kind = "dot" if self.dot else "gemv"
        return f"{kind} {self.block_m}x{self.block_n}x{self.block_k} split{self.splits} w{self.warps}"


def _pow2(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, triton.next_power_of_2(max(1, n))))


@functools.cache
def _sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _splits_for(programs: int, k: int, block_k: int, sms: int) -> int:
    """K shares that bring ``programs`` tiles to about two waves of ``sms``, each at least 2 K steps."""
    want = max(1, (2 * sms) // max(1, programs))
    return max(1, min(want, k // (2 * block_k), 16))


def candidates(m: int, n: int, k: int, sms: int = 132) -> list[Tiles]:
    """The configs worth timing for ``m`` rows, ``n`` columns (per GLU half), ``k`` inputs; first the
    default (what runs untimed). Few on purpose: every one is a compile per kernel variant."""
    if INTERPRETED:  # one program per row block: the interpreter runs programs one after another
        return [Tiles(_pow2(m, 2, 64), _pow2(n, 16, 256), _pow2(k, 16, 256), dot=m >= 16)]
    out: list[Tiles] = []
    if m <= 2:
        bm = _pow2(m, 2, 2)
        for bn, bk in ((4, 512), (8, 256), (2, 1024), (4, 1024)):  # at batch 1, 4x512 beat 8x256 by 1.7x
            out.append(Tiles(bm, bn, _pow2(k, 16, bk), dot=False))
    elif m < 16:
        bm = _pow2(m, 4, 16)  # broadcast tiles within ~8K float32 products (registers)
        out += [Tiles(bm, bn, _pow2(k, 16, 8192 // (bm * bn)), dot=False) for bn in (4, 8)]
        for bn in (32, 64):
            progs = triton.cdiv(n, bn)
            out.append(Tiles(16, bn, _pow2(k, 16, 64), dot=True, splits=_splits_for(progs, k, 64, sms)))
    else:
        bm = _pow2(m, 16, 64)
        for tm, bn, bk in ((bm, 64, 64), (min(bm, 32), 64, 128), (bm, 128, 64), (16, 64, 128)):
            progs = triton.cdiv(n, bn) * triton.cdiv(m, tm)
            warps = 8 if tm * bn >= 64 * 128 else 4
            out.append(
                Tiles(tm, bn, _pow2(k, 16, bk), dot=True, splits=_splits_for(progs, k, bk, sms), warps=warps)
            )
        out.insert(1, Tiles(bm, 32, _pow2(k, 16, 64), dot=True))  # no split: the old default
    return list(dict.fromkeys(out))


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
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """``x (M, K)`` (rows may be strided) or, with ``gather``, rows ``gather (M,)`` of the table ``x``,
    times ``w (N, K).T``.

    ``norm``: RMSNorm of each row first, times ``norm`` (``(K,)``, or ``(groups, K)``: group = row //
    ``rows_per_group``), plus ``norm_shift`` (same layout) when given. Epilogue: ``+ bias``; then
    ``residual + y`` (``residual + gate * y`` with ``gate (groups, N)``), or with ``glu`` (ACT_SILU /
    ACT_GELU_TANH) ``act(y[:, :N/2]) * y[:, N/2:]`` over a fused gate|up ``w``. ``tiles``: these (None: the
    fastest of ``candidates`` for this shape, measured on its first call, ``TUNER``)."""
    n_rows_w, k = w.shape
    assert w.is_contiguous() and x.stride(-1) == 1
    m = gather.shape[0] if gather is not None else x.shape[0]
    n = n_rows_w // 2 if glu else n_rows_w
    y = out if out is not None else torch.empty(m, n, device=x.device, dtype=out_dtype or w.dtype)
    dummy = w
    epi = EPI_GLU if glu else EPI_RESIDUAL if residual is not None else EPI_STORE
    nw = norm if norm is not None else dummy
    nb = norm_shift if norm_shift is not None else dummy
    g = gate if gate is not None else dummy
    res = residual if residual is not None else dummy
    b = bias if bias is not None else dummy
    idx = gather if gather is not None else dummy
    strides = (
        x.stride(0), gather.stride(0) if gather is not None else 0, y.stride(0),
        residual.stride(0) if residual is not None else 0, rows_per_group,
        nw.stride(0) if norm is not None and norm.dim() == 2 else 0,
        nb.stride(0) if norm_shift is not None and norm_shift.dim() == 2 else 0,
        g.stride(0) if gate is not None and gate.dim() == 2 else 0,
    )  # fmt: skip
    flags = dict(
        NORM=norm is not None, NORM_SHIFT=norm_shift is not None, GATHER=gather is not None,
        HAS_BIAS=bias is not None, EPI=epi, GATED=gate is not None, ACT=glu or ACT_SILU,
        IEEE=w.dtype == torch.float32,
    )  # fmt: skip

    def launch(t: Tiles) -> None:
        tiles_n, tiles_m = triton.cdiv(n, t.block_n), triton.cdiv(m, t.block_m)
        k_split = triton.cdiv(triton.cdiv(k, t.splits), t.block_k) * t.block_k
        splits = triton.cdiv(k, k_split)
        part = dummy
        if splits > 1:
            part = torch.empty(splits, m, n * (2 if glu else 1), device=x.device, dtype=torch.float32)
        _linear_kernel[(tiles_n, tiles_m, splits)](
            x, idx, w, b, y, res, nw, nb, g, part, m, n, k, n, k_split, *strides, eps,
            DOT=t.dot, SPLIT=splits > 1, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
            num_warps=t.warps, num_stages=t.stages, **flags,
        )  # fmt: skip
        if splits > 1:
            bm, bn = _pow2(m, 2, 16), 64
            _split_sum_kernel[(triton.cdiv(n, bn), triton.cdiv(m, bm))](
                part, b, y, res, g, m, n, n, splits, y.stride(0), strides[3], rows_per_group, strides[7],
                HAS_BIAS=flags["HAS_BIAS"], EPI=epi, GATED=flags["GATED"], ACT=flags["ACT"],
                BLOCK_M=bm, BLOCK_N=bn, num_warps=4,
            )  # fmt: skip

    if tiles is None:
        sms = _sms(x.device.index or 0) if x.device.type == "cuda" else 132
        key = (m, n, k, w.dtype, *flags.values())
        tiles = TUNER.pick(key, candidates(m, n, k, sms), launch, x.device)
    launch(tiles)
    return y
