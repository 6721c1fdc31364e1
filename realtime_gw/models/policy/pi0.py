"""PI0 (transformers ``PI0ForConditionalGeneration``) and π0.5 (``PI05ForConditionalGeneration``) as a
batched policy runner: the eager sampler.

Plain requests go through transformers' own ``sample_actions`` (π0.5's takes no state: the state is in
its prompt, ``preprocess.tokenize_prompt``); RTC requests (which need a guidance
hook it lacks) through ``pi0_functional``'s guided sampler. ``pi0_fast`` is the serving runner built on
this one; ``factory`` builds either from the gateway's config.

Prefix layout per robot, fixed so batching never changes the sequence a robot sees (openpi's layout):
``[camera slot 0 tokens][camera slot 1 tokens]...[BOS prompt "\\n" pad...]``; a missing camera keeps its
slot (black image) with its tokens masked out of attention.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
import torch

from realtime_gw.models.policy.pi0_functional import Pi0Functional, Prepared
from realtime_gw.models.policy.preprocess import (
    NormStats,
    PromptTokenizer,
    image_to_uint8,
    scale_pixels,
    tokenize_prompt,
)
from realtime_gw.models.policy.rtc import DEFAULT_BETA, rtc_arrays
from realtime_gw.records.policy import PolicyRequest, PolicySpec

PROBE_PROMPT = "pick up the red block and put it in the bowl"


def probe_requests(spec: PolicySpec, n: int, seed: int = 0) -> list[PolicyRequest]:
    """``n`` seeded observations of ``spec``'s shape (noise images, normal state) for start-up checks of
    a sampler's numerics: the same on every run."""
    rng = np.random.default_rng(seed)
    h, w = spec.image_size
    return [
        PolicyRequest(
            images=[rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(spec.image_slots)],
            state=rng.standard_normal((len(spec.state_history), spec.state_dim)).astype(np.float32),
            prompt=PROBE_PROMPT,
            seed=seed + i,
        )
        for i in range(n)
    ]


def action_error(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(relative L2, max |diff|) of actions ``got`` against ``ref``."""
    got, ref = got.float(), ref.float()
    return float((got - ref).norm() / ref.norm().clamp(min=1e-12)), float((got - ref).abs().max())


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
        self.max_state_dim = int(getattr(cfg, "max_state_dim", cfg.max_action_dim))  # π0.5: no state input
        if len(spec.state_history) * spec.state_dim > self.max_state_dim:
            raise ValueError(
                f"{len(spec.state_history)} state frames x {spec.state_dim} dims exceed max_state_dim {self.max_state_dim}"
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
        self.state_input = getattr(cfg, "model_type", "pi0") == "pi0"
        """PI0's ``sample_actions`` takes the state vector; π0.5's reads it from the prompt only."""
        self.noise_shape = (cfg.chunk_size, cfg.max_action_dim)
        self.rtc_beta = rtc_beta
        self._functional: Pi0Functional | None = None
        """The guided sampler for RTC requests, built on first use."""

    def prepare(self, request: PolicyRequest) -> Prepared:
        spec = self.spec
        pixels, present = zip(*(image_to_uint8(img, spec.image_size) for img in request.images), strict=True)
        states = np.asarray(
            request.state if self.norm is None else self.norm.state(request.state), np.float32
        )
        # Checkpoints that read the state as text get the current frame's, normalized (openpi's order).
        in_prompt = states[-1] if spec.state_in_prompt else None
        tokens, text_mask = tokenize_prompt(self.tokenizer, request.prompt, spec.max_prompt_tokens, in_prompt)
        image_mask = np.repeat(np.asarray(present, dtype=bool), self.tokens_per_image)
        n_image = image_mask.shape[0]
        input_ids = np.concatenate([np.full(n_image, self.image_token_id, np.int64), tokens])
        state = np.zeros(self.max_state_dim, np.float32)
        flat = states.reshape(-1)
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

    def reference_actions(self, prepared: list[Prepared]) -> torch.Tensor:
        """transformers' ``sample_actions`` in the model dtype, model space, the robot's action dims: what
        start-up checks of a faster sampler's numerics compare against."""
        return self._sample(prepared, self.spec.num_inference_steps)[..., : self.spec.action_dim]

    @torch.inference_mode()
    def _sample(self, prepared: list[Prepared], num_steps: int | None) -> torch.Tensor:
        dev, dt = self.device, self.dtype
        batch = len(prepared)
        pixel_values = scale_pixels(torch.stack([p.pixel_values for p in prepared]).to(dev)).to(dt)
        state = {"state": torch.stack([p.state for p in prepared]).to(dev, dt)} if self.state_input else {}
        actions = self.model.sample_actions(
            **state,
            input_ids=torch.stack([p.input_ids for p in prepared]).to(dev),
            pixel_values=pixel_values,
            noise=torch.stack([p.noise for p in prepared]).to(dev, dt),
            attention_mask=torch.stack([p.attention_mask for p in prepared]).to(dev, torch.long),
            # Every slot carries an image (black when absent); absent ones are masked via attention_mask.
            pixel_attention_mask=torch.ones(batch, pixel_values.shape[1], dtype=torch.bool, device=dev),
            num_steps=num_steps or self.spec.num_inference_steps,
        )
        return actions
