"""PI0's inference maths over a loaded ``PI0ForConditionalGeneration`` (or π0.5's, ``PI05ForConditionalGeneration``:
its action expert is the one difference, ``expert.py``): the same function as transformers'
``sample_actions``, restructured for serving, plus real-time chunking's guided denoising.

- The vision-language prefix runs once per observation into a **static KV cache** (one buffer per layer,
  ``[prefix | state + action tokens | pad]``); the last VLM layer stops after its K/V (its output is never
  read). The action expert writes its 1 + H tokens into the tail of the same buffers at every step, so
  no cache is grown, cropped or copied.
- The flow-matching loop has no host syncs (times are Python constants), so the prefix and the whole
  loop can be captured as CUDA graphs (``pi0_fast``).
- At batch 1 the expert's ten steps are hundreds of tiny kernels, so their count is what costs (H200
  numbers in docs/benchmarks.md): QKV and gate|up run as one GEMM each, residual adds ride in the GEMM,
  rotary is roll + addcmul over q and k together, the expert attends by two GEMMs (a fused attention
  kernel gets only a few thread blocks for 51 tokens over the long cache). Images travel as uint8 and
  are scaled on the device. The shared pieces are ``realtime_gw.models.kernels``.
- Real-time chunking (``policy_rtc``): guided denoising with pseudo-inverse guidance (a vector-Jacobian
  product through the action expert at every step) toward the previous chunk, plus hard inpainting of
  the frozen steps.

Norms, MLP activations, rotary tables, embeddings and projections come from the model's own modules
and weights; only attention, fusion and cache handling are written here, which keeps the numerics those
of the installed transformers (checked against ``sample_actions`` in ``tests/models/policy/test_pi0_fast.py``,
and on the GPU with transformers 5.17 by ``loadtest/bench/policy_gpu.py``). The sub-module names used are
the same in transformers 5.17 and 5.24.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from realtime_gw.models.fp8 import linear
from realtime_gw.models.kernels import additive_mask, apply_rope, attend, linear_add, qkv_heads, signed_rope
from realtime_gw.models.policy.expert import Block, expert_of, normalize, residual
from realtime_gw.models.policy.preprocess import scale_pixels
from realtime_gw.models.policy.rtc import DEFAULT_BETA, RtcArrays, guidance_scale

Velocity = Callable[..., torch.Tensor]
"""``Pi0Functional.velocity``'s signature: (cache, x, time, state) -> velocity."""
PrefixFill = Callable[["Cache", "Batch"], None]
"""``Pi0Functional.fill_prefix``'s signature (or its compiled form): (cache rows, batch rows) -> None."""
STEP_PARAMS = 6
"""Rows of a denoising step's per-robot parameters (``step_params``): t, dt, t_next, 1 - t_next, the
guidance scale c(t), active (1/0). Per robot, so robots at different steps (or step counts) share a step."""
UNFUSED_MAX_QUERIES = 128
"""Token counts below this (the expert's 1 + H) attend through GEMMs rather than a fused kernel."""
KV_ALIGN = 16
"""KV buffer length is rounded up to this (masked tail): aligned masks keep SDPA on its fused kernels."""


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


def _rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary module's (B, L, hd) tables -> (B, L, 1, hd) cos and signed sin, for (B, L, heads, hd)."""
    cos, sin = signed_rope(cos, sin)
    return cos[:, :, None], sin[:, :, None]


@dataclass
class Batch:
    """Stacked model inputs on the device (the tensors a graph reads when captured)."""

    pixel_values: torch.Tensor  # (B, slots, 3, H, W) uint8 levels (scaled inside the prefix)
    input_ids: torch.Tensor  # (B, L) int64
    mask: torch.Tensor  # (B, L) bool
    state: torch.Tensor  # (B, max_state_dim) model dtype
    noise: torch.Tensor  # (B, chunk, max_action_dim) model dtype
    target: torch.Tensor | None = None  # (B, chunk, max_action_dim) float32: RTC Y
    weights: torch.Tensor | None = None  # (B, chunk, max_action_dim) float32: RTC W
    frozen: torch.Tensor | None = None  # (B, chunk, 1) bool: steps hard-inpainted to Y

    def rows(self, n: int) -> Batch:
        """The first ``n`` rows (views of the same storage)."""
        return Batch(**{f.name: _head(getattr(self, f.name), n) for f in dataclasses.fields(self)})

    def chunk(self) -> Chunk:
        """What the denoising steps read besides the cache (views)."""
        return Chunk(self.state, self.noise, self.target, self.weights, self.frozen)


@dataclass
class Chunk:
    """Per-robot denoising inputs: the state, the chunk's starting noise and, for RTC, the guide."""

    state: torch.Tensor  # (B, max_state_dim) model dtype
    noise: torch.Tensor  # (B, chunk, max_action_dim) model dtype
    target: torch.Tensor | None = None  # (B, chunk, max_action_dim) float32: RTC Y
    weights: torch.Tensor | None = None  # (B, chunk, max_action_dim) float32: RTC W
    frozen: torch.Tensor | None = None  # (B, chunk, 1) bool: steps hard-inpainted to Y

    def rows(self, n: int) -> Chunk:
        return Chunk(**{f.name: _head(getattr(self, f.name), n) for f in dataclasses.fields(self)})

    def plain(self) -> Chunk:
        """Without the guide: the unguided step."""
        return Chunk(self.state, self.noise)


def _head(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if t is None else t[:n]


def step_params(step: int, num_steps: int, beta: float) -> tuple[float, ...]:
    """One robot's column of ``STEP_PARAMS`` for its denoising step ``step`` of ``num_steps``, in double
    precision on the host (the values transformers' loop computes as Python floats)."""
    dt = -1.0 / num_steps
    t = 1.0 + step * dt
    t_next = max(0.0, 1.0 + (step + 1) * dt) if step + 1 < num_steps else 0.0
    return (t, dt, t_next, 1.0 - t_next, guidance_scale(t, beta), 1.0)


IDLE_PARAMS = (1.0, 0.0, 1.0, 0.0, 0.0, 0.0)
"""The column of a row that does not advance (free slot, or a robot not in this step): x stays as is."""


class Cache:
    """Static per-layer K/V for one batch size, plus the per-batch masks and positions the expert uses."""

    def __init__(self, fn: Pi0Functional, batch: int, prefix_len: int, device: torch.device) -> None:
        self.prefix_len = prefix_len
        self.suffix_len = fn.chunk + fn.expert.state_tokens
        self.total = -(-(prefix_len + self.suffix_len) // KV_ALIGN) * KV_ALIGN
        shape = (batch, fn.kv_heads, self.total, fn.head_dim)
        self.k = [torch.zeros(shape, dtype=fn.dtype, device=device) for _ in range(fn.layers)]
        self.v = [torch.zeros(shape, dtype=fn.dtype, device=device) for _ in range(fn.layers)]
        # Additive (0 / dtype min), rows in ``attend``'s folded order: one mask build per observation.
        self.suffix_mask = torch.zeros(
            (batch, 1, self.suffix_len * fn.groups, self.total), dtype=fn.dtype, device=device
        )
        self.positions = torch.zeros((batch, self.suffix_len), dtype=torch.long, device=device)
        # The expert's rotary tables at those positions, (B, suffix, 1, head_dim): built with the masks.
        rope_shape = (batch, self.suffix_len, 1, fn.head_dim)
        self.rope_cos = torch.zeros(rope_shape, dtype=fn.dtype, device=device)
        self.rope_sin = torch.zeros(rope_shape, dtype=fn.dtype, device=device)

    def buffers(self) -> list[torch.Tensor]:
        """Every per-row buffer (row = robot): what a slot copy moves."""
        return [*self.k, *self.v, self.suffix_mask, self.positions, self.rope_cos, self.rope_sin]

    def rows(self, n: int) -> Cache:
        """The first ``n`` rows (views of the same buffers): the prefix of an exact-size batch."""
        view = copy.copy(self)
        view.k, view.v = [k[:n] for k in self.k], [v[:n] for v in self.v]
        view.suffix_mask, view.positions = self.suffix_mask[:n], self.positions[:n]
        view.rope_cos, view.rope_sin = self.rope_cos[:n], self.rope_sin[:n]
        return view


class Pi0Functional:
    """PI0 inference over a loaded ``PI0ForConditionalGeneration``'s weights (fused copies of the decoder
    layers' projections, see ``expert.Block``; everything else shared with the model). π0.5
    (``PI05ForConditionalGeneration``) runs through the same code: its action expert differs in one
    object (``expert.Pi05Expert``: no state token, time-conditioned adaptive norms, gated residuals)."""

    def __init__(self, model: Any, prefix_fp8: bool = False) -> None:
        cfg = model.config
        self.model = model
        vlm = model.model.vlm
        self.lm = vlm.language_model
        tower = vlm.vision_tower
        self.vision = getattr(tower, "vision_model", tower)
        self.projector = vlm.multi_modal_projector
        self.embed_tokens = vlm.get_input_embeddings()
        self.dit = model.model.dit
        self.chunk = int(cfg.chunk_size)
        self.max_action_dim = int(cfg.max_action_dim)
        self.image_token_id = int(cfg.vlm_config.image_token_id)
        lm_attn, dit_attn = self.lm.layers[0].self_attn, self.dit.layers[0].self_attn
        self.layers = len(self.dit.layers)
        self.head_dim = int(dit_attn.head_dim)
        tc, dc = cfg.vlm_config.text_config, cfg.dit_config
        self.heads, self.kv_heads = int(tc.num_attention_heads), int(tc.num_key_value_heads)
        # The expert attends into the VLM's cache layer by layer: both towers must agree on its shape.
        if (
            len(self.lm.layers),
            int(lm_attn.head_dim),
            int(dc.num_key_value_heads),
            int(dc.num_attention_heads),
        ) != (
            self.layers,
            self.head_dim,
            self.kv_heads,
            self.heads,
        ):
            raise ValueError("PI0's VLM and action expert differ in layers/heads/head_dim; unsupported")
        self.groups = self.heads // self.kv_heads
        self.dtype = next(model.parameters()).dtype
        # Inference only; RTC's vector-Jacobian product then differentiates w.r.t. the actions alone.
        model.requires_grad_(False)
        self.vision_heads = int(cfg.vlm_config.vision_config.num_attention_heads)
        # FP8 only where the GEMMs are large enough to be bound by tensor throughput: the prefix. The
        # expert's steps (51 tokens) are bound by their chain of kernels and stay in the model dtype.
        self.prefix_fp8 = prefix_fp8
        self.vision_blocks = [Block(layer, False, prefix_fp8) for layer in self.vision.encoder.layers]
        self.lm_blocks = [Block(layer, True, prefix_fp8) for layer in self.lm.layers]
        self.expert = expert_of(model)
        self.dit_blocks = self.expert.blocks
        # π0.5 has no state input (its state is in the prompt); the slots still carry PI0's vector.
        self.max_state_dim = int(getattr(cfg, "max_state_dim", cfg.max_action_dim))

    # -- layers -----------------------------------------------------------------------------------------
    def _gemma_layer(
        self,
        blk: Block,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        at: slice,
        keys: slice,
        mask: torch.Tensor | None,
        output: bool = True,
        mod: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One Gemma decoder layer: writes this layer's K/V of ``x`` into ``k_buf/v_buf[:, :, at]`` and
        attends over ``[:, :, keys]`` of them. ``mod``: π0.5's modulations of this step (``expert``)."""
        h, gate = normalize(x, blk.norm1, mod)
        qk, v = qkv_heads(h, blk.qkv, blk.qkv_bias, self.heads, self.kv_heads)
        qk = apply_rope(qk, *rope)  # q and k heads together
        n_q = self.heads
        k_buf[:, :, at] = qk[:, :, n_q:].transpose(1, 2)
        v_buf[:, :, at] = v.transpose(1, 2)
        if not output:  # only the K/V are needed
            return x
        # The expert (few queries, long cache) attends by GEMMs; the long prefix by the fused kernel.
        fused = qk.shape[1] >= UNFUSED_MAX_QUERIES
        o = attend(qk[:, :, :n_q], k_buf[:, :, keys], v_buf[:, :, keys], mask, blk.scale, fused)
        x = residual(x, o, blk.o, blk.o_bias, gate)
        h, gate = normalize(x, blk.norm2, mod)
        gu = linear(h, blk.gate_up, blk.gate_up_bias)
        return residual(
            x, blk.act(gu[..., : blk.inter]) * gu[..., blk.inter :], blk.down, blk.down_bias, gate
        )

    # -- prefix -----------------------------------------------------------------------------------------
    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """SigLIP + projector: (N, 3, H, W) -> (N, tokens, lm hidden)."""
        vt = self.vision
        x = vt.embeddings(pixels)
        nh = self.vision_heads
        for blk in self.vision_blocks:
            qk, v = qkv_heads(blk.ln1(x), blk.qkv, blk.qkv_bias, nh, nh)
            k, v = qk[:, :, nh:].transpose(1, 2), v.transpose(1, 2)
            o = attend(qk[:, :, :nh], k, v, None, blk.scale, fused=True)
            x = linear_add(x, o, blk.o, blk.o_bias)
            x = linear_add(x, blk.act(linear(blk.ln2(x), blk.fc1, blk.fc1_bias)), blk.fc2, blk.fc2_bias)
        return self.projector(vt.post_layernorm(x))

    def embed_prefix(self, pixel_values: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """Our prefix layout puts every image token first: [slot 0 tokens][slot 1 tokens]...[text]."""
        b, slots = pixel_values.shape[:2]
        pixels = scale_pixels(pixel_values.flatten(0, 1)).to(self.dtype)
        feats = self.image_features(pixels)
        n_img = slots * feats.shape[1]
        text = self.embed_tokens(input_ids[:, n_img:])
        return torch.cat([feats.reshape(b, n_img, -1).to(text.dtype), text], dim=1)

    def fill_prefix(self, cache: Cache, batch: Batch) -> None:
        """Run the VLM over the prefix, writing each layer's K/V into the cache; set the expert's masks."""
        mask = batch.mask
        x = self.embed_prefix(batch.pixel_values, batch.input_ids)
        p = x.shape[1]
        # Bidirectional over the prefix with padding masked (token_type_ids all 0 in sample_actions).
        positions = mask.long().cumsum(-1) - 1
        rope = _rope_tables(*self.lm.rotary_emb(x, positions))
        key_mask = mask[:, None, None, :]
        last = len(self.lm_blocks) - 1
        prefix = slice(0, p)
        for i, blk in enumerate(self.lm_blocks):
            # Nothing reads the last layer's output, only its K/V.
            x = self._gemma_layer(
                blk, x, rope, cache.k[i], cache.v[i], prefix, prefix, key_mask, output=i < last
            )
        # Expert masks: PI0's state token sees the valid prefix and itself; action tokens see the valid
        # prefix, the state and every action (transformers' block mask in PI0Model.forward, PI05Model's). Additive,
        # built once per observation, rows in the folded query order of ``attend``.
        n = cache.suffix_len
        rows = torch.zeros(mask.shape[0], n, cache.total, dtype=torch.bool, device=mask.device)
        rows[:, :, :p] = mask[:, None, :]
        s = self.expert.state_tokens  # PI0's state token sees itself, not the actions; π0.5 has none
        rows[:, :s, p : p + s] = True
        rows[:, s:, p : p + n] = True
        cache.suffix_mask.copy_(additive_mask(rows, 1, self.groups, self.dtype))
        # Positions continue after the valid prefix tokens (cumsum over [mask, ones] - 1).
        valid = mask.long().sum(-1, keepdim=True)
        cache.positions.copy_(valid + torch.arange(n, device=mask.device))
        cos, sin = _rope_tables(*self.dit.rotary_emb(x.new_zeros(1, dtype=self.dtype), cache.positions))
        cache.rope_cos.copy_(cos)
        cache.rope_sin.copy_(sin)

    # -- action expert ----------------------------------------------------------------------------------
    def velocity(
        self,
        cache: Cache,
        x: torch.Tensor,
        time: torch.Tensor,
        state: torch.Tensor,
    ) -> torch.Tensor:
        """The expert's velocity at ``time`` ((B,) float32): a tensor, so a compiled version of this
        method sees one graph for every step."""
        rope = (cache.rope_cos, cache.rope_sin)
        h, mod = self.expert.embed(x, time, state)
        at = slice(cache.prefix_len, cache.prefix_len + cache.suffix_len)
        keys = slice(0, cache.total)
        for i, blk in enumerate(self.dit_blocks):
            # detach(): an alias of the static buffer with no autograd history, so RTC's backward of
            # this step never reaches an earlier step's graph through the shared storage.
            h = self._gemma_layer(
                blk, h, rope, cache.k[i].detach(), cache.v[i].detach(), at, keys, cache.suffix_mask, mod=mod
            )
        h, _ = normalize(h, self.expert.final_norm, mod)
        return self.model.action_out_proj(h[:, -self.chunk :])

    def denoise_step(
        self,
        cache: Cache,
        chunk: Chunk,
        x: torch.Tensor,
        params: torch.Tensor,
        velocity: Velocity | None = None,
    ) -> torch.Tensor:
        """One Euler step of every row from its own time (``params``: (``STEP_PARAMS``, B) float32, see
        ``step_params``), RTC-guided when ``chunk`` carries a guide; rows marked inactive keep ``x``.
        Returns the new x (B, chunk, max_action_dim) in the model dtype. ``velocity``: ``self.velocity``
        or a compiled version of it.

        Scalars multiply in float32 and round once to the model dtype, as a Python float does in
        transformers' loop; rows never mix, so a row's result does not depend on the others'."""
        velocity = velocity or self.velocity
        t = params[0]
        dt, t_next, keep, scale, active = (params[i][:, None, None] for i in range(1, STEP_PARAMS))
        if chunk.target is None:
            v = velocity(cache, x, t, chunk.state)
        else:
            v = self._guided_velocity(velocity, cache, chunk, x, t, scale)
        new = x + (dt * v.float()).to(x.dtype)
        if chunk.target is not None:
            # Hard inpainting: frozen steps stay on the straight noise->target path (exact at t = 0).
            assert chunk.frozen is not None
            on_path = t_next * chunk.noise.float() + keep * chunk.target
            new = torch.where(chunk.frozen, on_path.to(x.dtype), new)
        return torch.where(active > 0, new, x)

    def denoise(
        self,
        cache: Cache,
        batch: Batch,
        num_steps: int,
        beta: float = DEFAULT_BETA,
        velocity: Velocity | None = None,
    ) -> torch.Tensor:
        """Euler flow matching from ``batch.noise`` (t = 1) to actions (t = 0), every row in step: the
        steps of ``denoise_step``. Returns (B, chunk, max_action_dim) in the model dtype."""
        chunk = batch.chunk()
        x = chunk.noise
        for step in range(num_steps):
            column = torch.tensor(step_params(step, num_steps, beta), dtype=torch.float32)
            params = column[:, None].expand(STEP_PARAMS, x.shape[0]).to(x.device)
            x = self.denoise_step(cache, chunk, x, params, velocity)
        return x

    def _guided_velocity(
        self,
        velocity: Velocity,
        cache: Cache,
        chunk: Chunk,
        x: torch.Tensor,
        t: torch.Tensor,
        scale: torch.Tensor,
    ) -> torch.Tensor:
        """v - c(t) * J^T (W * (Y - A_hat)), A_hat = x - t v(x): PiGDM with the Jacobian of the
        one-step action estimate (a vector-Jacobian product through the expert; a compiled ``velocity``
        brings its compiled backward). ``t`` (B,), ``scale`` c(t) (B, 1, 1), both float32."""
        assert chunk.target is not None and chunk.weights is not None
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            v = velocity(cache, xg, t, chunk.state)
            a_hat = xg - (t[:, None, None] * v.float()).to(v.dtype)
            err = (chunk.weights * (chunk.target - a_hat.float())).to(a_hat.dtype)
            (g,) = torch.autograd.grad(a_hat, xg, grad_outputs=err)
        return v.detach() - (scale * g.float()).to(g.dtype)

    # -- one-call convenience (no graphs) -----------------------------------------------------------------
    def stack(self, prepared: list[Prepared], device: torch.device, rtc: bool) -> Batch:
        dt = self.dtype
        batch = Batch(
            pixel_values=torch.stack([p.pixel_values for p in prepared]).to(device),
            input_ids=torch.stack([p.input_ids for p in prepared]).to(device),
            mask=torch.stack([p.attention_mask for p in prepared]).to(device),
            state=torch.stack([p.state for p in prepared]).to(device, dt),
            noise=torch.stack([p.noise for p in prepared]).to(device, dt),
        )
        if rtc:
            target, weights, frozen = rtc_stack(prepared, self.chunk, self.max_action_dim)
            batch.target, batch.weights, batch.frozen = (
                target.to(device),
                weights.to(device),
                frozen.to(device),
            )
        return batch

    @torch.no_grad()
    def sample(
        self, prepared: list[Prepared], num_steps: int, device: torch.device, beta: float = DEFAULT_BETA
    ) -> torch.Tensor:
        batch = self.stack(prepared, device, rtc=any(p.rtc is not None for p in prepared))
        cache = Cache(self, len(prepared), batch.input_ids.shape[1], device)
        self.fill_prefix(cache, batch)
        return self.denoise(cache, batch, num_steps, beta)


def rtc_stack(prepared: list[Prepared], chunk: int, max_action_dim: int) -> tuple[torch.Tensor, ...]:
    """(target, weights, frozen) CPU tensors; requests without RTC get zero weights (unguided rows)."""
    b = len(prepared)
    target = np.zeros((b, chunk, max_action_dim), np.float32)
    weights = np.zeros((b, chunk, max_action_dim), np.float32)
    frozen = np.zeros((b, chunk, 1), bool)
    for i, p in enumerate(prepared):
        if p.rtc is not None:
            target[i], weights[i] = p.rtc.target, p.rtc.weights
            frozen[i, : p.rtc.delay] = True
    return torch.from_numpy(target), torch.from_numpy(weights), torch.from_numpy(frozen)
