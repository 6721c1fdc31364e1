"""Fast PI0 sampling: the same function as transformers' ``PI0ForConditionalGeneration.sample_actions``,
restructured for serving.

- The vision-language prefix runs once per observation into a **static KV cache** (one buffer per layer,
  ``[prefix | state + action tokens | pad]``); the last VLM layer stops after its K/V (its output is never
  read). The action expert writes its 1 + H tokens into the tail of the same buffers at every step, so
  no cache is grown, cropped or copied.
- The flow-matching loop has no host syncs (times are Python constants), so on CUDA the prefix and the
  whole loop are captured as **CUDA graphs** and replayed, over static buffers per batch bucket (1, 2, 4,
  8, 16 by default). The loop runs padded up to its bucket (it is latency-bound: padding rows cost little), the
  compute-bound prefix has a graph per exact batch size (padding rows would cost a full robot each).
  All graphs share one memory pool. Inputs go up through pinned staging buffers; the only sync is the
  final copy of the actions.
- At batch 1 the expert's ten steps are hundreds of tiny kernels, so their count is what costs (H200
  numbers in docs/benchmarks.md): QKV and gate|up run as one GEMM each, residual adds ride in the GEMM,
  rotary is roll + addcmul over q and k together, the expert attends by two GEMMs (a fused attention
  kernel gets only a few thread blocks for 51 tokens over the long cache) and, by default on CUDA, the
  step is ``torch.compile``-d (plain and guided loops; the guided one's backward too), bucket by bucket
  within a start-up budget. Images travel as uint8 and are scaled on the device.
- Real-time chunking (``policy_rtc``): guided denoising with pseudo-inverse guidance (a vector-Jacobian
  product through the action expert at every step) toward the previous chunk, plus hard inpainting of
  the frozen steps; captured in its own graph per bucket.

Norms, MLP activations, rotary tables, embeddings and projections come from the model's own modules
and weights; only attention, fusion and cache handling are written here, which keeps the numerics those
of the installed transformers (checked against ``sample_actions`` in ``tests/models/test_policy_fast.py``,
and on the GPU with transformers 5.17 by ``loadtest/bench_policy_gpu.py``). The sub-module names used are
the same in transformers 5.17 and 5.24.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from realtime_gw.models.policy.pi0 import Pi0Runner, Prepared
from realtime_gw.models.policy.preprocess import scale_pixels
from realtime_gw.models.policy.rtc import DEFAULT_BETA, guidance_scale

log = logging.getLogger(__name__)

DEFAULT_BUCKETS = (1, 2, 4, 8, 16)
DEFAULT_COMPILE_BUDGET_S = 300.0
Velocity = Callable[..., torch.Tensor]
"""``Pi0Functional.velocity``'s signature: (cache, x, time, state, rope) -> velocity."""
UNFUSED_MAX_QUERIES = 128
"""Token counts below this (the expert's 1 + H) attend through GEMMs rather than a fused kernel."""
KV_ALIGN = 16
"""KV buffer length is rounded up to this (masked tail): aligned masks keep SDPA on its fused kernels."""


def _rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L, hd) tables -> (B, L, 1, hd) cos and sign-folded sin, for tensors laid out (B, L, heads, hd).

    transformers rotates with cat(-x2, x1) = roll(x, hd/2) * [-1..., +1...]; folding the sign into sin
    makes the rotation roll + multiply + add (three kernels for q and k together)."""
    half = sin.shape[-1] // 2
    signed = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
    return cos[:, :, None], signed[:, :, None]


def _rope(x: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    cos, sin = table
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin)


class _Block:
    """One decoder layer's weights, fused for few kernels: QKV in one matrix, gate|up in one matrix,
    Gemma's RMSNorm weight as (1 + w) in float32. Copies of the layer's weights (about 2.8 GB extra at
    the full PI0 size), made once; the model's own modules stay as they are."""

    def __init__(self, layer: Any, gemma: bool) -> None:
        attn = layer.self_attn
        projs = (attn.q_proj, attn.k_proj, attn.v_proj)
        self.qkv = torch.cat([p.weight for p in projs]).contiguous()
        biases = [p.bias for p in projs]
        self.qkv_bias = None if any(b is None for b in biases) else torch.cat(biases)
        out = attn.o_proj if gemma else attn.out_proj
        self.o, self.o_bias = out.weight, out.bias
        self.scale = float(attn.scaling if gemma else attn.scale)
        if gemma:
            n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
            self.norm1 = (1.0 + n1.weight.float(), float(n1.eps))
            self.norm2 = (1.0 + n2.weight.float(), float(n2.eps))
            mlp = layer.mlp
            self.gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).contiguous()
            self.inter = mlp.gate_proj.weight.shape[0]
            self.down = mlp.down_proj.weight
            self.act = mlp.act_fn
        else:
            self.ln1, self.ln2, self.mlp = layer.layer_norm1, layer.layer_norm2, layer.mlp


def _rms(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
    """GemmaRMSNorm: float32 x * rsqrt(mean(x^2) + eps) * (1 + w), cast back."""
    w, eps = norm
    return F.rms_norm(x.float(), (x.shape[-1],), w, eps).to(x.dtype)


def _linear_add(
    residual: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
) -> torch.Tensor:
    """residual + x @ w.T (+ b): one GEMM with the residual as its C operand when there is no bias."""
    if b is not None:
        return residual + F.linear(x, w, b)
    d = residual.shape[-1]
    return torch.addmm(residual.reshape(-1, d), x.reshape(-1, x.shape[-1]), w.t()).view(residual.shape)


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


def _head(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if t is None else t[:n]


class Cache:
    """Static per-layer K/V for one batch size, plus the per-batch masks and positions the expert uses."""

    def __init__(self, fn: Pi0Functional, batch: int, prefix_len: int, device: torch.device) -> None:
        self.prefix_len = prefix_len
        self.suffix_len = fn.chunk + 1
        self.total = -(-(prefix_len + self.suffix_len) // KV_ALIGN) * KV_ALIGN
        shape = (batch, fn.kv_heads, self.total, fn.head_dim)
        self.k = [torch.zeros(shape, dtype=fn.dtype, device=device) for _ in range(fn.layers)]
        self.v = [torch.zeros(shape, dtype=fn.dtype, device=device) for _ in range(fn.layers)]
        # Additive (0 / dtype min), rows in ``_attend``'s folded order: one mask build per observation.
        self.suffix_mask = torch.zeros(
            (batch, 1, self.suffix_len * fn.groups, self.total), dtype=fn.dtype, device=device
        )
        self.positions = torch.zeros((batch, self.suffix_len), dtype=torch.long, device=device)

    def rows(self, n: int) -> Cache:
        """The first ``n`` rows (views of the same buffers): the prefix of an exact-size batch."""
        view = copy.copy(self)
        view.k, view.v = [k[:n] for k in self.k], [v[:n] for v in self.v]
        view.suffix_mask, view.positions = self.suffix_mask[:n], self.positions[:n]
        return view


class Pi0Functional:
    """PI0 inference over a loaded ``PI0ForConditionalGeneration``'s weights (fused copies of the decoder
    layers' projections, see ``_Block``; everything else shared with the model)."""

    def __init__(self, model: Any) -> None:
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
        self.vision_blocks = [_Block(layer, gemma=False) for layer in self.vision.encoder.layers]
        self.lm_blocks = [_Block(layer, gemma=True) for layer in self.lm.layers]
        self.dit_blocks = [_Block(layer, gemma=True) for layer in self.dit.layers]
        self.dit_final_norm = (1.0 + self.dit.norm.weight.float(), float(self.dit.norm.eps))

    # -- attention ------------------------------------------------------------------------------------
    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        scale: float,
        unfused: bool = False,
    ) -> torch.Tensor:
        """q (B, Q, heads, hd) over k/v (B, kv_heads, K, hd) -> (B, Q, heads * hd).

        Query heads sharing a KV head are folded into the query axis, query-major (row j * groups + g),
        so with one KV head the fold is a view: one plain attention per KV head, no repeated K/V.
        ``mask`` rows follow that order (see ``fill_prefix``) or broadcast over queries."""
        b, n, h, hd = q.shape
        kvh = k.shape[1]
        g = h // kvh
        qf = q.view(b, n, kvh, g, hd).transpose(1, 2).reshape(b, kvh, n * g, hd)
        if unfused:
            out = self._attend_gemm(qf, k, v, mask, scale)
        else:
            out = F.scaled_dot_product_attention(qf, k, v, attn_mask=mask, scale=scale)
        return out.view(b, kvh, n, g, hd).transpose(1, 2).reshape(b, n, h * hd)

    @staticmethod
    def _attend_gemm(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, scale: float
    ) -> torch.Tensor:
        """Attention as two batched GEMMs and a float32 softmax (transformers' eager arithmetic).

        For the expert's few queries (51 tokens x heads) over the long cache a fused attention kernel
        has only a handful of thread blocks, each walking every key; the GEMMs spread the same work
        over the whole GPU."""
        b, kvh, n, hd = q.shape
        keys = k.shape[2]
        q3, k3, v3 = q.reshape(b * kvh, n, hd), k.reshape(b * kvh, keys, hd), v.reshape(b * kvh, keys, hd)
        if bias is None:
            scores = torch.bmm(q3, k3.transpose(1, 2)) * scale
        else:
            c = bias.expand(b, kvh, n, keys).reshape(b * kvh, n, keys)
            scores = torch.baddbmm(c, q3, k3.transpose(1, 2), alpha=scale)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.bmm(probs, v3).view(b, kvh, n, hd)

    def _qkv(
        self, blk: _Block, x: torch.Tensor, heads: int, kv_heads: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(q and k heads, v heads), each laid out (B, L, heads, hd), from one fused projection."""
        b, n, _ = x.shape
        qkv = F.linear(x, blk.qkv, blk.qkv_bias).view(b, n, heads + 2 * kv_heads, -1)
        return qkv[:, :, : heads + kv_heads], qkv[:, :, heads + kv_heads :]

    def _gemma_layer(
        self,
        blk: _Block,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        at: slice,
        keys: slice,
        mask: torch.Tensor | None,
        attend: bool = True,
    ) -> torch.Tensor:
        """One Gemma decoder layer: writes this layer's K/V of ``x`` into ``k_buf/v_buf[:, :, at]`` and
        attends over ``[:, :, keys]`` of them."""
        h = _rms(x, blk.norm1)
        qk, v = self._qkv(blk, h, self.heads, self.kv_heads)
        qk = _rope(qk, rope)  # q and k heads together
        n_q = self.heads
        k_buf[:, :, at] = qk[:, :, n_q:].transpose(1, 2)
        v_buf[:, :, at] = v.transpose(1, 2)
        if not attend:
            return x
        # The expert (few queries, long cache) attends by GEMMs; the long prefix by the fused kernel.
        unfused = qk.shape[1] < UNFUSED_MAX_QUERIES
        o = self._attend(qk[:, :, :n_q], k_buf[:, :, keys], v_buf[:, :, keys], mask, blk.scale, unfused)
        x = _linear_add(x, o, blk.o, blk.o_bias)
        gu = F.linear(_rms(x, blk.norm2), blk.gate_up)
        return _linear_add(x, blk.act(gu[..., : blk.inter]) * gu[..., blk.inter :], blk.down, None)

    # -- prefix -----------------------------------------------------------------------------------------
    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """SigLIP + projector: (N, 3, H, W) -> (N, tokens, lm hidden)."""
        vt = self.vision
        x = vt.embeddings(pixels)
        nh = self.vision_heads
        for blk in self.vision_blocks:
            qk, v = self._qkv(blk, blk.ln1(x), nh, nh)
            o = self._attend(qk[:, :, :nh], qk[:, :, nh:].transpose(1, 2), v.transpose(1, 2), None, blk.scale)
            x = _linear_add(x, o, blk.o, blk.o_bias)
            x = x + blk.mlp(blk.ln2(x))
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
                blk, x, rope, cache.k[i], cache.v[i], prefix, prefix, key_mask, attend=i < last
            )
        # Expert masks: the state token sees the valid prefix and itself; action tokens see the valid
        # prefix, the state and every action (transformers' block mask in PI0Model.forward). Additive,
        # built once per observation, rows in the folded query order of ``_attend``.
        n = cache.suffix_len
        rows = torch.zeros(mask.shape[0], n, cache.total, dtype=torch.bool, device=mask.device)
        rows[:, :, :p] = mask[:, None, :]
        rows[:, 0, p] = True
        rows[:, 1:, p : p + n] = True
        bias = torch.zeros(rows.shape, dtype=self.dtype, device=mask.device)
        bias.masked_fill_(~rows, torch.finfo(self.dtype).min)
        cache.suffix_mask.copy_(bias.repeat_interleave(self.groups, dim=1)[:, None])
        # Positions continue after the valid prefix tokens (cumsum over [mask, ones] - 1).
        valid = mask.long().sum(-1, keepdim=True)
        cache.positions.copy_(valid + torch.arange(n, device=mask.device))

    # -- action expert ----------------------------------------------------------------------------------
    def velocity(
        self,
        cache: Cache,
        x: torch.Tensor,
        time: torch.Tensor,
        state: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """The expert's velocity at ``time`` ((B,) float32): a tensor, so a compiled version of this
        method sees one graph for every step."""
        h = self.model.embed_action_time(state, x, time)
        at = slice(cache.prefix_len, cache.prefix_len + cache.suffix_len)
        keys = slice(0, cache.total)
        for i, blk in enumerate(self.dit_blocks):
            # detach(): an alias of the static buffer with no autograd history, so RTC's backward of
            # this step never reaches an earlier step's graph through the shared storage.
            h = self._gemma_layer(
                blk, h, rope, cache.k[i].detach(), cache.v[i].detach(), at, keys, cache.suffix_mask
            )
        h = _rms(h, self.dit_final_norm)
        return self.model.action_out_proj(h[:, -self.chunk :])

    def denoise(
        self,
        cache: Cache,
        batch: Batch,
        num_steps: int,
        beta: float = DEFAULT_BETA,
        velocity: Velocity | None = None,
    ) -> torch.Tensor:
        """Euler flow matching from ``batch.noise`` (t = 1) to actions (t = 0), RTC-guided when the batch
        carries targets. Returns (B, chunk, max_action_dim) in the model dtype. ``velocity``: ``self.velocity``
        or a compiled version of it."""
        velocity = velocity or self.velocity
        x = batch.noise
        rope = _rope_tables(*self.dit.rotary_emb(x.new_zeros(1, dtype=self.dtype), cache.positions))
        dt = -1.0 / num_steps
        rtc = batch.target is not None
        for step in range(num_steps):
            t = 1.0 + step * dt
            if not rtc:
                x = x + dt * velocity(cache, x, self._time(x, t), batch.state, rope)
                continue
            x = x + dt * self._guided_velocity(velocity, cache, batch, x, t, rope, beta)
            # Hard inpainting: frozen steps stay on the straight noise->target path (exact at t = 0).
            t_next = max(0.0, 1.0 + (step + 1) * dt) if step + 1 < num_steps else 0.0
            assert batch.frozen is not None and batch.target is not None
            on_path = t_next * batch.noise.float() + (1.0 - t_next) * batch.target
            x = torch.where(batch.frozen, on_path.to(x.dtype), x)
        return x

    @staticmethod
    def _time(x: torch.Tensor, t: float) -> torch.Tensor:
        return torch.full((x.shape[0],), t, dtype=torch.float32, device=x.device)

    def _guided_velocity(
        self,
        velocity: Velocity,
        cache: Cache,
        batch: Batch,
        x: torch.Tensor,
        t: float,
        rope: tuple[torch.Tensor, torch.Tensor],
        beta: float,
    ) -> torch.Tensor:
        """v - c(t) * J^T (W * (Y - A_hat)), A_hat = x - t v(x): PiGDM with the Jacobian of the
        one-step action estimate (a vector-Jacobian product through the expert; a compiled ``velocity``
        brings its compiled backward)."""
        assert batch.target is not None and batch.weights is not None
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            v = velocity(cache, xg, self._time(x, t), batch.state, rope)
            a_hat = xg - t * v
            err = (batch.weights * (batch.target - a_hat.float())).to(a_hat.dtype)
            (g,) = torch.autograd.grad(a_hat, xg, grad_outputs=err)
        return v.detach() - guidance_scale(t, beta) * g

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


# -- the serving runner -----------------------------------------------------------------------------------
class _Bucket:
    """Static inputs, cache and output of one batch size, and the graphs captured over them: the loop's
    (``plain``, ``rtc``) at this size, the prefix's at every exact size from ``smallest`` up to it."""

    def __init__(
        self,
        fn: Pi0Functional,
        size: int,
        smallest: int,
        slots: int,
        image: tuple[int, int],
        prompt_len: int,
        device: torch.device,
    ) -> None:
        dt = fn.dtype
        h, w = image
        tokens = prompt_len
        self.size, self.smallest = size, smallest
        self.batch = Batch(
            pixel_values=torch.zeros((size, slots, 3, h, w), dtype=torch.uint8, device=device),
            input_ids=torch.zeros((size, tokens), dtype=torch.long, device=device),
            # Padding rows keep an all-valid mask: finite values, never read back.
            mask=torch.ones((size, tokens), dtype=torch.bool, device=device),
            state=torch.zeros((size, fn.model.config.max_state_dim), dtype=dt, device=device),
            noise=torch.zeros((size, fn.chunk, fn.max_action_dim), dtype=dt, device=device),
            target=torch.zeros((size, fn.chunk, fn.max_action_dim), dtype=torch.float32, device=device),
            weights=torch.zeros((size, fn.chunk, fn.max_action_dim), dtype=torch.float32, device=device),
            frozen=torch.zeros((size, fn.chunk, 1), dtype=torch.bool, device=device),
        )
        # Host staging, pinned on CUDA: the uploads are asynchronous and ordered before the replays.
        pinned = device.type == "cuda"
        self.host = Batch(
            **{
                f.name: torch.empty_like(getattr(self.batch, f.name), device="cpu", pin_memory=pinned)
                for f in dataclasses.fields(Batch)
            }
        )
        self.cache = Cache(fn, size, tokens, device)
        self.out = torch.zeros((size, fn.chunk, fn.max_action_dim), dtype=dt, device=device)
        self.graphs: dict[tuple[str, int], Any] = {}
        """(kind, steps) for the loops, ("prefix", rows) for the prefix -> CUDA graph."""
        self.compiled: set[str] = set()
        """Loop kinds whose graph runs the compiled expert step."""

    def plain(self) -> Batch:
        b = self.batch
        return Batch(b.pixel_values, b.input_ids, b.mask, b.state, b.noise)


class FastPi0Runner(Pi0Runner):
    """``Pi0Runner`` with the fast sampler: static KV, bucketed CUDA graphs on CUDA (eager elsewhere).

    ``compile_expert``: the expert's step goes through ``torch.compile`` (one compile per bucket and loop
    kind, the guided loop's with its backward). ``warmup`` compiles bucket by bucket, smallest first,
    while ``compile_budget_s`` lasts; buckets begun after that run the uncompiled step (same function,
    slower), and so does any capture that fails compiled."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        spec: Any,
        device: str = "cpu",
        norm: Any = None,
        rtc_beta: float = DEFAULT_BETA,
        buckets: tuple[int, ...] = DEFAULT_BUCKETS,
        cuda_graphs: bool | None = None,
        compile_expert: bool = False,
        compile_budget_s: float = DEFAULT_COMPILE_BUDGET_S,
    ) -> None:
        super().__init__(model, tokenizer, spec, device, norm, rtc_beta)
        self.fn = Pi0Functional(model)
        self._functional = self.fn
        self.buckets = tuple(sorted(set(buckets)))
        if not self.buckets or self.buckets[0] < 1:
            raise ValueError(f"policy_graph_buckets must be positive batch sizes, got {list(buckets)}")
        self.compile_expert, self.compile_budget_s = compile_expert, compile_budget_s
        self._compiled_velocity: Velocity | None = None
        if compile_expert:
            import torch._dynamo

            # One compiled entry per bucket and grad mode (plain / guided), plus slack for step counts.
            need = 2 * len(self.buckets) + 4
            cfg = torch._dynamo.config
            cfg.recompile_limit = max(cfg.recompile_limit, need)
            self._compiled_velocity = torch.compile(self.fn.velocity, dynamic=False)
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self._buckets: dict[int, _Bucket] = {}
        self._graph_failed: set[tuple[str, int, int]] = set()
        self._pool: Any = None
        self.warmup_report: dict[str, Any] = {}
        """What ``warmup`` did: seconds, graphs, compiled loops per bucket, failures."""

    def run(self, prepared: list[Prepared], num_steps: int | None) -> list[np.ndarray]:
        steps = num_steps or self.spec.num_inference_steps
        out: list[np.ndarray] = []
        top = self.buckets[-1]
        for i in range(0, len(prepared), top):
            group = prepared[i : i + top]
            out += self.finish(group, self._sample_group(group, steps))
        return out

    def warmup(self) -> None:
        """Capture every bucket's graphs (exact-size prefixes, plain and RTC loops) at the default step
        count, compiling while the budget lasts."""
        if not self.cuda_graphs:
            return
        start = time.monotonic()
        steps = self.spec.num_inference_steps
        budget_left = self.compile_expert
        for size in self.buckets:
            if budget_left and time.monotonic() - start > self.compile_budget_s:
                budget_left = False
                log.warning(
                    "policy: compile budget (%.0f s) spent; buckets from %d on run the uncompiled step",
                    self.compile_budget_s,
                    size,
                )
            bucket = self._bucket(size)
            for rows in range(bucket.smallest, size + 1):
                self._graph(bucket, "prefix", 0, rows)
            for kind in ("plain", "rtc"):
                self._graph(bucket, kind, steps, compiled=budget_left)
        torch.cuda.synchronize(self.device)
        self.warmup_report = {
            "seconds": round(time.monotonic() - start, 1),
            "graphs": sum(len(b.graphs) for b in self._buckets.values()),
            "compiled": {b.size: sorted(b.compiled) for b in self._buckets.values()},
            "failed": sorted(map(str, self._graph_failed)),
        }
        log.info("policy: graphs ready %s", self.warmup_report)

    # -- internals ------------------------------------------------------------------------------------
    @torch.no_grad()
    def _sample_group(self, group: list[Prepared], steps: int) -> torch.Tensor:
        rtc = any(p.rtc is not None for p in group)
        if not self.cuda_graphs:
            return self.fn.sample(group, steps, self.device, self.rtc_beta)
        n = len(group)
        bucket = self._bucket(next(b for b in self.buckets if b >= n))
        self._load(bucket, group, rtc)
        self._launch(bucket, "prefix", 0, n)
        self._launch(bucket, "rtc" if rtc else "plain", steps, bucket.size)
        return bucket.out[:n].clone()  # the caller's .cpu() is the one host sync

    def _bucket(self, size: int) -> _Bucket:
        if size not in self._buckets:
            tokens = self.spec.image_slots * self.tokens_per_image + self.spec.max_prompt_tokens
            smaller = [b for b in self.buckets if b < size]
            self._buckets[size] = _Bucket(
                self.fn,
                size,
                smaller[-1] + 1 if smaller else 1,
                self.spec.image_slots,
                self.spec.image_size,
                tokens,
                self.device,
            )
        return self._buckets[size]

    def _load(self, bucket: _Bucket, group: list[Prepared], rtc: bool) -> None:
        """Stage the group in the bucket's host buffers, then upload them (asynchronously from pinned
        memory; the previous group's results were read back first, so the staging is free)."""
        n = len(group)
        host, dev = bucket.host.rows(n), bucket.batch.rows(n)
        fields = ["pixel_values", "input_ids", "mask", "state", "noise"]
        host.pixel_values.copy_(torch.stack([p.pixel_values for p in group]))
        host.input_ids.copy_(torch.stack([p.input_ids for p in group]))
        host.mask.copy_(torch.stack([p.attention_mask for p in group]))
        host.state.copy_(torch.stack([p.state for p in group]))
        host.noise.copy_(torch.stack([p.noise for p in group]))
        if rtc:
            fields += ["target", "weights", "frozen"]
            target, weights, frozen = rtc_stack(group, self.fn.chunk, self.fn.max_action_dim)
            assert host.target is not None and host.weights is not None and host.frozen is not None
            host.target.copy_(target)
            host.weights.copy_(weights)
            host.frozen.copy_(frozen)
        for name in fields:
            getattr(dev, name).copy_(getattr(host, name), non_blocking=True)

    def _body(self, bucket: _Bucket, kind: str, steps: int, rows: int, velocity: Velocity) -> Callable[[], None]:
        fn, beta = self.fn, self.rtc_beta
        if kind == "prefix":
            return lambda: fn.fill_prefix(bucket.cache.rows(rows), bucket.batch.rows(rows))
        batch = bucket.batch if kind == "rtc" else bucket.plain()

        def denoise() -> None:
            bucket.out.copy_(fn.denoise(bucket.cache, batch, steps, beta, velocity))

        return denoise

    def _launch(self, bucket: _Bucket, kind: str, steps: int, rows: int) -> None:
        graph = self._graph(bucket, kind, steps, rows)
        if graph is None:
            velocity = self._compiled_velocity if kind in bucket.compiled else None
            self._body(bucket, kind, steps, rows, velocity or self.fn.velocity)()
        else:
            graph.replay()

    def _graph(
        self, bucket: _Bucket, kind: str, steps: int, rows: int | None = None, compiled: bool = False
    ) -> Any:
        """The graph of ``kind`` (captured on first use); None where capture failed (launch eagerly).

        Only ``warmup`` asks for ``compiled``: a compile takes tens of seconds, which a serving step
        must not (the supervisor would take it for a hang), so captures later run the plain step."""
        rows = bucket.size if rows is None else rows
        key = ("prefix", rows) if kind == "prefix" else (kind, steps)
        if key in bucket.graphs:
            return bucket.graphs[key]
        if (kind, key[1], bucket.size) in self._graph_failed:
            return None
        tries: list[Velocity] = [self.fn.velocity]
        if kind != "prefix" and compiled and self._compiled_velocity is not None:
            tries.insert(0, self._compiled_velocity)
        for velocity in tries:
            try:
                graph = self._capture(bucket, kind, steps, rows, velocity)
            except Exception as e:  # capture is an optimisation: fall back to less of it
                log.warning(
                    "policy: CUDA graph capture of %s (batch %d, %d rows, %d steps, %s) failed: %s",
                    kind,
                    bucket.size,
                    rows,
                    steps,
                    "compiled" if velocity is self._compiled_velocity else "uncompiled",
                    e,
                )
                continue
            if velocity is self._compiled_velocity:
                bucket.compiled.add(kind)
            bucket.graphs[key] = graph
            return graph
        self._graph_failed.add((kind, key[1], bucket.size))
        return None

    def _capture(self, bucket: _Bucket, kind: str, steps: int, rows: int, velocity: Velocity) -> Any:
        body = self._body(bucket, kind, steps, rows, velocity)
        with torch.cuda.device(self.device):
            if self._pool is None:
                # One pool for every graph: they run one at a time and keep nothing between replays.
                self._pool = torch.cuda.graph_pool_handle()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up outside the capture (compiles, cuBLAS handles, autograd)
                    if kind != "prefix":
                        self.fn.fill_prefix(bucket.cache, bucket.batch)
                    body()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                body()
        return graph
