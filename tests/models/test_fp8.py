"""FP8 linears: row-wise quantizing, ``_scaled_mm`` against the full-precision product, and the weights
left as they are where ``_scaled_mm``'s alignment does not fit (CPU; the CUDA kernel runs in the GPU bench)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from realtime_gw.models.fp8 import FP8, FP8_MAX, Fp8Weight, fp8_weight, linear, quantize_rows
from realtime_gw.models.kernels import linear_add, qkv_heads


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_rows_quantize_to_the_full_e4m3_range_and_back() -> None:
    x = torch.randn(5, 64) * torch.tensor([1e-3, 1.0, 30.0, 1.0, 1.0])[:, None]
    x[3] = 0.0
    q, scale = quantize_rows(x)
    assert q.dtype == FP8 and scale.shape == (5, 1)
    back = q.float() * scale
    assert torch.isfinite(back).all() and (back[3] == 0).all()
    for row in (0, 1, 2, 4):  # each row's largest magnitude lands on e4m3's largest value
        assert q[row].float().abs().max().item() == FP8_MAX
        assert rel(back[row], x[row]) < 0.05


def test_fp8_linear_is_the_product_to_e4m3_rounding() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 7, 64, dtype=torch.bfloat16)
    w = torch.randn(48, 64, dtype=torch.bfloat16) / 8
    b = torch.randn(48, dtype=torch.bfloat16)
    q = fp8_weight(w)
    assert isinstance(q, Fp8Weight) and q.data.dtype == FP8 and q.scale.shape == (1, 48)
    got, ref = linear(x, q, b), F.linear(x, w, b)
    assert got.shape == ref.shape == (2, 7, 48) and got.dtype == torch.bfloat16
    assert 0 < rel(got, ref) < 0.08
    residual = torch.randn(2, 7, 48, dtype=torch.bfloat16)
    assert rel(linear_add(residual, x, q, None), residual + F.linear(x, w)) < 0.08
    qk, v = qkv_heads(x, fp8_weight(torch.randn(96, 64, dtype=torch.bfloat16)), None, 4, 1)
    assert qk.shape == (2, 7, 5, 16) and v.shape == (2, 7, 1, 16)


def test_unaligned_weights_stay_in_their_dtype() -> None:
    w = torch.randn(24, 40)
    assert fp8_weight(w) is w
    x = torch.randn(3, 40)
    assert torch.equal(linear(x, fp8_weight(w), None), F.linear(x, w))
