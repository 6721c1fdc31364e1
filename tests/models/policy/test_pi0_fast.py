"""The fast PI0 and π0.5 sampler (static prefix KV, bucketed graphs) and real-time chunking, on the tiny
configs (CPU): every test that takes the ``tiny`` model runs for both.

The fast path must be the same function as transformers' ``sample_actions`` (float32, same noise), alone
and in mixed batches; RTC must freeze the first ``d`` actions to the previous chunk and shrink the jump
at the switch."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch

from realtime_gw.config import ConfigError, GatewayConfig
from realtime_gw.models.fp8 import Fp8Weight
from realtime_gw.models.policy import pi0_fast as policy_fast
from realtime_gw.models.policy.factory import (
    build_pi0_runner,
    compile_enabled,
    resolve_impl,
)
from realtime_gw.models.policy.pi0 import Pi0Runner
from realtime_gw.models.policy.pi0_fast import FastPi0Runner
from realtime_gw.models.policy.pi0_functional import Cache
from realtime_gw.models.policy.preprocess import NormStats
from realtime_gw.models.policy.rtc import guidance_scale, guidance_weights
from realtime_gw.records.policy import PolicyRequest, RtcGuide
from tests.models.policy.robots import MODELS, spec_of, tiny_model

TOL = 1e-4


@pytest.fixture(scope="module", params=MODELS)
def tiny(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    return tiny_model(request.param)


def runners(tiny: tuple[Any, Any], **fast_kw: Any) -> tuple[Pi0Runner, FastPi0Runner]:
    model, tok = tiny
    spec = spec_of(tiny)
    return Pi0Runner(model, tok, spec), FastPi0Runner(model, tok, spec, **fast_kw)


def request(i: int, seed: int | None = None, rtc: RtcGuide | None = None, **kw: Any) -> PolicyRequest:
    rng = np.random.default_rng(i)
    wrist = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8) if i % 3 else None
    return PolicyRequest(
        images=[rng.integers(0, 256, (224, 224, 3), dtype=np.uint8), wrist, None],
        state=rng.standard_normal((1, 8)).astype(np.float32),
        prompt="pick up the cup " * (i % 4),  # different prompt lengths: different padding masks
        seed=1000 + i if seed is None else seed,
        rtc=rtc,
        **kw,
    )


def test_fast_equals_sample_actions_at_batch_one(tiny: tuple[Any, Any]) -> None:
    eager, fast = runners(tiny)
    for i in range(2):
        (p,) = [eager.prepare(request(i))]
        (ref,), (got,) = eager.run([p], None), fast.run([p], None)
        assert np.abs(got - ref).max() <= TOL, np.abs(got - ref).max()
    # Fewer denoising steps go through the same loop.
    p = eager.prepare(request(5, num_steps=3))
    assert np.abs(fast.run([p], 3)[0] - eager.run([p], 3)[0]).max() <= TOL


def test_mixed_batch_has_no_crosstalk(tiny: tuple[Any, Any]) -> None:
    eager, fast = runners(tiny)
    prepared = [eager.prepare(request(i)) for i in range(6)]  # masked cameras, prompt lengths, seeds
    together = fast.run(prepared, None)
    for i, p in enumerate(prepared):
        (ref,) = eager.run([p], None)
        assert np.abs(together[i] - ref).max() <= TOL, f"robot {i}"
        assert np.abs(fast.run([p], None)[0] - together[i]).max() <= TOL
    assert not np.allclose(together[0], together[1])


def test_bucket_buffers_pad_and_reuse(tiny: tuple[Any, Any], caplog: pytest.LogCaptureFixture) -> None:
    """The graph path's static buffers, exercised on the CPU: capture fails there and the runner launches
    the captured code itself, over the same padded bucket buffers."""
    eager, fast = runners(tiny, cuda_graphs=True, buckets=(1, 4))
    prefix_rows: list[int] = []
    fill = fast.fn.fill_prefix

    def counted_fill(cache: Cache, batch: Any) -> None:
        prefix_rows.append(cache.k[0].shape[0])
        fill(cache, batch)

    fast.fn.fill_prefix = counted_fill  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="realtime_gw.models.policy.pi0_fast"):
        three = [eager.prepare(request(10 + i)) for i in range(3)]
        got = fast.run(three, None)  # bucket 4 with one padding row
        assert prefix_rows == [3]  # the prefix runs at the exact size: no padding row costs a robot
        one = fast.run([three[2]], None)  # bucket 1
        again = fast.run(three[:2], None)  # bucket 4 again: rows 2-3 hold stale inputs
    assert "capture" in caplog.text
    for g, p in zip(got, three, strict=True):
        assert np.abs(g - eager.run([p], None)[0]).max() <= TOL
    assert np.abs(one[0] - got[2]).max() <= TOL
    assert np.abs(again[0] - got[0]).max() <= TOL and np.abs(again[1] - got[1]).max() <= TOL
    assert len(fast.run([eager.prepare(request(20 + i)) for i in range(6)], None)) == 6  # split over buckets


@pytest.mark.parametrize("rtc", [False, True])
def test_compiled_expert_step_is_the_same_function(tiny: tuple[Any, Any], rtc: bool) -> None:
    """The compiled step (here through AOTAutograd without inductor, so no C compiler is needed) writes
    the same cache and, for RTC, differentiates to the same guidance as the plain step."""
    _, fast = runners(tiny)
    fn = fast.fn
    prev = np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)
    prepared = [fast.prepare(request(30 + i, rtc=RtcGuide(prev, 2, 4) if rtc else None)) for i in range(2)]
    batch = fn.stack(prepared, fast.device, rtc=rtc)
    compiled = torch.compile(fn.velocity, backend="aot_eager", dynamic=False)
    outs = []
    with torch.no_grad():
        for velocity in (None, compiled):
            cache = Cache(fn, len(prepared), batch.input_ids.shape[1], fast.device)
            fn.fill_prefix(cache, batch)
            outs.append(fn.denoise(cache, batch, 10, velocity=velocity))
    assert (outs[0] - outs[1]).abs().max().item() <= TOL


@pytest.mark.parametrize("fp8", [False, True])
def test_compiled_prefix_is_the_same_function_in_two_compiles(tiny: tuple[Any, Any], fp8: bool) -> None:
    """The compiled prefix (AOTAutograd without inductor, as above) writes the same K/V, masks and rotary
    tables as the eager one at every robot count, over row views of the slots' staging buffers as served:
    one compile for one robot, one with the count dynamic for the rest, and no graph break; the FP8
    prefix (its quantizing and ``_scaled_mm``) as well."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    _, fast = runners(tiny, prefix_fp8=fp8)
    fn = fast.fn
    assert fn.prefix_fp8 == fp8
    graphs: list[Any] = []

    def counting(gm: Any, inputs: Any) -> Any:
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    compiled = torch.compile(fn.fill_prefix, backend=aot_autograd(fw_compiler=counting))
    prepared = [fast.prepare(request(40 + i)) for i in range(4)]
    full = fn.stack(prepared, fast.device, rtc=False)
    caches = [Cache(fn, 4, full.input_ids.shape[1], fast.device) for _ in range(2)]
    with torch.no_grad():
        for n in (1, 2, 3, 4):
            for fill, cache in zip((fn.fill_prefix, compiled), caches, strict=True):
                fill(cache.rows(n), full.rows(n))
            for a, b in zip(caches[0].buffers(), caches[1].buffers(), strict=True):
                assert (a[:n].float() - b[:n].float()).abs().max().item() <= TOL
    assert len(graphs) == 2


def test_compiles_only_in_warmup_and_within_budget(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Buckets are compiled smallest first while the budget lasts; a capture after warm-up (a new step
    count) never compiles, since a serving step must not stall for a compile."""
    _, fast = runners(tiny, cuda_graphs=True, buckets=(1, 2, 4), compile_graphs=True, compile_budget_s=16)
    clock = [0.0]
    captured: list[tuple[int, str, bool]] = []

    def fake_capture(kind: str, size: int, compiled: bool) -> object:
        captured.append((size, kind, compiled))
        clock[0] += 3.0  # each capture "takes" 3 s: the budget runs out during bucket 2
        return object()

    monkeypatch.setattr(fast.slots, "_capture", fake_capture)
    monkeypatch.setattr(policy_fast.time, "monotonic", lambda: clock[0])
    fast.warmup()
    compiled = {(size, kind) for size, kind, c in captured if c}
    assert compiled == {(1, "prefix"), (1, "plain"), (1, "rtc"), (2, "prefix"), (2, "plain"), (2, "rtc")}
    prefixes = [size for size, kind, _ in captured if kind == "prefix"]
    assert prefixes == [1, 2, 3, 4]  # one prefix graph per exact robot count
    assert [size for size, kind, _ in captured if kind == "commit"] == [1, 2, 3, 4]
    report = fast.warmup_report
    assert report["compiled"] == {1: ["plain", "rtc"], 2: ["plain", "rtc"], 4: []}
    assert report["buckets_compiled"] == [1, 2] and report["buckets_uncompiled"] == [4]
    assert report["prefixes_compiled"] == [1, 2]
    captured.clear()
    for key in (("plain", 1), ("prefix", 1)):
        del fast.slots.graphs[key]
        fast.slots.compiled.discard(key)
    fast.slots.graph("plain", 1)  # captured again while serving: never compiled
    fast.slots.graph("prefix", 1)
    assert captured == [(1, "plain", False), (1, "prefix", False)]


def test_compile_setting() -> None:
    assert not compile_enabled(GatewayConfig())
    assert compile_enabled(GatewayConfig(policy_device="cuda"))
    assert not compile_enabled(GatewayConfig(policy_device="cuda", policy_compile="off"))
    assert not compile_enabled(GatewayConfig(policy_device="cuda", policy_impl="eager"))
    assert compile_enabled(GatewayConfig(policy_compile="on"))


def test_guidance_weights_and_scale() -> None:
    w = guidance_weights(horizon=10, prev_len=8, delay=2, execute_horizon=3)
    assert w[:2].tolist() == [1.0, 1.0] and (w[7:] == 0).all()
    assert (np.diff(w[2:7]) < 0).all() and 0 < w[6] < w[2] < 1
    assert guidance_weights(10, 4, 1, 2)[4:].max() == 0  # nothing past the previous chunk
    assert guidance_scale(1.0) == 5.0 and guidance_scale(1.0, beta=2.0) == 2.0  # clipped at pure noise
    assert guidance_scale(0.5) == pytest.approx(2.0) and guidance_scale(0.9, beta=100) > 2.0
    with pytest.raises(ValueError, match="delay"):
        guidance_weights(10, 3, 4, 2)


def test_rtc_freezes_the_executed_steps_and_shrinks_the_jump(tiny: tuple[Any, Any]) -> None:
    """20 random episodes: chunk A, then s steps later chunk B from a new observation with RTC against
    what is left of A (delay d), and the same B without RTC. The jump is ||B[d] - A_left[d]||: how far
    the robot's action moves off the previous plan at the first step the new chunk decides."""
    _, fast = runners(tiny)
    h, s, d, episodes = 10, 4, 2, 20
    first = fast.run([fast.prepare(request(100 + e)) for e in range(episodes)], None)
    left = [a[s:] for a in first]
    guided = [fast.prepare(request(200 + e, rtc=RtcGuide(left[e], d, s))) for e in range(episodes)]
    plain = [fast.prepare(request(200 + e)) for e in range(episodes)]
    out = fast.run(guided + plain, None)  # RTC and plain rows share one batch
    with_rtc, without = out[:episodes], out[episodes:]
    # The denoiser itself lands on the frozen steps (before the runner writes them exactly).
    raw = fast.fn.sample(guided, h, fast.device)[:, :, :8].numpy()
    for e in range(episodes):
        assert np.abs(raw[e, :d] - left[e][:d]).max() <= 1e-3
        np.testing.assert_array_equal(with_rtc[e][:d], left[e][:d])
        assert np.abs(without[e] - fast.run([plain[e]], None)[0]).max() <= TOL  # no crosstalk from RTC rows
    jump = np.array([np.linalg.norm(with_rtc[e][d] - left[e][d]) for e in range(episodes)])
    jump0 = np.array([np.linalg.norm(without[e][d] - left[e][d]) for e in range(episodes)])
    assert jump.mean() < 0.5 * jump0.mean(), (jump.mean(), jump0.mean())
    assert (jump < jump0).sum() >= 18, (jump, jump0)
    # The guided overlap stays closer to the old plan than an unguided chunk does.
    overlap = slice(d, h - s)
    gap = np.mean([np.abs(with_rtc[e][overlap] - left[e][overlap]).mean() for e in range(episodes)])
    gap0 = np.mean([np.abs(without[e][overlap] - left[e][overlap]).mean() for e in range(episodes)])
    assert gap < gap0


def test_eager_runner_serves_rtc_through_the_guided_sampler(tiny: tuple[Any, Any]) -> None:
    eager, fast = runners(tiny)
    norm = NormStats(
        state_mean=np.zeros(8, np.float32),
        state_std=np.ones(8, np.float32),
        actions_mean=np.full(8, 0.5, np.float32),
        actions_std=np.full(8, 2.0, np.float32),
    )
    eager.norm = fast.norm = norm
    prev = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    req = request(3, rtc=RtcGuide(prev, 3, 4))
    (a,), (b,) = eager.run([eager.prepare(req)], None), fast.run([fast.prepare(req)], None)
    assert np.abs(a - b).max() <= TOL
    np.testing.assert_array_equal(a[:3], prev[:3])  # robot space, exact, through the normalization
    with pytest.raises(ValueError, match="prev_actions has shape"):
        eager.prepare(request(3, rtc=RtcGuide(np.zeros((11, 8), np.float32), 1, 1)))


def test_fp8_prefix_is_served_within_its_guard(tiny: tuple[Any, Any]) -> None:
    """``prefix_fp8``: SigLIP's and Gemma's projections in e4m3, the expert's untouched; the actions stay
    near transformers' (the guard measured it) but are not the model dtype's."""
    eager, fast = runners(tiny, prefix_fp8=True)
    _, plain = runners(tiny)
    assert fast.fp8_check is not None and fast.fp8_check["served"]
    assert 0 < fast.fp8_check["error"] <= fast.fp8_check["max_error"]
    assert fast.warmup_report["fp8"] == fast.fp8_check
    for blocks in (fast.fn.vision_blocks, fast.fn.lm_blocks):
        assert all(isinstance(getattr(b, w), Fp8Weight) for b in blocks for w in ("qkv", "o"))
    assert all(isinstance(b.gate_up, Fp8Weight) and isinstance(b.down, Fp8Weight) for b in fast.fn.lm_blocks)
    assert all(isinstance(b.fc1, Fp8Weight) for b in fast.fn.vision_blocks)
    assert not any(isinstance(b.qkv, Fp8Weight) or isinstance(b.down, Fp8Weight) for b in fast.fn.dit_blocks)
    prepared = [eager.prepare(request(50 + i)) for i in range(3)]
    got, ref, bf = fast.run(prepared, None), eager.run(prepared, None), plain.run(prepared, None)
    for g, r, b in zip(got, ref, bf, strict=True):
        assert np.linalg.norm(g - r) <= 0.1 * np.linalg.norm(r)
        assert np.abs(g - r).max() > TOL  # FP8 really ran
        assert np.abs(b - r).max() <= TOL


def test_fp8_prefix_over_its_limit_falls_back(
    tiny: tuple[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    eager, _ = runners(tiny)
    with caplog.at_level(logging.WARNING, logger="realtime_gw.models.policy.pi0_fast"):
        _, fast = runners(tiny, prefix_fp8=True, fp8_max_error=1e-4)
    assert "FP8 prefix off" in caplog.text
    assert fast.fp8_check is not None and not fast.fp8_check["served"] and fast.fp8_check["error"] > 1e-4
    assert not fast.fn.prefix_fp8 and fast.slots.fn is fast.fn
    p = eager.prepare(request(60))
    assert np.abs(fast.run([p], None)[0] - eager.run([p], None)[0]).max() <= TOL


def test_build_passes_the_fp8_setting() -> None:
    runner = build_pi0_runner(GatewayConfig(policy_impl="fast", policy_fp8=True, policy_fp8_max_error=0.5))
    assert isinstance(runner, FastPi0Runner) and runner.fn.prefix_fp8
    assert runner.fp8_check is not None and runner.fp8_check["max_error"] == 0.5
    with pytest.raises(ConfigError, match="policy_fp8 needs the fast sampler"):
        build_pi0_runner(GatewayConfig(policy_fp8=True))  # auto on the CPU is eager


def test_build_selects_the_sampler() -> None:
    assert resolve_impl(GatewayConfig()) == "eager"
    assert resolve_impl(GatewayConfig(policy_device="cuda:0")) == "fast"
    assert resolve_impl(GatewayConfig(policy_device="cuda", policy_impl="eager")) == "eager"
    runner = build_pi0_runner(GatewayConfig(policy_impl="fast"))
    assert isinstance(runner, FastPi0Runner) and runner.spec.sampler == "fast" and not runner.cuda_graphs
