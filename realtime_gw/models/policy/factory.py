"""Builds the policy backend the gateway's config names: the only policy module that reads
``GatewayConfig``. It loads the weights (a local ``save_pretrained`` directory or a named random-init
config) and hands the runners plain arguments, so ``pi0`` and ``pi0_fast`` know nothing of the config.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from realtime_gw.config import GatewayConfig
from realtime_gw.models.policy.backend import PolicyBackend
from realtime_gw.models.policy.noop import NoopRunner
from realtime_gw.models.policy.pi0 import Pi0Runner
from realtime_gw.models.policy.pi0_fast import FastPi0Runner
from realtime_gw.models.policy.preprocess import PromptTokenizer, load_norm_stats
from realtime_gw.models.tokenizers import ByteTokenizer, HfTokenizer, has_tokenizer_files
from realtime_gw.records.policy import PolicySpec

log = logging.getLogger(__name__)

BYTE_TOKENIZER_NAME = "byte-level (random-init model; not the PaliGemma tokenizer)"
"""What the OpenPI metadata says of the byte tokenizer a random-init PI0 uses."""

TINY_CHUNK = 10
"""Action horizon of the tiny and no-op policies (openpi's DROID horizon)."""
INIT_SEED = 0
"""Random-init weights are seeded, so every process builds the same tiny model."""


def pi0_config(name: str) -> Any:
    """A named PI0Config: ``tiny`` (CPU tests and benchmarks) or ``pi0`` (the published architecture)."""
    from transformers import PI0Config

    if name == "pi0":
        return PI0Config()
    if name != "tiny":
        raise ValueError(f"unknown policy_config {name!r}; expected 'tiny' or 'pi0'")
    # The action expert reads the VLM's KV cache, so both share layer count, KV heads and head_dim.
    gemma = {
        "model_type": "gemma",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
    }
    vision = {
        "model_type": "siglip_vision_model",
        "hidden_size": 64,
        "intermediate_size": 128,
        "patch_size": 14,
        "image_size": 224,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "vision_use_head": False,
    }
    return PI0Config(
        vlm_config={
            "model_type": "paligemma",
            "text_config": {**gemma, "vocab_size": ByteTokenizer.vocab_size},
            "vision_config": vision,
            "projection_dim": 64,
            "image_token_id": ByteTokenizer.vocab_size,  # like PI0: the id just past the vocabulary
        },
        dit_config=dict(gemma),
        chunk_size=TINY_CHUNK,
        num_inference_steps=10,
    )


def _dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_model(config: GatewayConfig) -> tuple[Any, PromptTokenizer, str, bool]:
    """(model, tokenizer, model description, random_init) on ``policy_device``, in eval mode."""
    from transformers import PI0ForConditionalGeneration

    device, dtype = config.policy_device, _dtype(config.policy_dtype, config.policy_device)
    if config.policy_path:
        path = Path(config.policy_path)
        model = PI0ForConditionalGeneration.from_pretrained(path, local_files_only=True, dtype=dtype)
        has_tokenizer = has_tokenizer_files(
            path, ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
        )
        tok: PromptTokenizer = HfTokenizer(path) if has_tokenizer else ByteTokenizer(BYTE_TOKENIZER_NAME)
        desc, random_init = f"pi0 from {path}", False
    else:
        cfg = pi0_config(config.policy_config)
        # Build straight on the device (a full PI0 is ~3.5B parameters) with seeded, reproducible weights.
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(INIT_SEED)
            model = PI0ForConditionalGeneration(cfg)
        tok = ByteTokenizer(BYTE_TOKENIZER_NAME)
        desc, random_init = f"pi0-{config.policy_config} (random init)", True
    if isinstance(tok, ByteTokenizer) and model.config.vlm_config.text_config.vocab_size < tok.vocab_size:
        raise ValueError(
            f"{desc}: vocabulary too small for the byte-level tokenizer and no tokenizer files found"
        )
    return model.to(device=device, dtype=dtype).eval(), tok, desc, random_init


def policy_spec(config: GatewayConfig, **fields: Any) -> PolicySpec:
    return PolicySpec(
        state_dim=config.policy_state_dim,
        action_dim=config.policy_action_dim,
        camera_keys=tuple(config.policy_cameras),
        optional_cameras=tuple(config.policy_optional_cameras),
        image_history=tuple(config.openpi_image_history),
        state_history=tuple(config.openpi_state_history),
        **fields,
    )


def build_pi0_runner(config: GatewayConfig) -> Pi0Runner:
    model, tok, desc, random_init = load_model(config)
    norm_path = config.policy_norm_stats
    if norm_path is None and config.policy_path and (Path(config.policy_path) / "norm_stats.json").exists():
        norm_path = str(Path(config.policy_path) / "norm_stats.json")
    norm = (
        load_norm_stats(norm_path, config.policy_state_dim, config.policy_action_dim) if norm_path else None
    )
    spec = policy_spec(
        config,
        model=desc,
        action_horizon=model.config.chunk_size,
        random_init=random_init,
        tokenizer=tok.name,
        num_inference_steps=model.config.num_inference_steps,
        sampler=resolve_impl(config),
        normalization=f"mean/std from {norm_path}" if norm_path else "none",
    )
    if len(spec.camera_keys) > 3:
        log.warning("PI0 was trained with at most 3 cameras; %d configured", len(spec.camera_keys))
    if resolve_impl(config) == "fast":
        return FastPi0Runner(
            model,
            tok,
            spec,
            config.policy_device,
            norm,
            rtc_beta=config.policy_rtc_beta,
            buckets=tuple(config.policy_graph_buckets),
            compile_expert=compile_enabled(config),
            compile_budget_s=config.policy_compile_budget_s,
        )
    return Pi0Runner(model, tok, spec, config.policy_device, norm, rtc_beta=config.policy_rtc_beta)


def resolve_impl(config: GatewayConfig) -> str:
    """``policy_impl`` with ``auto`` decided: ``fast`` on CUDA, ``eager`` on the CPU."""
    if config.policy_impl != "auto":
        return config.policy_impl
    return "fast" if config.policy_device.startswith("cuda") else "eager"


def compile_enabled(config: GatewayConfig) -> bool:
    """``policy_compile`` with ``auto`` decided: on where the fast sampler captures CUDA graphs."""
    if config.policy_compile != "auto":
        return config.policy_compile == "on"
    return resolve_impl(config) == "fast" and config.policy_device.startswith("cuda")


def build_policy_backend(config: GatewayConfig) -> PolicyBackend:
    """The backend ``policy`` names: ``pi0`` (tiny/full/local weights) or ``noop`` (zeros, no model)."""
    slots = max(1, config.openpi_max_sessions * 2)
    if config.policy == "noop":
        spec = policy_spec(
            config, model="noop (zeros)", action_horizon=TINY_CHUNK, tokenizer="none", sampler="none"
        )
        return PolicyBackend(NoopRunner(spec), slots=slots)
    if config.policy != "pi0":
        raise ValueError(f"no policy backend for policy={config.policy!r}")
    return PolicyBackend(build_pi0_runner(config), slots=slots)
