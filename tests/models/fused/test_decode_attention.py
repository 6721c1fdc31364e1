"""The decode attention kernel (``fused.attention.decode``) against ``kernels.attend``'s eager GEMMs, on CPU
tensors through Triton's interpreter: masks with holes, rows with every key masked, key counts that are
no multiple of the block, column slices of a cache, per-row visible counts, split keys, FP8 K/V."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")

from realtime_gw.models import kernels  # noqa: E402
from realtime_gw.models.fp8 import FP8, ScaledKv  # noqa: E402
from realtime_gw.models.fused import attention as fused_attention  # noqa: E402
from realtime_gw.models.fused.attention import Tiles, decode  # noqa: E402
from realtime_gw.models.kernels import KeyMask, additive_mask, attend, write_columns  # noqa: E402
from realtime_gw.models.s2s.config import moshi_tiny  # noqa: E402
from realtime_gw.models.s2s.layers import TemporalLayer  # noqa: E402
from realtime_gw.models.s2s.lm import moshi_inv_freq  # noqa: E402
from realtime_gw.models.s2s.weights import random_weights  # noqa: E402
from realtime_gw.models.speech.streaming.layers import RingTransformer  # noqa: E402

SMALL = Tiles(block_l=16)
"""Several key blocks per split at test sizes (the interpreter runs the GPU's tiles as they are)."""
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _rand(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def eager(*args: object, **kw: object) -> torch.Tensor:
    return attend(*args, **kw)  # type: ignore[arg-type]  # DECODE_KERNEL is "auto": CPU tensors take the GEMMs


def _case(b: int, s: int, h: int, kvh: int, d: int, length: int, dtype: torch.dtype, seed: int = 0):
    """q, and K/V as column slices ``[0, length)`` of a longer cache (strided, as a ring's)."""
    q = _rand(b, s, h, d, seed=seed, dtype=dtype)
    kc = _rand(b, kvh, length + 9, d, seed=seed + 1, dtype=dtype)
    vc = _rand(b, kvh, length + 9, d, seed=seed + 2, dtype=dtype)
    return q, kc[:, :, :length], vc[:, :, :length]


def _holes(b: int, rows: int, length: int, seed: int) -> torch.Tensor:
    """Bool (b, rows, length): random holes, row 0 of batch 0 sees nothing, batch 1 sees a prefix only."""
    keep = _rand(b, rows, length, seed=seed) > -0.3
    keep[0, 0] = False
    keep[1 % b, :, length // 3 :] = False
    return keep


@pytest.mark.parametrize(
    ("dtype", "s", "h", "kvh", "max_splits"),  # MHA (Moshi), GQA, MQA; one pass, or keys split and merged
    [
        (torch.float32, 1, 4, 4, 1),
        (torch.float32, 2, 4, 2, None),
        (torch.float32, 1, 8, 1, None),
        (torch.bfloat16, 1, 4, 4, None),
        (torch.bfloat16, 2, 4, 2, 1),
        (torch.float16, 1, 8, 1, None),
    ],
)
def test_decode_equals_the_eager_attend(
    dtype: torch.dtype, s: int, h: int, kvh: int, max_splits: int | None
) -> None:
    b, d, length = 3, 64, 83  # 83: no multiple of the block
    q, k, v = _case(b, s, h, kvh, d, length, dtype)
    g = h // kvh
    keep = _holes(b, s, length, seed=5)  # one mask per query position, repeated over groups
    if dtype == torch.float16:  # a row with every key at -65504 is defined by fp16 rounding in eager
        keep[0, 0, 0] = True
    mask = additive_mask(keep, kvh, g, dtype)
    tol = TOL[dtype]
    want = eager(q, k, v, mask, 0.125)
    got = decode(q, k, v, mask, 0.125, tiles=SMALL, max_splits=max_splits)
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    # the same as a bool mask (broadcast over KV heads), and with no mask at all
    bool_mask = keep[:, None, :, None].expand(b, 1, s, g, length).reshape(b, 1, s * g, length)
    torch.testing.assert_close(decode(q, k, v, bool_mask, 0.125, tiles=SMALL, max_splits=max_splits), want,
                               atol=tol, rtol=tol)  # fmt: skip
    torch.testing.assert_close(
        decode(q, k, v, None, 0.125, tiles=SMALL, max_splits=max_splits), eager(q, k, v, None, 0.125),
        atol=tol, rtol=tol,
    )  # fmt: skip


def test_a_mask_per_kv_head_and_one_shared_by_every_row() -> None:
    b, s, h, kvh, d, length = 2, 1, 4, 2, 128, 50
    q, k, v = _case(b, s, h, kvh, d, length, torch.float32, seed=3)
    per_head = _rand(b, kvh, 2, length, seed=9) > 0  # (B, KV, S * G, L): each KV head its own holes
    per_head[..., 0] = True
    torch.testing.assert_close(decode(q, k, v, per_head, 0.3, tiles=SMALL), eager(q, k, v, per_head, 0.3),
                               atol=2e-5, rtol=2e-5)  # fmt: skip
    shared = additive_mask(_rand(1, 1, length, seed=4)[:, :, :] > 0, 1, 2, torch.float32)  # (1, 1, 2, L)
    torch.testing.assert_close(decode(q, k, v, shared, 0.3, tiles=SMALL), eager(q, k, v, shared, 0.3),
                               atol=2e-5, rtol=2e-5)  # fmt: skip


def test_visible_counts_skip_masked_keys_without_changing_the_result() -> None:
    """A ring before it wraps: row b's keys are its first ``visible[b]`` columns; the K/V beyond are
    garbage (NaN here), never read."""
    b, s, h, d, length = 3, 1, 2, 64, 70
    q, k, v = _case(b, s, h, h, d, length, torch.float32, seed=7)
    visible = torch.tensor([70, 5, 33], dtype=torch.int32)
    keep = torch.arange(length)[None, None, :] < visible[:, None, None].long()
    keep[2, 0, 3] = False  # and a hole inside
    k, v = k.clone(), v.clone()
    for row, n in enumerate(visible.tolist()):
        k[row, :, n:] = float("nan")
        v[row, :, n:] = float("nan")
    mask = additive_mask(keep, h, 1, torch.float32)
    want = eager(q, torch.nan_to_num(k), torch.nan_to_num(v), mask, 0.2)
    for max_splits in (1, None):
        got = decode(q, k, v, mask, 0.2, visible=visible, tiles=SMALL, max_splits=max_splits)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    nothing = decode(q, k, v, mask, 0.2, visible=torch.zeros(b, dtype=torch.int32), tiles=SMALL)
    assert torch.equal(nothing, torch.zeros_like(nothing))  # a row that sees no key gets zeros, not NaN


def _quantized(x: torch.Tensor) -> ScaledKv:
    """``x (B, KV, L, D)`` written column by column into an FP8 cache, as the ring writes it."""
    b, kvh, length, d = x.shape
    data = torch.zeros(b, kvh, length, d, dtype=FP8)
    scale = torch.zeros(b, kvh, length)
    idx = torch.arange(length)[None, None, :, None].expand(b, kvh, length, d)
    write_columns(data, scale, idx, x)
    return ScaledKv(data, scale)


def test_fp8_columns_round_trip_within_e4m3_rounding() -> None:
    x = _rand(2, 3, 20, 64, seed=1) * torch.logspace(-3, 2, 20)[None, None, :, None]  # columns of any size
    x[0, 0, 4] = 0.0  # an all-zero column: a tiny scale, zeros back
    kv = _quantized(x)
    back = kv.dequantize(torch.float32)
    amax = x.abs().amax(dim=-1, keepdim=True)
    # e4m3: 3 mantissa bits (half an ulp = 2^-4 relative); below 2^-6 of the scale, subnormal steps of 2^-9
    bound = 2.0**-4 * x.abs() + amax / 448 * 2.0**-10 + 1e-12
    assert (back - x).abs().le(bound).all()
    assert torch.equal(back[0, 0, 4], torch.zeros(64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("max_splits", [1, None])
def test_fp8_kv_in_the_kernel(dtype: torch.dtype, max_splits: int | None) -> None:
    """Against the eager path on the same dequantized K/V: the kernel's rounding only; against the
    unquantized K/V: e4m3's, under 5 % relative L2 of the output (about 2 % on these random data)."""
    b, s, h, kvh, d, length = 2, 1, 4, 2, 64, 75
    q, k, v = _case(b, s, h, kvh, d, length, torch.float32, seed=11)
    mask = additive_mask(_holes(b, s, length, seed=12), kvh, h // kvh, dtype)
    kq, vq = _quantized(k), _quantized(v)
    q = q.to(dtype)
    got = decode(q, kq.data, vq.data, mask, 0.125, k_scale=kq.scale, v_scale=vq.scale, tiles=SMALL,
                 max_splits=max_splits)  # fmt: skip
    same = eager(q, kq, vq, mask, 0.125)  # attend dequantizes ScaledKv on its eager path
    tol = TOL[dtype]
    torch.testing.assert_close(got, same, atol=tol, rtol=tol)
    exact = eager(q.float(), k, v, mask.float(), 0.125)
    err = (got.float() - exact).norm() / exact.norm()
    assert err < 0.05, f"fp8 K/V: relative L2 error {err:.4f}"


def test_attend_dispatches_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """``attend`` with a ``KeyMask`` and ``ScaledKv`` K/V, kernel forced (``always``) vs the GEMMs."""
    b, s, h, d, length = 2, 1, 2, 64, 40
    q, k, v = _case(b, s, h, h, d, length, torch.float32, seed=21)
    keep = torch.arange(length)[None, None, :] < torch.tensor([40, 17])[:, None, None]
    key_mask = KeyMask(additive_mask(keep, h, 1, torch.float32), torch.tensor([40, 17], dtype=torch.int32))
    kq, vq = _quantized(k), _quantized(v)
    want = attend(q, kq, vq, key_mask, 0.3), attend(q, k, v, key_mask, 0.3)
    monkeypatch.setattr(kernels, "DECODE_KERNEL", "always")
    calls: list[int] = []

    def counted(*a: object, **kw: object) -> torch.Tensor:
        calls.append(1)
        return decode(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(fused_attention, "decode", counted)
    got = attend(q, kq, vq, key_mask, 0.3), attend(q, k, v, key_mask, 0.3)
    assert len(calls) == 2
    for g_, w_ in zip(got, want, strict=True):
        torch.testing.assert_close(g_, w_, atol=2e-5, rtol=2e-5)


def _ring_outputs(kv_dtype: torch.dtype | None, kernel: str, monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Moshi's temporal layers (head dim 64) on a ring of 24 positions, 28 steps (it wraps); row 2 joins
    at step 8, so it is young in a batch of old rows (its visible count bounds what is read)."""
    monkeypatch.setattr(kernels, "DECODE_KERNEL", kernel)
    shape = replace(moshi_tiny(), dim=128, num_heads=2, num_layers=1, context=24)
    weights = random_weights(shape, "cpu", torch.float32)
    layers = [TemporalLayer.of(weights, i, shape) for i in range(shape.num_layers)]
    inv = moshi_inv_freq(shape.head_dim, shape.max_period, torch.device("cpu"))
    ring = RingTransformer(layers, 3, shape.context, 1, inv, 1.0, torch.device("cpu"), torch.float32, kv_dtype)
    outs = []
    for t in range(28):
        active = torch.tensor([True, True, t >= 8])
        if t == 8:
            ring.reset(torch.tensor([2]))
        x = _rand(3, 1, shape.dim, seed=100 + t)
        outs.append(ring(x, 3, active)[active])
    return outs


def test_the_ring_through_the_kernel_in_both_kv_dtypes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernel vs eager on the same ring (model dtype, then FP8); FP8 vs the model's dtype: e4m3's error,
    under 5 % relative L2 per step."""
    exact = _ring_outputs(None, "never", monkeypatch)
    for kv_dtype in (None, FP8):
        eager_out = exact if kv_dtype is None else _ring_outputs(kv_dtype, "never", monkeypatch)
        kernel_out = _ring_outputs(kv_dtype, "always", monkeypatch)
        for got, want in zip(kernel_out, eager_out, strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for got, want in zip(eager_out, exact, strict=True):
        assert (got - want).norm() / want.norm() < 0.05


def test_the_fp8_column_write_kernel_equals_the_eager_quantizing() -> None:
    """K and V as the layer hands them (head-transposed views), each row at its own columns."""
    b, s, kvh, d, length = 3, 2, 2, 64, 12
    qkv = _rand(b, s, 3 * kvh, d, seed=31) * torch.logspace(-2, 1, d)  # channels of any size
    qkv[1, 0, kvh] = 0.0  # an all-zero key column
    k, v = qkv[:, :, kvh : 2 * kvh].transpose(1, 2), qkv[:, :, 2 * kvh :].transpose(1, 2)
    cols = torch.tensor([[0, 1], [7, 8], [11, 12]])  # the last row writes the scratch column too
    caches = [torch.zeros(b, kvh, length + 1, d, dtype=FP8) for _ in range(4)]
    scales = [torch.zeros(b, kvh, length + 1) for _ in range(4)]
    idx = cols[:, None, :, None].expand(b, kvh, s, d)
    write_columns(caches[0], scales[0], idx, k)
    write_columns(caches[1], scales[1], idx, v)
    fused_attention.write_fp8(k, v, cols, caches[2], caches[3], scales[2], scales[3])
    for want, got in ((0, 2), (1, 3)):
        assert torch.equal(caches[got].view(torch.uint8), caches[want].view(torch.uint8))
        assert torch.equal(scales[got], scales[want])
