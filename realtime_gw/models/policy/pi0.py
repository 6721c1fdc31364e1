"""PI0 (transformers ``PI0ForConditionalGeneration``) as a batched policy backend.

Weights come from a local directory (``policy_path``) or are random-initialised from a named config:
``tiny`` (a few narrow layers, the embedded CPU default) or ``pi0`` (full size: PaliGemma 2B + 300M
action expert, for a GPU). Random-init weights give real compute and real shapes but meaningless actions.

Prefix layout per robot, fixed so batching never changes the sequence a robot sees (openpi's layout):
``[camera slot 0 tokens][camera slot 1 tokens]...[BOS prompt "\\n" pad...]``; a missing camera keeps its
slot (black image) with its tokens masked out of attention.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from realtime_gw.config import GatewayConfig
from realtime_gw.models.policy.backend import PolicyBackend
from realtime_gw.models.policy.noop import NoopRunner
from realtime_gw.models.policy.preprocess import (
    ByteTokenizer,
    HfTokenizer,
    NormStats,
    PromptTokenizer,
    image_to_uint8,
    load_norm_stats,
    scale_pixels,
    tokenize_prompt,
)
from realtime_gw.models.policy.rtc import DEFAULT_BETA, RtcArrays, rtc_arrays
from realtime_gw.records.policy import PolicyRequest, PolicySpec

log = logging.getLogger(__name__)

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
        has_tokenizer = any(
            (path / f).exists() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
        )
        tok: PromptTokenizer = HfTokenizer(str(path)) if has_tokenizer else ByteTokenizer()
        desc, random_init = f"pi0 from {path}", False
    else:
        cfg = pi0_config(config.policy_config)
        # Build straight on the device (a full PI0 is ~3.5B parameters) with seeded, reproducible weights.
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(INIT_SEED)
            model = PI0ForConditionalGeneration(cfg)
        tok, desc, random_init = ByteTokenizer(), f"pi0-{config.policy_config} (random init)", True
    if isinstance(tok, ByteTokenizer) and model.config.vlm_config.text_config.vocab_size < tok.vocab_size:
        raise ValueError(
            f"{desc}: vocabulary too small for the byte-level tokenizer and no tokenizer files found"
        )
    return model.to(device=device, dtype=dtype).eval(), tok, desc, random_init


@dataclass(slots=True)
class Prepared:
    """One robot's model inputs, on the CPU; stacked with others in ``Pi0Runner.run``."""

    pixel_values: torch.Tensor  # (slots, 3, H, W) uint8; scaled to [-1, 1] on the device
    input_ids: torch.Tensor  # (L,)
    attention_mask: torch.Tensor  # (L,) bool
    state: torch.Tensor  # (max_state_dim,)
    noise: torch.Tensor  # (chunk_size, max_action_dim), from the request's seed
    rtc: RtcArrays | None = None  # real-time chunking guidance, model space
    frozen: np.ndarray | None = None  # (d, action_dim): the previous chunk's frozen actions, exact


class Pi0Runner:
    def __init__(
        self,
        model: Any,
        tokenizer: PromptTokenizer,
        spec: PolicySpec,
        device: str = "cpu",
        norm: NormStats | None = None,
        rtc_beta: float = DEFAULT_BETA,
    ) -> None:
        cfg = model.config
        vision = cfg.vlm_config.vision_config
        if spec.image_size != (vision.image_size, vision.image_size):
            raise ValueError(f"spec image_size {spec.image_size} != model's {vision.image_size}")
        if len(spec.state_history) * spec.state_dim > cfg.max_state_dim:
            raise ValueError(
                f"{len(spec.state_history)} state frames x {spec.state_dim} dims exceed max_state_dim {cfg.max_state_dim}"
            )
        if spec.action_dim > cfg.max_action_dim or spec.action_horizon != cfg.chunk_size:
            raise ValueError(f"spec actions ({spec.action_horizon}, {spec.action_dim}) do not fit the model")
        self.model = model
        self.tokenizer = tokenizer
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = next(model.parameters()).dtype
        self.norm = norm
        self.image_token_id = cfg.vlm_config.image_token_id
        self.tokens_per_image = (vision.image_size // vision.patch_size) ** 2
        self.max_state_dim = cfg.max_state_dim
        self.noise_shape = (cfg.chunk_size, cfg.max_action_dim)
        self.rtc_beta = rtc_beta
        self._functional: Any = None  # the guided sampler for RTC requests, built on first use

    def prepare(self, request: PolicyRequest) -> Prepared:
        spec = self.spec
        pixels, present = zip(*(image_to_uint8(img, spec.image_size) for img in request.images), strict=True)
        tokens, text_mask = tokenize_prompt(self.tokenizer, request.prompt, spec.max_prompt_tokens)
        image_mask = np.repeat(np.asarray(present, dtype=bool), self.tokens_per_image)
        n_image = image_mask.shape[0]
        input_ids = np.concatenate([np.full(n_image, self.image_token_id, np.int64), tokens])
        states = request.state if self.norm is None else self.norm.state(request.state)
        state = np.zeros(self.max_state_dim, np.float32)
        flat = np.asarray(states, np.float32).reshape(-1)
        state[: flat.shape[0]] = flat
        seed = request.seed if request.seed is not None else secrets.randbits(63)
        # Noise from the request's own generator (on the CPU): the same seed gives the same chunk
        # whatever else shares the batch, and whatever the device.
        noise = torch.randn(self.noise_shape, generator=torch.Generator().manual_seed(seed))
        rtc, frozen = None, None
        if request.rtc is not None:
            cfg = self.model.config
            rtc = rtc_arrays(request.rtc, cfg.chunk_size, cfg.max_action_dim, spec.action_dim, self.norm)
            frozen = np.asarray(request.rtc.prev_actions[: rtc.delay], np.float32).copy()
        return Prepared(
            pixel_values=torch.stack(pixels),
            input_ids=torch.from_numpy(input_ids),
            attention_mask=torch.from_numpy(np.concatenate([image_mask, text_mask])),
            state=torch.from_numpy(state),
            noise=noise,
            rtc=rtc,
            frozen=frozen,
        )

    def run(self, prepared: list[Prepared], num_steps: int | None) -> list[np.ndarray]:
        if any(p.rtc is not None for p in prepared):
            # transformers' sample_actions has no guidance hook: RTC batches take the guided sampler.
            from realtime_gw.models.policy.pi0_fast import Pi0Functional

            if self._functional is None:
                self._functional = Pi0Functional(self.model)
            actions = self._functional.sample(
                prepared, num_steps or self.spec.num_inference_steps, self.device, self.rtc_beta
            )
            return self.finish(prepared, actions)
        return self.finish(prepared, self._sample(prepared, num_steps))

    def finish(self, prepared: list[Prepared], actions: torch.Tensor) -> list[np.ndarray]:
        """(B, chunk, max_action_dim) model-space actions -> per-request float32 robot actions."""
        out = actions[:, :, : self.spec.action_dim].float().cpu().numpy()
        if self.norm is not None:
            out = self.norm.actions(out)
        results = []
        for p, a in zip(prepared, out, strict=True):
            a = np.ascontiguousarray(a, dtype=np.float32)
            if p.frozen is not None and len(p.frozen):
                # The denoiser already lands there (to rounding: bf16 on a GPU); the executed prefix must
                # be bit-identical to what the robot is executing, so write it exactly.
                a[: len(p.frozen)] = p.frozen
            results.append(a)
        return results

    @torch.inference_mode()
    def _sample(self, prepared: list[Prepared], num_steps: int | None) -> torch.Tensor:
        dev, dt = self.device, self.dtype
        batch = len(prepared)
        pixel_values = scale_pixels(torch.stack([p.pixel_values for p in prepared]).to(dev)).to(dt)
        actions = self.model.sample_actions(
            state=torch.stack([p.state for p in prepared]).to(dev, dt),
            input_ids=torch.stack([p.input_ids for p in prepared]).to(dev),
            pixel_values=pixel_values,
            noise=torch.stack([p.noise for p in prepared]).to(dev, dt),
            attention_mask=torch.stack([p.attention_mask for p in prepared]).to(dev, torch.long),
            # Every slot carries an image (black when absent); absent ones are masked via attention_mask.
            pixel_attention_mask=torch.ones(batch, pixel_values.shape[1], dtype=torch.bool, device=dev),
            num_steps=num_steps or self.spec.num_inference_steps,
        )
        return actions


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
        from realtime_gw.models.policy.pi0_fast import FastPi0Runner

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
