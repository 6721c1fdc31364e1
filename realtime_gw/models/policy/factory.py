"""Builds the policy backend the gateway's config names: the only policy module that reads
``GatewayConfig``. It loads the weights (a local ``save_pretrained`` directory or a named random-init
config) and hands the runners plain arguments, so ``pi0`` and ``pi0_fast`` know nothing of the config.

``policy`` is ``pi0`` (transformers' ``PI0ForConditionalGeneration``) or ``pi05`` (π0.5,
``PI05ForConditionalGeneration``); both run through the same runners. The ``auto`` settings follow
openpi's configs for the model: π0.5 reads the state as discrete tokens in its prompt (except openpi's
``pi05_libero``), normalizes with quantiles and has 200 prompt tokens; PI0 as its checkpoint says.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import torch

from realtime_gw.config import ConfigError, GatewayConfig
from realtime_gw.models import fused
from realtime_gw.models.families import StagePlan
from realtime_gw.models.policy.backend import PolicyBackend
from realtime_gw.models.policy.compile_cache import CompileCache, cache_key, default_cache_dir
from realtime_gw.models.policy.noop import NoopRunner
from realtime_gw.models.policy.norm_stats import NormStats, find_norm_stats, load_norm_stats, mode_hint
from realtime_gw.models.policy.pi0 import Pi0Runner
from realtime_gw.models.policy.pi0_fast import FastPi0Runner
from realtime_gw.models.policy.preprocess import PromptTokenizer
from realtime_gw.models.tokenizers import ByteTokenizer, HfTokenizer
from realtime_gw.protocols.robots import RobotFormat, robot_format
from realtime_gw.records.policy import PolicySpec

log = logging.getLogger(__name__)

BYTE_TOKENIZER_NAME = "byte-level (random-init model; not the PaliGemma tokenizer)"
"""What the OpenPI metadata says of the byte tokenizer a random-init PI0 uses."""

TINY_CHUNK = 10
"""Action horizon of the tiny and no-op policies (openpi's DROID horizon)."""
INIT_SEED = 0
"""Random-init weights are seeded, so every process builds the same tiny model."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
"""A checkpoint's own tokenizer (PaliGemma's, saved by ``save_pretrained`` beside the weights)."""
PROMPT_TOKENS, STATE_PROMPT_TOKENS = 48, 200
"""openpi's ``max_token_len``: 48 for PI0's prompt, 200 where the state is written into it (PI0.5)."""
MODEL_CLASSES = {"pi0": "PI0ForConditionalGeneration", "pi05": "PI05ForConditionalGeneration"}
"""transformers' class per ``policy`` choice; its config's ``model_type`` is the same name."""
LABELS = {"pi0": "PI0", "pi05": "π0.5"}


def model_class(policy: str) -> Any:
    """transformers' model class for ``policy`` (``pi0`` / ``pi05``); a clear error where the installed
    transformers lacks it."""
    import transformers

    name = MODEL_CLASSES[policy]
    try:
        return getattr(transformers, name)
    except AttributeError:
        raise ConfigError(
            f"--policy {policy}: transformers {transformers.__version__} has no {name}; install a "
            f"transformers release that ships {LABELS[policy]}"
        ) from None


def pi0_config(name: str) -> Any:
    """A named PI0Config: ``tiny`` (CPU tests and benchmarks) or ``pi0`` (the published architecture)."""
    return policy_model_config("pi0", name)


def policy_model_config(policy: str, name: str) -> Any:
    """A named config of ``policy`` (``pi0`` / ``pi05``): ``tiny`` (CPU tests and benchmarks) or ``pi0``
    (the model's published architecture)."""
    import transformers

    config_class = getattr(transformers, MODEL_CLASSES[policy].replace("ForConditionalGeneration", "Config"))
    if name == "pi0":
        return config_class()
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
    return config_class(
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


def policy_kind(config: GatewayConfig) -> str:
    """``pi0`` or ``pi05``: the model family ``policy`` names."""
    if config.policy not in MODEL_CLASSES:
        raise ValueError(f"no PI0-family model for policy={config.policy!r}")
    return config.policy


def load_model(config: GatewayConfig) -> tuple[Any, PromptTokenizer, str, bool]:
    """(model, tokenizer, model description, random_init) on ``policy_device``, in eval mode."""
    device, dtype = config.policy_device, _dtype(config.policy_dtype, config.policy_device)
    kind = policy_kind(config)
    if config.policy_path:
        path = Path(config.policy_path)
        model, tok = load_checkpoint(path, dtype, kind)
        desc, random_init = f"{kind} from {path}", False
    else:
        cls = model_class(kind)
        cfg = policy_model_config(kind, config.policy_config)
        # Build straight on the device (a full PI0 is ~3.5B parameters) with seeded, reproducible weights.
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(INIT_SEED)
            model = cls(cfg)
            _randomize_adaptive_norms(model)
        tok = ByteTokenizer(BYTE_TOKENIZER_NAME)
        desc, random_init = f"{kind}-{config.policy_config} (random init)", True
    return model.to(device=device, dtype=dtype).eval(), tok, desc, random_init


def _randomize_adaptive_norms(model: Any) -> None:
    """π0.5 initialises its adaptive norms' projections to zero (a trained checkpoint overwrites them):
    every gate would be 0 and the action expert would ignore the observation. Random-init weights stand
    for a trained model, so these get ``nn.Linear``'s own random init like every other projection."""
    for module in model.modules():
        if type(module).__name__ == "PI05AdaptiveRMSNorm":
            module.dense.reset_parameters()


def load_checkpoint(path: Path, dtype: torch.dtype, kind: str = "pi0") -> tuple[Any, PromptTokenizer]:
    """A directory written by ``PI0ForConditionalGeneration.save_pretrained`` (``kind`` ``pi0``) or
    ``PI05ForConditionalGeneration``'s (``pi05``), local files only, and the tokenizer saved beside it.
    Whatever does not fit is a ``ConfigError`` naming the file."""
    cls = model_class(kind)
    config_file = path / "config.json"
    if not path.is_dir():
        raise ConfigError(f"policy_path {path} is not a directory")
    if not config_file.is_file():
        raise ConfigError(
            f"{config_file} is missing: policy_path must be a directory written by "
            f"{MODEL_CLASSES[kind]}.save_pretrained"
        )
    raw = _json(config_file)
    found = raw.get("model_type")
    if found != kind:
        hint = f": serve it with --policy {found}" if found in MODEL_CLASSES else ""
        raise ConfigError(f"{config_file}: model_type is {found!r}, not {kind!r} (--policy {kind}){hint}")
    try:
        model, info = cls.from_pretrained(path, local_files_only=True, dtype=dtype, output_loading_info=True)
    except Exception as e:  # transformers raises OSError, ValueError, RuntimeError... with its own text
        weights = ", ".join(sorted(p.name for p in path.glob("*.safetensors"))) or "no *.safetensors file"
        raise ConfigError(
            f"{path}: cannot load the {LABELS[kind]} weights ({weights}) as {config_file.name} describes them: {e}"
        ) from e
    bad = {k: sorted(info.get(k) or ())[:5] for k in ("missing_keys", "mismatched_keys") if info.get(k)}
    if bad:
        raise ConfigError(f"{path}: the weights do not match {config_file.name}: {bad}")
    return model, _tokenizer(path, config_file, model.config.vlm_config.text_config.vocab_size)


def _tokenizer(path: Path, config_file: Path, vocab: int) -> PromptTokenizer:
    files = [path / f for f in TOKENIZER_FILES if (path / f).is_file()]
    if not files:
        if vocab == ByteTokenizer.vocab_size:
            # Saved from this gateway's random-init configs, whose vocabulary is the byte-level one.
            return ByteTokenizer(BYTE_TOKENIZER_NAME)
        raise ConfigError(
            f"{path}: no tokenizer ({' or '.join(TOKENIZER_FILES)}): save the checkpoint's PaliGemma tokenizer "
            f"beside the weights (tokenizer.save_pretrained); {config_file.name} has a {vocab}-token vocabulary"
        )
    try:
        tok = HfTokenizer(path, literal=True)
    except Exception as e:
        raise ConfigError(f"{files[0]}: cannot load the tokenizer: {e}") from e
    probe = max([tok.bos_id, *tok.encode("pick up the cup, State: 128;\nAction: ")])
    if tok.base_vocab_size > vocab or probe >= vocab:
        raise ConfigError(
            f"{files[0]} has {tok.base_vocab_size} tokens but {config_file.name} says the text vocabulary "
            f"(vlm_config.text_config.vocab_size) is {vocab}: they are not from the same checkpoint"
        )
    return tok


def _json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return doc


def robot_of(config: GatewayConfig) -> RobotFormat:
    """The ``robot`` preset with its options (delta actions unset: as openpi's checkpoint of the model
    for that robot was trained; ``pi05_libero`` predicts absolute actions)."""
    delta = config.robot_delta_actions
    if delta is None and config.policy == "pi05" and config.robot == "libero":
        delta = False
    try:
        return robot_format(
            config.robot,
            delta_actions=delta,
            adapt_to_pi=config.robot_adapt_to_pi,
            default_prompt=config.robot_default_prompt,
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None


def policy_spec(config: GatewayConfig, **fields: Any) -> PolicySpec:
    """The spec of ``config``'s robot: a preset fixes cameras, state and actions; ``generic`` reads them
    from the ``policy_*`` fields."""
    robot = robot_of(config)
    if config.robot_control_hz is not None and not config.robot_control_hz > 0:
        raise ConfigError(f"robot_control_hz must be a positive rate in Hz, got {config.robot_control_hz}")
    common = {
        "image_history": tuple(config.openpi_image_history),
        "state_history": tuple(config.openpi_state_history),
        "control_hz": config.robot_control_hz,
        **fields,
    }
    if not robot.generic:
        return PolicySpec.for_robot(robot, **common)
    return PolicySpec(
        state_dim=config.policy_state_dim,
        action_dim=config.policy_action_dim,
        camera_keys=tuple(config.policy_cameras),
        optional_cameras=tuple(config.policy_optional_cameras),
        robot=robot,
        **common,
    )


def build_pi0_runner(config: GatewayConfig) -> Pi0Runner:
    if config.policy_fp8 and resolve_impl(config) != "fast":
        raise ConfigError(
            f"policy_fp8 needs the fast sampler, and policy_impl={config.policy_impl!r} on "
            f"{config.policy_device!r} is eager: set policy_impl=fast, or leave policy_fp8 off"
        )
    model, tok, desc, random_init = load_model(config)
    cfg = model.config
    checkpoint = dict(cfg.to_dict()) if config.policy_path else {}
    pi05 = policy_kind(config) == "pi05"
    state_in_prompt = (
        bool(checkpoint.get("discrete_state_input", pi05 and config.robot != "libero"))
        if config.policy_state_in_prompt == "auto"
        else config.policy_state_in_prompt == "on"
    )
    if pi05 and not state_in_prompt:
        # openpi's pi05_libero is trained so; elsewhere it is likely a mistake, but a valid one.
        log.info("policy: π0.5 without the state in its prompt: the model sees no robot state")
    vision = cfg.vlm_config.vision_config
    spec = policy_spec(
        config,
        model=desc,
        action_horizon=cfg.chunk_size,
        random_init=random_init,
        tokenizer=tok.name,
        num_inference_steps=cfg.num_inference_steps,
        sampler=resolve_impl(config),
        image_size=(vision.image_size, vision.image_size),
        state_in_prompt=state_in_prompt,
        max_prompt_tokens=STATE_PROMPT_TOKENS if state_in_prompt or pi05 else PROMPT_TOKENS,
    )
    _check_fits(config, spec, cfg)
    norm = _norm_stats(config, spec, checkpoint, "quantile" if pi05 else "zscore")
    if norm is not None:
        spec = dataclasses.replace(spec, normalization=norm.describe())
    if len(spec.camera_keys) > 3:
        log.warning("PI0 and π0.5 were trained with at most 3 cameras; %d configured", len(spec.camera_keys))
    if resolve_impl(config) == "fast":
        return FastPi0Runner(
            model,
            tok,
            spec,
            config.policy_device,
            norm,
            rtc_beta=config.policy_rtc_beta,
            buckets=tuple(config.policy_graph_buckets),
            compile_graphs=compile_enabled(config),
            compile_budget_s=config.policy_compile_budget_s,
            compile_cache=compile_cache(config, model, spec),
            prefix_fp8=config.policy_fp8,
            fp8_max_error=config.policy_fp8_max_error,
            fused_expert=fused.resolve(config.policy_fused, config.policy_device),
        )
    return Pi0Runner(model, tok, spec, config.policy_device, norm, rtc_beta=config.policy_rtc_beta)


def _check_fits(config: GatewayConfig, spec: PolicySpec, cfg: Any) -> None:
    """The robot's state and actions must fit the model's padded vectors."""
    where = (
        f"{Path(config.policy_path) / 'config.json'}"
        if config.policy_path
        else f"policy_config {config.policy_config!r}"
    )
    robot = (
        f"the {spec.robot.name} robot" if not spec.robot.generic else "policy_state_dim / policy_action_dim"
    )
    state = len(spec.state_history) * spec.state_dim
    max_state = max_state_dim(cfg)
    if state > max_state:
        raise ConfigError(
            f"{where}: max_state_dim is {max_state}, but {robot} needs {state} state dims "
            f"({len(spec.state_history)} frame(s) x {spec.state_dim})"
        )
    if spec.action_dim > cfg.max_action_dim:
        raise ConfigError(
            f"{where}: max_action_dim is {cfg.max_action_dim}, but {robot} needs {spec.action_dim} action dims"
        )


def max_state_dim(cfg: Any) -> int:
    """PI0's state vector size; π0.5 reads the state as text, padded as openpi pads it (to the actions')."""
    return int(getattr(cfg, "max_state_dim", cfg.max_action_dim))


def _norm_stats(
    config: GatewayConfig, spec: PolicySpec, checkpoint: dict[str, Any], default_mode: str
) -> NormStats | None:
    """The statistics file named, or the one inside ``policy_path``; checked against the robot at start-up."""
    try:
        path: Path | None = Path(config.policy_norm_stats) if config.policy_norm_stats else None
        if path is None and config.policy_path:
            path = find_norm_stats(config.policy_path)
        if path is None:
            return None
        if not path.is_file():
            raise ValueError(f"policy_norm_stats {path} does not exist")
        mode = config.policy_norm_mode
        if mode == "auto":
            mode = mode_hint(checkpoint) or default_mode
        return load_norm_stats(path, spec.state_dim, spec.action_dim, mode)
    except ValueError as e:
        robot = "" if spec.robot.generic else f" (robot {spec.robot.name})"
        raise ConfigError(f"{e}{robot}") from None


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


def compile_cache(config: GatewayConfig, model: Any, spec: PolicySpec) -> CompileCache | None:
    """The on-disk compile cache ``policy_compile_cache`` names, keyed for this model, shapes and device;
    None where nothing is compiled or the cache is off."""
    if not compile_enabled(config) or config.policy_compile_cache == "off":
        return None
    directory = (
        default_cache_dir() if config.policy_compile_cache == "auto" else Path(config.policy_compile_cache)
    )
    shapes = {
        "buckets": sorted(set(config.policy_graph_buckets)),
        "image_slots": spec.image_slots,
        "image_size": list(spec.image_size),
        "prompt_tokens": spec.max_prompt_tokens,
        "prefix_fp8": config.policy_fp8,  # the FP8 prefix compiles to other graphs
    }
    device = torch.device(config.policy_device)
    dtype = next(model.parameters()).dtype
    return CompileCache(directory, cache_key(model.config.to_dict(), dtype, device, shapes))


def worker_max_wait_ms(config: GatewayConfig) -> float:
    """The policy worker's batching window: none when chunks advance in phases (the next worker step is
    one denoising step away, and robots share it whenever they arrive)."""
    phased = (
        config.policy in MODEL_CLASSES and resolve_impl(config) == "fast" and config.policy_phase_steps > 0
    )
    return 0.0 if phased else config.policy_max_wait_ms


def build_policy_backend(config: GatewayConfig) -> PolicyBackend:
    """The backend ``policy`` names: ``pi0`` / ``pi05`` (tiny/full/local weights) or ``noop`` (zeros, no
    model)."""
    if config.policy == "noop":
        return noop_backend(config)
    if config.policy not in MODEL_CLASSES:
        raise ValueError(f"no policy backend for policy={config.policy!r}")
    return pi0_backend(config)


def _slots(config: GatewayConfig) -> int:
    return max(1, config.openpi_max_sessions * 2)


def noop_backend(config: GatewayConfig) -> PolicyBackend:
    spec = policy_spec(
        config, model="noop (zeros)", action_horizon=TINY_CHUNK, tokenizer="none", sampler="none"
    )
    return PolicyBackend(NoopRunner(spec), slots=_slots(config))


def pi0_backend(config: GatewayConfig) -> PolicyBackend:
    return PolicyBackend(
        build_pi0_runner(config), slots=_slots(config), phase_steps=config.policy_phase_steps
    )


def policy_plan(backend: PolicyBackend, config: GatewayConfig) -> StagePlan:
    """How a policy worker serves ``backend``: up to ``policy_max_batch`` robots per step, two requests in
    flight per robot session."""
    return StagePlan(
        backend=backend,
        device=config.policy_device,
        max_batch=config.policy_max_batch,
        max_wait_ms=worker_max_wait_ms(config),
        max_active=config.openpi_max_sessions * 2,
    )


def pi0_from_config(config: GatewayConfig) -> StagePlan:
    return policy_plan(pi0_backend(config), config)


def pi05_from_config(config: GatewayConfig) -> StagePlan:
    """π0.5: the same runners as PI0 (``pi0_backend`` reads which model from ``policy``)."""
    return policy_plan(pi0_backend(config), config)


def noop_from_config(config: GatewayConfig) -> StagePlan:
    return policy_plan(noop_backend(config), config)
