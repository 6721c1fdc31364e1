"""The fused kernels against the eager maths they replace (float32, Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from realtime_gw.models.fused import attention as fused_attention  # noqa: E402
from realtime_gw.models.fused import gemm, ops  # noqa: E402
from realtime_gw.models.fused.attention import attention  # noqa: E402
from realtime_gw.models.kernels import additive_mask, apply_rope, attend, rope_cos_sin  # noqa: E402
from realtime_gw.models.speech.qwen3.talker import sample  # noqa: E402

ATOL = 1e-5


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _check_linear(m: int, k: int, tiles: gemm.Tiles | None, tol: float = ATOL) -> None:
    n, groups = 24, 2
    x, w, b = (
        _rand(m * groups, k),
        _rand(n, k, seed=1) * (40 / k) ** 0.5,
        _rand(n, seed=2),
    )  # same scale at any k
    res, nw, shift, gate = (
        _rand(m * groups, n, seed=3),
        _rand(groups, k, seed=4),
        _rand(groups, k, seed=5),
        _rand(groups, n, seed=6),
    )
    per_row = torch.arange(m * groups) // m
    normed = F.rms_norm(x, (k,), None, 1e-6) * nw[per_row] + shift[per_row]
    got = gemm.linear(x, w, b, norm=nw, norm_shift=shift, rows_per_group=m, residual=res, gate=gate, tiles=tiles)
    torch.testing.assert_close(got, res + gate[per_row] * F.linear(normed, w, b), atol=tol, rtol=tol)
    got = gemm.linear(x, w, norm=nw[0], eps=1e-5, tiles=tiles)
    torch.testing.assert_close(got, F.linear(F.rms_norm(x, (k,), nw[0], 1e-5), w), atol=tol, rtol=tol)
    for act, ref in ((ops.ACT_SILU, F.silu), (ops.ACT_GELU_TANH, lambda t: F.gelu(t, approximate="tanh"))):
        gu = F.linear(x, w, b)
        got = gemm.linear(x, w, b, glu=act, tiles=tiles)
        torch.testing.assert_close(got, ref(gu[:, : n // 2]) * gu[:, n // 2 :], atol=tol, rtol=tol)
    table, idx = _rand(50, k, seed=7), torch.tensor([3, 49, 0, 3] * m)[: m * groups]
    rows = torch.stack([idx, idx], 1)[:, 1]  # a strided index column, as a frame's codes
    torch.testing.assert_close(
        gemm.linear(table, w, b, gather=rows, tiles=tiles), F.linear(table[idx], w, b), atol=tol, rtol=tol
    )


@pytest.mark.parametrize("m", [1, 3, 20])  # GEMV tiles, and tl.dot tiles from 16 rows
def test_linear_prologue_and_epilogues(m: int) -> None:
    """The interpreter's one tile, as ``ops.linear`` runs under it."""
    (tiles,) = gemm.candidates(m * 2, 24, 40)
    assert ops.linear is gemm.linear
    _check_linear(m, 40, None)
    _check_linear(m, 40, tiles)


@pytest.mark.parametrize("m", [1, 3, 6, 20])
def test_every_device_tile_config(m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every config the device's tuner may choose at these row counts (the GEMV widths, the dot tiles, K
    split over programs with its partial sums added by the second kernel) gives the same result."""
    monkeypatch.setattr(gemm, "INTERPRETED", False)
    k = 300  # long enough for a split into whole K steps
    configs = gemm.candidates(m * 2, 24, k, sms=4)
    assert any(c.splits > 1 for c in configs) or m * 2 <= 2
    for tiles in configs:
        _check_linear(m, k, tiles, tol=1e-4)  # K summed in other orders (float32)


def test_rope_write_equals_the_eager_layer() -> None:
    b, s, heads, kvh, d, col0 = 2, 3, 4, 2, 8, 5
    qkv = _rand(b * s, (heads + 2 * kvh) * d)
    qk_norm = _rand(heads + kvh, d, seed=1)
    cos, sin = rope_cos_sin(
        torch.arange(col0, col0 + s), 1.0 / 10000 ** (torch.arange(0, d, 2) / d), 1.0, torch.float32
    )
    kc, vc = torch.zeros(b, kvh, 16, d), torch.zeros(b, kvh, 16, d)
    q = ops.rope_write(qkv, s, heads, kvh, d, cos, sin, kc, vc, col0, qk_norm, 1e-6)
    raw = qkv.view(b, s, heads + 2 * kvh, d)
    qk = F.rms_norm(raw[:, :, : heads + kvh], (d,), None, 1e-6) * qk_norm
    qk = apply_rope(qk, cos[None, :, None], sin[None, :, None])
    torch.testing.assert_close(q.view(b, s, heads, d), qk[:, :, :heads], atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(
        kc[:, :, col0 : col0 + s], qk[:, :, heads:].transpose(1, 2), atol=ATOL, rtol=1e-5
    )
    assert torch.equal(vc[:, :, col0 : col0 + s], raw[:, :, heads + kvh :].transpose(1, 2))
    assert not kc[:, :, :col0].any() and not vc[:, :, col0 + s :].any()


@pytest.mark.parametrize("max_splits", [1, 3, None])  # one pass; keys split over programs, then merged
def test_attention_causal_and_masked(max_splits: int | None) -> None:
    b, s, heads, kvh, d, length = 2, 3, 4, 2, 8, 45
    q, kc, vc = _rand(b * s, heads * d), _rand(b, kvh, 64, d, seed=1), _rand(b, kvh, 64, d, seed=2)
    col0 = length - s
    seen = torch.arange(length)[None, :] <= (col0 + torch.arange(s))[:, None]
    mask = additive_mask(seen[None], 1, heads // kvh, q.dtype)
    want = attend(q.view(b, s, heads, d), kc[:, :, :length], vc[:, :, :length], mask, 0.3)
    got = attention(q, s, heads, kc, vc, length, 0.3, causal_from=col0, max_splits=max_splits)
    torch.testing.assert_close(got.view(b, s, -1), want, atol=ATOL, rtol=1e-5)
    pos = torch.tensor([7, 40])  # each batch row's own position (the talker); rows past it unseen
    seen = torch.arange(length)[None, None, :] <= (pos[:, None, None] + torch.arange(s)[None, :, None])
    want = attend(
        q.view(b, s, heads, d),
        kc[:, :, :length],
        vc[:, :, :length],
        additive_mask(seen, 1, heads // kvh, q.dtype),
        0.3,
    )
    got = attention(q, s, heads, kc, vc, length, 0.3, causal_from=pos, max_splits=max_splits)
    torch.testing.assert_close(got.view(b, s, -1), want, atol=ATOL, rtol=1e-5)
    keep = _rand(b, s, 64, seed=3) > -0.5
    keep[:, :, 0] = True
    keep[:, :, 40:] = False  # a split that sees only masked keys (as PI0's padded prompt)
    mask = additive_mask(keep, 1, heads // kvh, q.dtype)
    want = attend(q.view(b, s, heads, d), kc, vc, mask, 0.3)
    got = attention(q, s, heads, kc, vc, 64, 0.3, mask=mask, max_splits=max_splits)
    torch.testing.assert_close(got.view(b, s, -1), want, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize(("do_sample", "top_k"), [(False, 0), (True, 5), (True, 0), (True, 500)])
def test_sample_equals_the_eager_sampler(do_sample: bool, top_k: int) -> None:
    logits = _rand(6, 300) * 4
    logits[1, 7] = logits[1, 9] = 50.0  # a tie: the first index, as argmax
    logits[2, :100] = float("-inf")  # suppressed ids
    torch.manual_seed(11)
    want = sample(logits, do_sample, 0.9, top_k)
    torch.manual_seed(11)
    draws = torch.empty_like(logits).exponential_(1)
    codes = torch.zeros(6, 3, dtype=torch.long)
    ops.sample(logits, codes[:, 1], do_sample, 0.9, top_k, draws)
    assert torch.equal(codes[:, 1], want)


def test_every_device_attention_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each query block and split the device's tuner may choose (64-row query blocks at PI0's many rows,
    the keys split over programs) gives the eager attention's result."""
    monkeypatch.setattr(fused_attention, "INTERPRETED", False)
    b, s, heads, kvh, d, length = 1, 9, 8, 1, 16, 300
    q, kc, vc = _rand(b * s, heads * d), _rand(b, kvh, 320, d, seed=1), _rand(b, kvh, 320, d, seed=2)
    keep = _rand(b, s, 320, seed=3) > -0.5
    keep[:, :, 0] = True
    mask = additive_mask(keep, 1, heads // kvh, q.dtype)
    want = attend(q.view(b, s, heads, d), kc[:, :, :length], vc[:, :, :length], mask[..., :length], 0.3)
    plans = fused_attention._attention_plans(s * heads // kvh, b * kvh, length, d, 64)
    assert len(plans) >= 2 and plans[-1][0] == 64 and all(length > p[2] for p in plans)  # all split
    for plan in plans:
        monkeypatch.setattr(fused_attention.ATTENTION_TUNER, "pick", lambda key, cands, launch, dev, plan=plan: plan)
        got = attention(q, s, heads, kc, vc, length, 0.3, mask=mask)
        torch.testing.assert_close(got.view(b, s, -1), want, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("act", [ops.ACT_SILU, ops.ACT_GELU_TANH])
def test_backward_pieces_equal_autograd(act: int) -> None:
    """The written-out backward's kernels: the GLU's gradient, and the RMSNorm's input gradient (per-group
    weights and a shift, as π0.5's adaptive norm) added to the running one, against autograd."""
    from realtime_gw.models.fused.backward import glu_backward, norm_backward_add

    m, inter, k, n = 6, 40, 48, 3
    gu = _rand(m, 2 * inter).requires_grad_(True)
    da = _rand(m, inter, seed=1)
    f = F.silu if act == ops.ACT_SILU else (lambda t: F.gelu(t, approximate="tanh"))
    (want,) = torch.autograd.grad(f(gu[:, :inter]) * gu[:, inter:], gu, grad_outputs=da)
    got = glu_backward(gu.detach(), da, act, torch.float32)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-5)
    x = _rand(m, k, seed=2).requires_grad_(True)
    w, shift, dh, dx = _rand(m // n, k, seed=3), _rand(m // n, k, seed=4), _rand(m, k, seed=5), _rand(m, k, seed=6)
    group = torch.arange(m) // n
    (want,) = torch.autograd.grad(F.rms_norm(x, (k,), None, 1e-6) * w[group] + shift[group], x, grad_outputs=dh)
    got = norm_backward_add(dx, x.detach(), dh, w, 1e-6, n)
    torch.testing.assert_close(got, dx + want, atol=ATOL, rtol=1e-5)


def test_device_candidates_fit_the_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """GEMV tiles at 1-2 rows (4x512 first: the measured best at batch 1), dot tiles from 16 rows, K split
    where the tiles alone are too few for the SMs (PI0's down projection at batch 1), few configs each."""
    monkeypatch.setattr(gemm, "INTERPRETED", False)
    gemv = gemm.candidates(1, 4096, 1024)
    assert not any(c.dot for c in gemv) and (gemv[0].block_n, gemv[0].block_k) == (4, 512)
    down = gemm.candidates(51, 1024, 4096)
    assert all(c.dot for c in down) and down[0].splits > 1 and any(c.splits == 1 for c in down)
    assert all(len(gemm.candidates(m, 1024, 3072)) <= 6 for m in (1, 2, 3, 8, 15, 16, 64, 256))
