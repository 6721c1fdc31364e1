"""FP8 (e4m3) linear layers with row-wise scales: weights quantized once per output channel, activations
per token at run time, one ``torch._scaled_mm`` with bf16 (the activation's dtype) out.

Used by PI0's prefix under ``policy_fp8``: its GEMMs are large enough to be bound by tensor
throughput, where e4m3 runs at up to twice bf16's rate on Hopper. The activation's quantizing (row amax,
scale, cast) is pointwise plus a row reduction, so under ``torch.compile`` it fuses into the norm or
activation before each GEMM; eager, it costs more than it saves (``loadtest/probes/fp8_gemm.py``).

Error: e4m3 keeps 3 mantissa bits, about 3-4 % relative L2 per GEMM on random data; whether that is
acceptable for a model is measured on its outputs (PI0: ``FastPi0Runner``'s numerics guard), not assumed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)
ALIGN = 16
"""``_scaled_mm`` on CUDA needs both of a weight's dimensions divisible by this."""
FAST_ACCUM = True
"""Hopper's fast FP8 accumulation (no periodic promotion to float32): faster than exact accumulation on
PI0's prefix at the same action error, since the e4m3 rounding of the operands is what costs accuracy
(``loadtest/probes/fp8_prefix.py``; figures in docs/benchmarks-log.md)."""


@dataclass(frozen=True, slots=True)
class Fp8Weight:
    """A linear's (N, K) weight in e4m3, with the float32 scale of each output row as (1, N)."""

    data: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.data.shape


Weight = torch.Tensor | Fp8Weight
"""A linear's weight as the layers here take it: bf16/fp32 as loaded, or quantized."""


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x / scale) in e4m3 and the (rows, 1) float32 scale that undoes it, one scale per row (its amax
    maps to e4m3's largest value; an all-zero row gets a tiny scale, not a division by zero)."""
    x32 = x.float()
    scale = x32.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (x32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


@dataclass(frozen=True, slots=True)
class ScaledKv:
    """K or V cache columns in e4m3 ``(B, KV, L, D)`` with the float32 scale of each (row, head, column)
    ``(B, KV, L)``: the value is ``data * scale`` (``quantize_rows`` over the head dimension)."""

    data: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return (self.data.float() * self.scale[..., None]).to(dtype)


def quantizable(w: torch.Tensor) -> bool:
    """Whether ``w`` (N, K) fits ``_scaled_mm``'s alignment."""
    return w.dim() == 2 and w.shape[0] % ALIGN == 0 and w.shape[1] % ALIGN == 0


def fp8_weight(w: torch.Tensor) -> Weight:
    """``w`` quantized per output row, or ``w`` itself where its shape does not fit ``_scaled_mm``."""
    if not quantizable(w):
        return w
    with torch.no_grad():
        data, scale = quantize_rows(w)
    return Fp8Weight(data.contiguous(), scale.reshape(1, -1).contiguous())


def fp8_linear(x: torch.Tensor, w: Fp8Weight, b: torch.Tensor | None) -> torch.Tensor:
    """x @ dequant(w).T (+ b) with x quantized per token; out in x's dtype."""
    lead, k = x.shape[:-1], x.shape[-1]
    xq, sx = quantize_rows(x.reshape(-1, k))
    # The weight's transpose is column-major, as _scaled_mm's second operand must be. The bias is added
    # outside: row-wise scaling with a bias in the epilogue is not supported by every torch release.
    y = torch._scaled_mm(
        xq, w.data.t(), scale_a=sx, scale_b=w.scale, out_dtype=x.dtype, use_fast_accum=FAST_ACCUM
    )
    y = y.view(*lead, -1)
    return y if b is None else y + b


def linear(x: torch.Tensor, w: Weight, b: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` for either kind of weight."""
    if isinstance(w, Fp8Weight):
        return fp8_linear(x, w, b)
    return F.linear(x, w, b)
