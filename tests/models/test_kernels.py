"""The shared GPU building blocks (realtime_gw.models.kernels), on the CPU at small shapes, against the
plain arithmetic they replace: repeated-K/V softmax attention, transformers' rotate_half rotary."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from realtime_gw.models.kernels import (
    GraphCapture,
    additive_mask,
    apply_rope,
    attend,
    bucket_for,
    cat_bias,
    chosen_buckets,
    fine_buckets,
    fuse_linears,
    linear_add,
    pow2_buckets,
    qkv_heads,
    rope_cos_sin,
    signed_rope,
)


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """q (B, S, H, D), k/v (B, KV, L, D), allowed (B, S, L) bool -> (B, S, H * D), K/V repeated per head
    (transformers' repeat_kv: head h reads KV head h // groups)."""
    b, s, h, d = q.shape
    groups = h // k.shape[1]
    kr, vr = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.einsum("bshd,bhld->bhsl", q, kr) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    out = torch.einsum("bhsl,bhld->bshd", scores.softmax(-1), vr)
    return out.reshape(b, s, h * d)


def random_mask(b: int, s: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    allowed = torch.rand(b, s, length, generator=g) < 0.7
    allowed[..., 0] = True  # every row sees at least one key
    return allowed


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1), (8, 2)])
@pytest.mark.parametrize("fused", [False, True])
def test_attention_matches_naive_softmax_with_gqa_and_masks(heads: int, kv_heads: int, fused: bool) -> None:
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)
    b, s, length, d = 2, 3, 7, 8
    q = torch.randn(b, s, heads, d, generator=g)
    k = torch.randn(b, kv_heads, length, d, generator=g)
    v = torch.randn(b, kv_heads, length, d, generator=g)
    scale = d**-0.5
    groups = heads // kv_heads
    allowed = random_mask(b, s, length, seed=heads)
    want = naive_attention(q, k, v, allowed, scale)
    for mask in (
        additive_mask(allowed, kv_heads, groups, q.dtype),  # materialised per KV head
        additive_mask(allowed, 1, groups, q.dtype),  # shared by the KV heads
        allowed[:, None].repeat_interleave(groups, dim=2),  # bool rows in folded order
    ):
        got = attend(q, k, v, mask, scale, fused=fused)
        assert got.shape == (b, s, heads * d)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(attend(q, k, v, None, scale, fused), naive_attention(q, k, v, None, scale))


def test_attention_reads_cache_column_slices_and_broadcast_masks() -> None:
    """The talker's and PI0's calls: K/V as a column slice of a longer cache; one mask for every row."""
    g = torch.Generator().manual_seed(0)
    b, s, heads, kv_heads, d, length = 3, 2, 4, 2, 8, 5
    cache_k = torch.randn(b, kv_heads, 9, d, generator=g)
    cache_v = torch.randn(b, kv_heads, 9, d, generator=g)
    q = torch.randn(b, s, heads, d, generator=g)
    allowed = random_mask(1, s, length, seed=3)
    mask = additive_mask(allowed, 1, heads // kv_heads, q.dtype)
    assert mask.shape == (1, 1, s * 2, length)
    got = attend(q, cache_k[:, :, :length], cache_v[:, :, :length], mask, 0.3)
    want = naive_attention(q, cache_k[:, :, :length], cache_v[:, :, :length], allowed.expand(b, -1, -1), 0.3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_additive_mask_is_finite_and_query_major() -> None:
    allowed = torch.tensor([[[True, False], [False, True]]])
    add = additive_mask(allowed, kv_heads=1, groups=2, dtype=torch.float32)
    assert torch.isfinite(add).all()
    lo = torch.finfo(torch.float32).min
    # Rows: (query 0, group 0), (query 0, group 1), (query 1, group 0), (query 1, group 1).
    assert add[0, 0].tolist() == [[0.0, lo], [0.0, lo], [lo, 0.0], [lo, 0.0]]


def rotate_half_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb for one tensor."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def test_rope_matches_rotate_half() -> None:
    g = torch.Generator().manual_seed(0)
    d, base = 16, 10000.0
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2).float() / d)
    positions = torch.tensor([[0, 1, 5], [3, 4, 9]])
    x = torch.randn(2, 3, 4, d, generator=g)  # (B, S, heads, D)
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    want = rotate_half_reference(x, emb.cos()[:, :, None] * 0.5, emb.sin()[:, :, None] * 0.5)
    cos, sin = rope_cos_sin(positions, inv_freq, 0.5, torch.float32)
    assert cos.shape == sin.shape == (2, 3, d)
    torch.testing.assert_close(apply_rope(x, cos[:, :, None], sin[:, :, None]), want)
    # From a rotary module's own (cos, sin) tables: the same rotation.
    cos2, sin2 = signed_rope(emb.cos() * 0.5, emb.sin() * 0.5)
    torch.testing.assert_close(apply_rope(x, cos2[:, :, None], sin2[:, :, None]), want)


def test_fused_projections_keep_every_bias() -> None:
    torch.manual_seed(0)
    q, k, v = nn.Linear(8, 8), nn.Linear(8, 4, bias=False), nn.Linear(8, 4)
    w, b = fuse_linears(q, k, v)
    assert w.shape == (16, 8) and b is not None and b.shape == (16,)
    assert not b[8:12].any()  # the bias-free projection contributes zeros
    x = torch.randn(2, 3, 8)
    qk, val = qkv_heads(x, w, b, heads=2, kv_heads=1)  # head_dim 4
    with torch.no_grad():
        torch.testing.assert_close(qk.reshape(2, 3, 12), torch.cat([q(x), k(x)], dim=-1))
        torch.testing.assert_close(val.reshape(2, 3, 4), v(x))
    assert cat_bias(nn.Linear(2, 2, bias=False), nn.Linear(2, 3, bias=False)) is None


@pytest.mark.parametrize("bias", [False, True])
def test_linear_add(bias: bool) -> None:
    g = torch.Generator().manual_seed(1)
    residual, x = torch.randn(2, 3, 6, generator=g), torch.randn(2, 3, 5, generator=g)
    w = torch.randn(6, 5, generator=g)
    b = torch.randn(6, generator=g) if bias else None
    torch.testing.assert_close(linear_add(residual, x, w, b), residual + torch.nn.functional.linear(x, w, b))


def test_buckets() -> None:
    assert pow2_buckets(6, 1) == [1, 2, 4, 6]
    assert pow2_buckets(8, 1) == [1, 2, 4, 8]
    assert pow2_buckets(64, 64) == [64]
    assert [bucket_for((1, 2, 4, 8), n) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    with pytest.raises(ValueError, match="exceeds the largest bucket 8"):
        bucket_for((1, 2, 4, 8), 9)


def test_fine_buckets_split_each_doubling_above_32_in_four() -> None:
    """Above 32 a batch runs with at most a fifth of its rows padding (up to half with powers of two):
    48 conversations run as 48, not 64."""
    assert fine_buckets(64) == [1, 2, 4, 8, 16, 32, 40, 48, 56, 64]
    assert fine_buckets(128)[-5:] == [64, 80, 96, 112, 128]
    assert fine_buckets(100)[-4:] == [64, 80, 96, 100]  # the slots are always a bucket
    assert fine_buckets(32) == pow2_buckets(32, 1) and fine_buckets(6) == [1, 2, 4, 6] and fine_buckets(1) == [1]
    assert fine_buckets(64, fine_from=16, per_doubling=2) == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert [bucket_for(fine_buckets(64), n) for n in (17, 33, 41, 48, 49, 57)] == [32, 40, 48, 48, 56, 64]
    for limit in range(1, 300):
        buckets = fine_buckets(limit)
        assert buckets == sorted(set(buckets)) and buckets[-1] == limit and buckets[0] == 1
        assert all(b / a <= 2 for a, b in zip(buckets, buckets[1:], strict=False))
        assert all((b - a) / b <= 0.2 for a, b in zip(buckets, buckets[1:], strict=False) if a >= 32)


def test_chosen_buckets_stop_at_the_slots() -> None:
    assert chosen_buckets([1, 2, 4, 8, 16, 32, 64], 48) == [1, 2, 4, 8, 16, 32, 48]
    assert chosen_buckets([48, 1, 24], 64) == [1, 24, 48, 64]
    with pytest.raises(ValueError, match="positive batch sizes"):
        chosen_buckets([0, 4], 8)


def test_graph_capture_refuses_a_cpu_device_before_running_anything() -> None:
    """Callers treat capture as optional and fall back to eager launches: a failure must come before
    the warm-up has run (it would otherwise have side effects)."""
    ran: list[str] = []
    with pytest.raises((ValueError, RuntimeError, AssertionError)):
        GraphCapture("cpu").capture(lambda: ran.append("body"))
    assert ran == []
