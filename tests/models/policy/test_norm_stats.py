"""Normalization statistics as openpi applies them: the state normalized on the way in, actions un-normalized
on the way out, z-score and quantile, from openpi's, LeRobot's and transformers' files; statistics that do
not fit the robot are refused at start-up, naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from realtime_gw.config import ConfigError, GatewayConfig
from realtime_gw.models.policy.factory import build_pi0_runner, build_policy_backend
from realtime_gw.models.policy.norm_stats import NormStats, find_norm_stats, load_norm_stats, read_stats
from realtime_gw.models.policy.rtc import rtc_arrays
from realtime_gw.records.policy import PolicyRequest, RtcGuide

RNG = np.random.default_rng(0)
STATE = {
    "mean": RNG.normal(size=8),
    "std": RNG.uniform(0.5, 2, 8),
    "q01": -RNG.uniform(1, 2, 8),
    "q99": RNG.uniform(1, 2, 8),
}
ACTIONS = {
    "mean": RNG.normal(size=7),
    "std": RNG.uniform(0.5, 2, 7),
    "q01": -RNG.uniform(1, 2, 7),
    "q99": RNG.uniform(1, 2, 7),
}


def openpi_file(path: Path, state: dict[str, Any] = STATE, actions: dict[str, Any] = ACTIONS) -> Path:
    """openpi's norm_stats.json, as ``openpi.shared.normalize.save`` writes it."""
    doc = {"norm_stats": {"state": _lists(state), "actions": _lists(actions)}}
    path.write_text(json.dumps(doc, indent=2))
    return path


def _lists(stats: dict[str, Any]) -> dict[str, list[float]]:
    return {k: np.asarray(v, np.float64).tolist() for k, v in stats.items()}


def libero_request(seed: int = 0, rtc: RtcGuide | None = None) -> PolicyRequest:
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
    state = rng.normal(size=(1, 8)).astype(np.float32)
    return PolicyRequest(images=[img, img, None], state=state, prompt="put the bowl away", seed=seed, rtc=rtc)


def expected_state(state: np.ndarray, mode: str) -> np.ndarray:
    """openpi's Normalize._normalize / _normalize_quantile."""
    if mode == "quantile":
        return (state - STATE["q01"]) / (STATE["q99"] - STATE["q01"] + 1e-6) * 2.0 - 1.0
    return (state - STATE["mean"]) / (STATE["std"] + 1e-6)


def expected_actions(x: np.ndarray, mode: str) -> np.ndarray:
    """openpi's Unnormalize._unnormalize / _unnormalize_quantile."""
    if mode == "quantile":
        return (x + 1.0) / 2.0 * (ACTIONS["q99"] - ACTIONS["q01"] + 1e-6) + ACTIONS["q01"]
    return x * (ACTIONS["std"] + 1e-6) + ACTIONS["mean"]


@pytest.mark.parametrize("mode", ["zscore", "quantile"])
def test_round_trip_through_the_runner(tmp_path: Path, mode: str) -> None:
    path = openpi_file(tmp_path / "norm_stats.json")
    config = GatewayConfig(robot="libero", policy_norm_stats=str(path), policy_norm_mode=mode)
    runner = build_pi0_runner(config)
    label = "mean/std" if mode == "zscore" else "quantiles q01/q99"
    assert runner.spec.normalization == f"{label} from {path}"
    req = libero_request()
    prepared = runner.prepare(req)
    np.testing.assert_allclose(
        prepared.state[:8].numpy(), expected_state(req.state[0], mode), rtol=1e-5, atol=1e-6
    )
    assert not prepared.state[8:].any()  # zero-padded to max_state_dim
    model = torch.from_numpy(np.random.default_rng(1).normal(size=(1, 10, 32)).astype(np.float32))
    (out,) = runner.finish([prepared], model)
    assert out.shape == (10, 7) and out.dtype == np.float32
    np.testing.assert_allclose(out, expected_actions(model[0, :, :7].numpy(), mode), rtol=1e-5, atol=1e-5)
    # Real-time chunking targets go back through the same statistics.
    stats = runner.norm
    assert stats is not None
    np.testing.assert_allclose(
        stats.normalize_actions(stats.actions(model[0, :, :7].numpy())), model[0, :, :7], atol=1e-5
    )
    guide = RtcGuide(prev_actions=out[3:], inference_delay=2, execute_horizon=3)
    target = rtc_arrays(guide, 10, 32, 7, stats).target
    np.testing.assert_allclose(target[:7, :7], model[0, 3:, :7].numpy(), atol=1e-4)


def test_lerobot_transformers_and_safetensors_formats(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    lerobot = tmp_path / "stats.json"
    lerobot.write_text(
        json.dumps({"observation.state": _lists(STATE), "action": _lists(ACTIONS), "episode_index": {}})
    )
    flat = {f"observation.state.{k}": np.asarray(v, np.float32) for k, v in STATE.items()}
    flat |= {f"action.{k}": np.asarray(v, np.float32) for k, v in ACTIONS.items()}
    tensors = tmp_path / "policy_preprocessor_step_3_normalizer_processor.safetensors"
    save_file(flat, str(tensors))
    processor = tmp_path / "processor_config.json"
    processor.write_text(json.dumps({
        "processor_class": "PI0Processor", "max_state_dim": 32,
        "state_mean": _lists(STATE)["mean"], "state_std": _lists(STATE)["std"],
        "actions_mean": _lists(ACTIONS)["mean"], "actions_std": _lists(ACTIONS)["std"],
    }))  # fmt: skip
    reference = load_norm_stats(openpi_file(tmp_path / "openpi.json"), 8, 7)
    for path in (lerobot, tensors, processor):
        stats = load_norm_stats(path, 8, 7)
        for name in ("state_mean", "state_std", "actions_mean", "actions_std"):
            np.testing.assert_allclose(getattr(stats, name), getattr(reference, name), rtol=1e-6)
    quantiles = load_norm_stats(tensors, 8, 7, mode="quantile")
    np.testing.assert_allclose(quantiles.actions_q99, ACTIONS["q99"], rtol=1e-6)
    assert set(read_stats(lerobot)) >= {"observation.state", "action"}


def test_statistics_found_inside_a_checkpoint(tmp_path: Path) -> None:
    assert find_norm_stats(tmp_path) is None
    (tmp_path / "assets" / "trossen").mkdir(parents=True)
    inside = openpi_file(tmp_path / "assets" / "trossen" / "norm_stats.json")
    assert find_norm_stats(tmp_path) == inside  # openpi's checkpoint layout: assets/<asset_id>/
    (tmp_path / "assets" / "other").mkdir()
    openpi_file(tmp_path / "assets" / "other" / "norm_stats.json")
    with pytest.raises(ValueError, match="several openpi statistics files"):
        find_norm_stats(tmp_path)
    top = openpi_file(tmp_path / "norm_stats.json")
    assert find_norm_stats(tmp_path) == top


def test_wrong_shaped_statistics_are_refused_at_start_up(tmp_path: Path) -> None:
    short = openpi_file(tmp_path / "norm_stats.json", state={k: v[:7] for k, v in STATE.items()})
    with pytest.raises(ConfigError) as e:
        build_policy_backend(GatewayConfig(robot="droid", policy_norm_stats=str(short)))
    message = str(e.value)
    assert str(short) in message and "state.mean has shape (7,), need at least (8,)" in message
    assert "robot droid" in message
    # The same file fits LIBERO (state 8, actions 7) but not ALOHA (14 and 14).
    with pytest.raises(ConfigError, match=r"state.mean has shape \(8,\), need at least \(14,\)"):
        build_policy_backend(
            GatewayConfig(robot="aloha", policy_norm_stats=str(openpi_file(tmp_path / "a.json")))
        )
    no_quantiles = openpi_file(
        tmp_path / "zscore_only.json",
        state={k: STATE[k] for k in ("mean", "std")},
        actions={k: ACTIONS[k] for k in ("mean", "std")},
    )
    with pytest.raises(ConfigError, match=r"missing state.q01 \(quantile normalization needs q01 and q99"):
        build_policy_backend(
            GatewayConfig(robot="libero", policy_norm_stats=str(no_quantiles), policy_norm_mode="quantile")
        )
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"norm_stats": {"state": {"mean": [1, "x"], "std": [1]}}}))
    with pytest.raises(ConfigError, match="is not a list of numbers"):
        build_policy_backend(GatewayConfig(policy_norm_stats=str(bad)))
    with pytest.raises(ConfigError, match="does not exist"):
        build_policy_backend(GatewayConfig(policy_norm_stats=str(tmp_path / "missing.json")))
    with pytest.raises(ValueError, match="zscore normalization needs actions_std"):
        NormStats(state_mean=STATE["mean"], state_std=STATE["std"], actions_mean=ACTIONS["mean"])
