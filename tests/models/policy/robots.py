"""Shared by the policy tests: the tiny PI0 and π0.5, their runners, and robot requests that differ in
everything a batch could mix up (cameras present, prompt lengths, seeds, step counts, RTC guides).

``MODELS`` parametrises a test module's ``tiny`` fixture: every sampler test runs for both models."""

from __future__ import annotations

from typing import Any

import numpy as np

from realtime_gw.config import GatewayConfig
from realtime_gw.models.policy.backend import PolicyBackend, PolicyState
from realtime_gw.models.policy.factory import load_model, policy_spec
from realtime_gw.models.policy.pi0 import Pi0Runner
from realtime_gw.models.policy.pi0_fast import FastPi0Runner
from realtime_gw.records.policy import PolicyRequest, RtcGuide

TOL = 1e-4
"""fast vs transformers' sampler, and a robot batched vs alone (float32; GEMM shapes differ)."""
MODELS = ("pi0", "pi05")
"""PI0 and π0.5: the same runners, the same tests."""


def tiny_model(policy: str = "pi0") -> tuple[Any, Any]:
    model, tok, _, _ = load_model(GatewayConfig(policy=policy))  # type: ignore[arg-type]
    return model, tok


def spec_of(tiny: tuple[Any, Any], config: GatewayConfig | None = None) -> Any:
    """The spec the factory would give the tiny model: π0.5 reads the state from its 200-token prompt."""
    model, tok = tiny
    pi05 = model.config.model_type == "pi05"
    return policy_spec(
        config or GatewayConfig(),
        model="tiny",
        action_horizon=model.config.chunk_size,
        tokenizer=tok.name,
        state_in_prompt=pi05,
        max_prompt_tokens=200 if pi05 else 48,
    )


def eager_runner(tiny: tuple[Any, Any]) -> Pi0Runner:
    model, tok = tiny
    return Pi0Runner(model, tok, _spec(tiny))


def fast_runner(tiny: tuple[Any, Any], **kw: Any) -> FastPi0Runner:
    model, tok = tiny
    return FastPi0Runner(model, tok, _spec(tiny), **kw)


def _spec(tiny: tuple[Any, Any]) -> Any:
    return spec_of(tiny)


def robot(i: int, rtc: bool = False, num_steps: int | None = None) -> PolicyRequest:
    rng = np.random.default_rng(i)
    wrist = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8) if i % 3 else None
    guide = RtcGuide(rng.standard_normal((6, 8)).astype(np.float32), 2, 4) if rtc else None
    return PolicyRequest(
        images=[rng.integers(0, 256, (224, 224, 3), dtype=np.uint8), wrist, None],
        state=rng.standard_normal((1, 8)).astype(np.float32),
        prompt="pick up the cup " * (i % 4),
        seed=1000 + i,
        rtc=guide,
        num_steps=num_steps,
    )


def drive(
    backend: PolicyBackend,
    arrivals: dict[int, list[PolicyRequest]],
    cancel: dict[int, list[int]] | None = None,
) -> tuple[list[np.ndarray | None], list[int]]:
    """Step ``backend`` as a worker would, every open request in every step: the requests of
    ``arrivals[k]`` open before step k, ``cancel[k]`` (arrival indices) are released before it. Returns
    each request's actions (None if cancelled) and the step that finished it, in arrival order."""
    cancel = cancel or {}
    states: list[PolicyState] = []
    actions: list[np.ndarray | None] = []
    finished_at: list[int] = []
    live: set[int] = set()
    step = 0
    while step <= max(arrivals) or live:
        for i in cancel.get(step, []):
            backend.release(states[i])
            live.discard(i)
        for r in arrivals.get(step, []):
            states.append(backend.open(r))
            actions.append(None)
            finished_at.append(-1)
            live.add(len(states) - 1)
        order = sorted(live)
        results = backend.step([(states[i], []) for i in order])
        for i, res in zip(order, results, strict=True):
            assert res.error is None
            if res.done:
                (actions[i],) = res.outputs
                finished_at[i] = step
                backend.release(states[i])
                live.discard(i)
        step += 1
    return actions, finished_at
