"""π0.5 (transformers' ``PI05ForConditionalGeneration``) served like PI0: ``--policy pi05`` builds a tiny
random-init model or loads a ``save_pretrained`` directory; the state goes into the prompt as transformers'
``PI05Processor`` writes it (quantile-normalized, 256 bins); the ``auto`` settings follow openpi's π0.5
configs per robot. The samplers themselves are tested for both models in ``test_pi0_fast.py`` and
``test_phased.py``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np
import pytest
import torch

from realtime_gw.config import ConfigError, GatewayConfig
from realtime_gw.models.families import chosen
from realtime_gw.models.policy.factory import build_pi0_runner, build_policy_backend
from realtime_gw.models.policy.pi0_fast import FastPi0Runner
from realtime_gw.models.tokenizers import ByteTokenizer
from realtime_gw.records.policy import PolicyRequest
from tests.models.policy.checkpoints import save_checkpoint, save_tokenizer

TOL = 1e-4
Q01, Q99 = np.linspace(-2.0, -0.5, 8), np.linspace(0.5, 3.0, 8)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny π0.5 saved by ``save_pretrained``, its tokenizer and openpi's quantile statistics."""
    path = tmp_path_factory.mktemp("pi05_checkpoint")
    save_checkpoint(path, save_tokenizer(path), policy="pi05")
    stats = {"q01": Q01.tolist(), "q99": Q99.tolist()}
    (path / "norm_stats.json").write_text(json.dumps({"norm_stats": {"state": stats, "actions": stats}}))
    return path


def droid_request(i: int, prompt: str = "put the marker in the cup") -> PolicyRequest:
    rng = np.random.default_rng(i)
    images = [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8), None, None]
    if i % 2:
        images[1] = rng.integers(0, 256, (180, 320, 3), dtype=np.uint8)
    return PolicyRequest(
        images=images, state=rng.uniform(-1, 2, (1, 8)).astype(np.float32), prompt=prompt, seed=i
    )


def processor_prompt(prompt: str, state: np.ndarray, stats: dict[str, Any] | None) -> str:
    """transformers' ``PI05Processor``: its normalization (when ``stats``) and its prompt text, without the
    image tokens and BOS (our layout puts the image tokens first, then BOS, as its prompt does)."""
    from transformers.models.pi05.processing_pi05 import PI05Processor

    proc = SimpleNamespace(image_token="", image_seq_length=0, tokenizer=SimpleNamespace(bos_token=""))
    values = torch.as_tensor(state, dtype=torch.float32)[None]
    if stats is not None:
        proc = SimpleNamespace(**vars(proc), state_q01=stats["q01"], state_q99=stats["q99"])
        values = PI05Processor.normalize(proc, values, "state")  # type: ignore[arg-type]
    (text,) = PI05Processor.build_prompts(proc, [prompt], [[None]], values)  # type: ignore[arg-type]
    return text


def test_policy_pi05_is_a_family_and_builds_a_tiny_random_init_model() -> None:
    config = GatewayConfig(policy="pi05", robot="droid")
    assert chosen("policy", config).name == "pi05"
    runner = build_pi0_runner(config)
    spec = runner.spec
    assert type(runner.model).__name__ == "PI05ForConditionalGeneration"
    assert spec.model == "pi05-tiny (random init)" and spec.random_init
    assert spec.state_in_prompt and spec.max_prompt_tokens == 200 and spec.action_horizon == 10
    # Random weights stand for a trained model: the adaptive norms are not the zeros transformers starts
    # from, so the action expert reads the observation (at zero gates it would not).
    dense = runner.model.model.dit.layers[0].input_layernorm.dense.weight
    assert dense.abs().max() > 0
    reqs = [droid_request(i) for i in range(3)]
    actions = runner.run([runner.prepare(r) for r in reqs], None)
    assert all(a.shape == (10, 8) and a.dtype == np.float32 for a in actions)
    dark = droid_request(0)
    dark.images = [np.zeros_like(dark.images[0]), None, None]
    assert np.abs(runner.run([runner.prepare(dark)], None)[0] - actions[0]).max() > 10 * TOL


def test_the_state_is_written_into_the_prompt_as_transformers_processor_writes_it(checkpoint: Path) -> None:
    tok = ByteTokenizer()
    random_init = build_pi0_runner(GatewayConfig(policy="pi05", robot="droid"))
    loaded = build_pi0_runner(GatewayConfig(policy="pi05", robot="droid", policy_path=str(checkpoint)))
    assert loaded.norm is not None and loaded.norm.mode == "quantile"  # π0.5's normalization by default
    for i in range(4):
        req = droid_request(i, prompt="  pick_up the\nred cup ")
        # No statistics: the request's state, binned as is; byte tokens decode back to the text.
        p = random_init.prepare(req)
        ids = [int(t) for t, m in zip(p.input_ids[-200:], p.attention_mask[-200:], strict=True) if m]
        assert ids[0] == tok.bos_id
        text = bytes(t - 3 for t in ids[1:]).decode()
        assert text == processor_prompt(req.prompt, req.state[0], None)
        # With the checkpoint's quantiles: the same bins as the processor's own normalization.
        bins = processor_prompt(req.prompt, req.state[0], {"q01": Q01.tolist(), "q99": Q99.tolist()})
        want = loaded.tokenizer.encode(bins)
        got = loaded.prepare(req).input_ids[-200:].tolist()
        assert got[1 : 1 + len(want)] == want


def test_a_pi05_checkpoint_loads_into_both_samplers_with_the_same_actions(checkpoint: Path) -> None:
    config = GatewayConfig(policy="pi05", robot="droid", policy_path=str(checkpoint))
    eager = build_pi0_runner(msgspec.structs.replace(config, policy_impl="eager"))
    fast = build_pi0_runner(msgspec.structs.replace(config, policy_impl="fast"))
    assert isinstance(fast, FastPi0Runner) and not isinstance(eager, FastPi0Runner)
    assert eager.spec.model == f"pi05 from {checkpoint}" and eager.spec.normalization.startswith("quantiles")
    prepared = [eager.prepare(droid_request(i, "fold the towel " * i)) for i in range(3)]
    for a, b in zip(eager.run(prepared, None), fast.run(prepared, None), strict=True):
        assert a.shape == (10, 8) and np.abs(a - b).max() <= TOL, np.abs(a - b).max()


def test_transformers_processor_statistics_are_read(tmp_path: Path) -> None:
    """``PI05Processor.save_pretrained`` keeps its quantiles in processor_config.json."""
    save_checkpoint(tmp_path, save_tokenizer(tmp_path), policy="pi05")
    stats = {f"{f}_{q}": v.tolist() for f in ("state", "actions") for q, v in (("q01", Q01), ("q99", Q99))}
    (tmp_path / "processor_config.json").write_text(json.dumps({"processor_class": "PI05Processor", **stats}))
    spec = build_policy_backend(GatewayConfig(policy="pi05", robot="droid", policy_path=str(tmp_path))).spec
    assert spec.normalization == f"quantiles q01/q99 from {tmp_path / 'processor_config.json'}"


@pytest.mark.parametrize(
    ("robot", "state_in_prompt", "delta"),
    [("droid", True, None), ("libero", False, None), ("aloha", True, (True,) * 6 + (False,))],
)
def test_auto_settings_follow_openpis_pi05_configs(robot: str, state_in_prompt: bool, delta: Any) -> None:
    """openpi's pi05_droid and π0.5 on ALOHA read the state from the prompt; pi05_libero does not, and
    predicts absolute actions (its ``extra_delta_transform`` is off, PI0's is on)."""
    spec = build_policy_backend(GatewayConfig(policy="pi05", robot=robot)).spec  # type: ignore[arg-type]
    assert spec.state_in_prompt is state_in_prompt and spec.max_prompt_tokens == 200
    mask = spec.robot.delta_mask
    assert (mask is None) if delta is None else mask[:7] == delta
    pi0 = build_policy_backend(GatewayConfig(policy="pi0", robot=robot)).spec  # type: ignore[arg-type]
    assert not pi0.state_in_prompt and pi0.max_prompt_tokens == 48
    assert (pi0.robot.delta_mask is None) == (robot == "droid")
    forced = GatewayConfig(policy="pi05", robot=robot, policy_state_in_prompt="on")  # type: ignore[arg-type]
    assert build_policy_backend(forced).spec.state_in_prompt


def test_a_checkpoint_of_the_other_model_is_refused_naming_the_choice(
    checkpoint: Path, tmp_path: Path
) -> None:
    with pytest.raises(
        ConfigError, match=r"model_type is 'pi05', not 'pi0' \(--policy pi0\): serve it with --policy pi05"
    ):
        build_policy_backend(GatewayConfig(policy="pi0", policy_path=str(checkpoint), robot="droid"))
    save_checkpoint(tmp_path, save_tokenizer(tmp_path))
    with pytest.raises(
        ConfigError, match=r"model_type is 'pi0', not 'pi05' \(--policy pi05\): serve it with --policy pi0"
    ):
        build_policy_backend(GatewayConfig(policy="pi05", policy_path=str(tmp_path), robot="droid"))
