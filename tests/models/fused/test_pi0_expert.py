"""The PI0 / π0.5 action expert on the fused kernels (tiny configs, float32, Triton's interpreter):
the same velocity as ``Pi0Functional.velocity``, the same vector-Jacobian product (RTC's guidance)
through ``FusedLayers``' written-out backward, and the same chunks through the fast runner."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from realtime_gw.models.fused.pi0_expert import FusedExpert  # noqa: E402
from realtime_gw.models.policy.pi0 import Pi0Runner  # noqa: E402
from realtime_gw.models.policy.pi0_fast import FastPi0Runner  # noqa: E402
from realtime_gw.models.policy.pi0_functional import Cache  # noqa: E402
from realtime_gw.records.policy import RtcGuide  # noqa: E402
from tests.models.policy.robots import MODELS, TOL, spec_of, tiny_model  # noqa: E402
from tests.models.policy.test_pi0_fast import request  # noqa: E402


@pytest.fixture(scope="module", params=MODELS)
def tiny(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    return tiny_model(request.param)


def test_velocity_and_its_vjp_equal_eager(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    fast = FastPi0Runner(model, tok, spec_of(tiny))
    fn = fast.fn
    prepared = [fast.prepare(request(i)) for i in range(2)]  # different masks and prompt lengths
    batch = fn.stack(prepared, fast.device, rtc=False)
    cache = Cache(fn, 2, batch.input_ids.shape[1], fast.device)
    with torch.no_grad():
        fn.fill_prefix(cache, batch)
    fused = FusedExpert(fn)
    t = torch.tensor([0.7, 0.3])
    cotangent = torch.randn(batch.noise.shape, generator=torch.Generator().manual_seed(0))

    def velocity_and_vjp(velocity: Any) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            plain = velocity(cache, batch.noise, t, batch.state)
        x = batch.noise.detach().clone().requires_grad_(True)
        v = velocity(cache, x, t, batch.state)
        (grad,) = torch.autograd.grad(v, x, grad_outputs=cotangent)
        assert (plain - v.detach()).abs().max().item() <= 1e-6  # the grad path computes the same forward
        return plain, grad

    (v_ref, g_ref), (v, g) = velocity_and_vjp(fn.velocity), velocity_and_vjp(fused.velocity)
    assert (v - v_ref).abs().max().item() <= TOL
    assert (g - g_ref).abs().max().item() <= TOL * max(1.0, g_ref.abs().max().item())
    assert g_ref.abs().max().item() > 1e-3  # a gradient that says something


def test_fast_runner_chunks_equal_eager(tiny: tuple[Any, Any]) -> None:
    """Plain chunks against transformers' ``sample_actions``; RTC chunks (plain rows in the batch too)
    against the fast runner's own guided sampler on the eager expert."""
    model, tok = tiny
    spec = spec_of(tiny)
    eager = Pi0Runner(model, tok, spec)
    fused = FastPi0Runner(model, tok, spec, fused_expert=True)
    reference = FastPi0Runner(model, tok, spec)
    assert fused.slots.fused_velocity is not None and reference.slots.fused_velocity is None
    p = eager.prepare(request(1))
    (want,), (got,) = eager.run([p], 3), fused.run([p], 3)  # 3 steps: the interpreter is slow
    assert np.abs(got - want).max() <= TOL
    prev = np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)
    prepared = [fused.prepare(request(40, rtc=RtcGuide(prev, 2, 4))), fused.prepare(request(41))]
    for a, b in zip(fused.run(prepared, 3), reference.run(prepared, 3), strict=True):
        assert np.abs(a - b).max() <= TOL, np.abs(a - b).max()
