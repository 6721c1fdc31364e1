"""Real PI0 checkpoints: a directory written by ``PI0ForConditionalGeneration.save_pretrained`` with its
tokenizer loads into the eager and the fast sampler (the same actions), serves openpi's robots, tokenizes
prompts as openpi does, and a directory that does not fit fails at start-up naming the file."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from safetensors.torch import load_file, save_file

from realtime_gw.config import ConfigError, GatewayConfig
from realtime_gw.models.policy.factory import build_pi0_runner, build_policy_backend
from realtime_gw.models.policy.pi0_fast import FastPi0Runner
from realtime_gw.records.policy import PolicyRequest
from tests.models.policy.checkpoints import save_checkpoint, save_tokenizer
from tests.openpi_examples import make_aloha_example
from tests.server.openpi_harness import serve

TOL = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pi0_checkpoint")
    return save_checkpoint(path, save_tokenizer(path))


def request(i: int, prompt: str = "pick up the red cup") -> PolicyRequest:
    rng = np.random.default_rng(i)
    images = [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8), None, None]
    if i % 2:
        images[1] = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
    return PolicyRequest(
        images=images, state=rng.uniform(0, 1, (1, 14)).astype(np.float32), prompt=prompt, seed=i
    )


@pytest.mark.parametrize("state_in_prompt", ["off", "on"])
def test_a_saved_checkpoint_loads_into_both_samplers_with_the_same_actions(
    checkpoint: Path, state_in_prompt: str
) -> None:
    config = GatewayConfig(policy_path=str(checkpoint), robot="aloha", policy_state_in_prompt=state_in_prompt)
    eager = build_pi0_runner(msgspec.structs.replace(config, policy_impl="eager"))
    fast = build_pi0_runner(msgspec.structs.replace(config, policy_impl="fast"))
    assert isinstance(fast, FastPi0Runner) and not isinstance(eager, FastPi0Runner)
    spec = eager.spec
    assert not spec.random_init and spec.model == f"pi0 from {checkpoint}"
    assert spec.tokenizer.endswith(f"from {checkpoint}") and spec.state_in_prompt == (state_in_prompt == "on")
    prepared = [eager.prepare(request(i, "fold the towel " * i)) for i in range(3)]
    ref, got = eager.run(prepared, None), fast.run(prepared, None)
    for a, b in zip(ref, got, strict=True):
        assert a.shape == (10, 14)
        assert np.abs(a - b).max() <= TOL, np.abs(a - b).max()


def test_a_saved_checkpoint_serves_openpis_aloha_example(checkpoint: Path) -> None:
    config = GatewayConfig(policy_path=str(checkpoint), robot="aloha")
    with serve(config, build_pi0_runner(config)) as gw:
        policy = WebsocketClientPolicy(host="127.0.0.1", port=gw.port)
        meta = policy.get_server_metadata()["policy_server_config"]
        assert meta["model"] == f"pi0 from {checkpoint}" and meta["random_init"] is False
        assert policy.infer(make_aloha_example())["actions"].shape == (10, 14)
        policy._ws.close()


def test_prompts_are_tokenized_as_openpi_does(checkpoint: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)

    def openpi_tokenize(prompt: str, state: np.ndarray | None, max_len: int) -> list[int]:
        """openpi's PaligemmaTokenizer.tokenize, with this tokenizer standing in for sentencepiece."""
        cleaned = prompt.strip().replace("_", " ").replace("\n", " ")
        encode: Callable[[str], list[int]] = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
        if state is not None:
            bins = np.digitize(state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
            tokens = [
                tok.bos_token_id,
                *encode(f"Task: {cleaned}, State: {' '.join(map(str, bins))};\nAction: "),
            ]
        else:
            tokens = [tok.bos_token_id, *encode(cleaned), *encode("\n")]
        return (tokens + [0] * max_len)[:max_len]

    prompt = "  pick_up the\nred cup "
    runner = build_pi0_runner(GatewayConfig(policy_path=str(checkpoint), robot="aloha"))
    p = runner.prepare(request(0, prompt))
    text = p.input_ids[-runner.spec.max_prompt_tokens :].tolist()
    assert runner.spec.max_prompt_tokens == 48 and text == openpi_tokenize(prompt, None, 48)
    assert p.attention_mask[-48:].sum() == len([t for t in openpi_tokenize(prompt, None, 48) if t])

    # A checkpoint that reads the state as text (openpi's discrete_state_input, PI0.5's convention).
    config = GatewayConfig(policy_path=str(checkpoint), robot="aloha", policy_state_in_prompt="on")
    runner = build_pi0_runner(config)
    assert runner.spec.state_in_prompt and runner.spec.max_prompt_tokens == 200
    req = request(1, prompt)
    p = runner.prepare(req)
    text = p.input_ids[-200:].tolist()  # no statistics here: the state in the prompt is the request's
    assert text == openpi_tokenize(prompt, req.state[0], 200)
    # Special-token text in a prompt is text, as sentencepiece treats it, never the special token.
    assert tok.bos_token_id not in runner.tokenizer.encode("say <bos> twice")


def test_state_in_prompt_follows_the_checkpoints_config(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, save_tokenizer(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps({**cfg, "discrete_state_input": True, "use_quantile_norm": True})
    )
    (tmp_path / "norm_stats.json").write_text(
        json.dumps({"norm_stats": {f: {"q01": [-1.0] * 14, "q99": [1.0] * 14} for f in ("state", "actions")}})
    )
    spec = build_policy_backend(GatewayConfig(policy_path=str(tmp_path), robot="aloha")).spec
    assert spec.state_in_prompt and spec.normalization.startswith("quantiles q01/q99 from")


def _drop_a_weight(path: Path) -> None:
    weights = load_file(str(path / "model.safetensors"))
    del weights["action_out_proj.weight"]
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})


def _edit_config(path: Path, **changes: object) -> None:
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **changes}))


BROKEN: dict[str, tuple[Callable[[Path], None], str]] = {
    "no config": (lambda p: (p / "config.json").unlink(), r"config.json is missing"),
    "not pi0": (lambda p: _edit_config(p, model_type="paligemma"), r"config.json: model_type is 'paligemma'"),
    "no tokenizer": (
        lambda p: (p / "tokenizer.json").unlink(),
        r"no tokenizer \(tokenizer.json or tokenizer.model\)",
    ),
    "missing weight": (_drop_a_weight, r"the weights do not match config.json: .*action_out_proj.weight"),
    "other shapes": (
        lambda p: _edit_config(
            p,
            dit_config={**json.loads((p / "config.json").read_text())["dit_config"], "intermediate_size": 96},
        ),
        r"cannot load the PI0 weights \(model.safetensors\) as config.json describes them",
    ),
    "too few action dims": (  # a model that fits its weights but not the robot
        lambda p: save_checkpoint(p, save_tokenizer(p), max_action_dim=8) and None,
        r"config.json: max_action_dim is 8, but the aloha robot needs 14 action dims",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_checkpoint_that_does_not_fit_fails_at_start_up_naming_the_file(tmp_path: Path, case: str) -> None:
    save_checkpoint(tmp_path, save_tokenizer(tmp_path))
    breaks, message = BROKEN[case]
    breaks(tmp_path)
    with pytest.raises(ConfigError, match=message) as e:
        build_policy_backend(GatewayConfig(policy_path=str(tmp_path), robot="aloha"))
    assert str(tmp_path) in str(e.value)


def test_a_tokenizer_from_another_checkpoint_is_refused(tmp_path: Path) -> None:
    size = save_tokenizer(tmp_path)
    save_checkpoint(tmp_path, size - 40, tokenizer=False)  # a smaller vocabulary than the tokenizer's
    with pytest.raises(
        ConfigError, match=re.escape(f"tokenizer.json has {size} tokens but config.json says")
    ):
        build_policy_backend(GatewayConfig(policy_path=str(tmp_path)))
