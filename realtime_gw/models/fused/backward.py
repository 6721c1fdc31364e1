"""Elementwise pieces of the fused PI0 expert's written-out backward (RTC's vector-Jacobian product), one
kernel each instead of a dozen torch ops: the RMSNorm's input gradient added to the running one, and the
gated linear unit's gradient. The GEMMs around them stay torch's."""

# ruff: noqa: SIM108  (a Triton kernel branches on constexprs in statements, not expressions)
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _norm_backward_kernel(
    x_ptr, dh_ptr, w_ptr, dx_ptr, out_ptr, K, sx, sdh, sdx, so, rows_per_group, s_w, eps,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    k = tl.arange(0, BLOCK_K)
    ok = k < K
    r64 = row.to(tl.int64)
    x = tl.load(x_ptr + r64 * sx + k, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + (row // rows_per_group) * s_w + k, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(dh_ptr + r64 * sdh + k, mask=ok, other=0.0).to(tl.float32) * w
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / K + eps)
    g = r * dy - x * (r * r * r) * (tl.sum(x * dy, axis=0) / K)
    acc = tl.load(dx_ptr + r64 * sdx + k, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + r64 * so + k, acc + g, mask=ok)


def norm_backward_add(
    dx: torch.Tensor, x: torch.Tensor, dh: torch.Tensor, weight: torch.Tensor, eps: float, rows_per_group: int
) -> torch.Tensor:
    """``dx + d/dx[rms_norm(x) * w (+ c)]`` given the output gradient ``dh (M, K)``: ``r * dy - x * r^3 *
    mean(x * dy)`` with ``dy = dh * w`` (``w (K,)``, or ``(groups, K)``: group = row // ``rows_per_group``),
    float32, a new tensor."""
    m, k = x.shape
    out = torch.empty(m, k, device=x.device, dtype=torch.float32)
    _norm_backward_kernel[(m,)](
        x, dh, weight, dx, out, k, x.stride(0), dh.stride(0), dx.stride(0), out.stride(0), rows_per_group,
        weight.stride(0) if weight.dim() == 2 else 0, eps, BLOCK_K=triton.next_power_of_2(k), num_warps=4,
    )  # fmt: skip
    return out


@triton.jit
def _glu_backward_kernel(
    gu_ptr, da_ptr, out_ptr, INTER, s_gu, s_da, s_o, ACT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = j < INTER
    g = tl.load(gu_ptr + row * s_gu + j, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * s_gu + INTER + j, mask=ok, other=0.0).to(tl.float32)
    da = tl.load(da_ptr + row * s_da + j, mask=ok, other=0.0).to(tl.float32)
    if ACT == 1:  # SiLU: g * s, s * (1 + g * (1 - s))
        s = 1.0 / (1.0 + tl.exp(-g))
        act = g * s
        dact = s * (1.0 + g * (1.0 - s))
    else:  # GELU (tanh): 0.5 g (1 + t), 0.5 (1 + t) + 0.5 g (1 - t^2) c (1 + 3 a g^2)
        c = 0.7978845608028654
        t = 2.0 / (1.0 + tl.exp(-2.0 * c * (g + 0.044715 * g * g * g))) - 1.0
        act = 0.5 * g * (1.0 + t)
        dact = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * g * g)
    dst = out_ptr + row * s_o + j
    tl.store(dst, (da * u * dact).to(out_ptr.dtype.element_ty), mask=ok)
    tl.store(dst + INTER, (da * act).to(out_ptr.dtype.element_ty), mask=ok)


def glu_backward(gu: torch.Tensor, da: torch.Tensor, act: int, dtype: torch.dtype) -> torch.Tensor:
    """The gradient of ``act(gu[:, :I]) * gu[:, I:]`` w.r.t. ``gu (M, 2I)`` (the pre-activations) given
    ``da (M, I)``: ``(M, 2I)`` in ``dtype``, computed in float32."""
    m, inter = da.shape
    out = torch.empty(m, 2 * inter, device=gu.device, dtype=dtype)
    block = min(1024, triton.next_power_of_2(inter))
    _glu_backward_kernel[(m, triton.cdiv(inter, block))](
        gu, da, out, inter, gu.stride(0), da.stride(0), out.stride(0), ACT=act, BLOCK=block, num_warps=4
    )
    return out

