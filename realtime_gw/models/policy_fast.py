"""Fast PI0 sampling: the same function as transformers' ``PI0ForConditionalGeneration.sample_actions``,
restructured for serving.

- The vision-language prefix runs once per observation into a **static KV cache** (one buffer per layer,
  ``[prefix | state + action tokens | pad]``); the last VLM layer stops after its K/V (its output is never
  read). The action expert writes its 1 + H tokens into the tail of the same buffers at every step, so
  no cache is grown, cropped or copied.
- The flow-matching loop has no host syncs (times are Python constants), so on CUDA the prefix and the
  whole loop are each captured in a **CUDA graph per batch bucket** (1, 2, 4, 8, 16 by default) and
  replayed; a batch is padded up to its bucket. The only sync is the final copy of the actions.
- Real-time chunking (``policy_rtc``): guided denoising with pseudo-inverse guidance (a vector-Jacobian
  product through the action expert at every step) toward the previous chunk, plus hard inpainting of
  the frozen steps; captured in its own graph per bucket.

Every module call goes to the model's own submodules (norms, MLPs, rotary tables, embeddings,
projections); only attention and cache handling are written here, which keeps the numerics those of the
installed transformers (checked against ``sample_actions`` in ``tests/models/test_policy_fast.py``).
Sub-module names are the same in transformers 5.17 and 5.24.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from realtime_gw.models.policy_pi0 import Pi0Runner, Prepared
from realtime_gw.models.policy_preprocess import scale_pixels
from realtime_gw.models.policy_rtc import DEFAULT_BETA, guidance_scale

log = logging.getLogger(__name__)

DEFAULT_BUCKETS = (1, 2, 4, 8, 16)
KV_ALIGN = 16
"""KV buffer length is rounded up to this (masked tail): aligned masks keep SDPA on its fused kernels."""


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``apply_rotary_pos_emb`` for one tensor (B, heads, L, hd); cos/sin (B, L, hd)."""
    cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


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


class Cache:
    """Static per-layer K/V for one batch size, plus the per-batch masks and positions the expert uses."""

    def __init__(self, fn: Pi0Functional, batch: int, prefix_len: int, device: torch.device) -> None:
        self.prefix_len = prefix_len
        self.suffix_len = fn.chunk + 1
        self.total = -(-(prefix_len + self.suffix_len) // KV_ALIGN) * KV_ALIGN
        shape = (batch, fn.kv_heads, self.total, fn.head_dim)
        self.k = [torch.zeros(shape, dtype=fn.dtype, device=device) for _ in range(fn.layers)]
        self.v = [torch.zeros(shape, dtype=fn.dtype, device=device) for _ in range(fn.layers)]
        self.suffix_mask = torch.zeros(
            (batch, 1, fn.groups * self.suffix_len, self.total), dtype=torch.bool, device=device
        )
        self.positions = torch.zeros((batch, self.suffix_len), dtype=torch.long, device=device)


class Pi0Functional:
    """PI0 inference over a loaded ``PI0ForConditionalGeneration``'s weights (no copies of them)."""

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

    # -- attention ------------------------------------------------------------------------------------
    def _split(self, proj: torch.Tensor, heads: int) -> torch.Tensor:
        b, n, _ = proj.shape
        return proj.view(b, n, heads, -1).transpose(1, 2)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
    ) -> torch.Tensor:
        """q (B, heads, Q, hd) over k/v (B, kv_heads, K, hd) -> (B, Q, heads * hd).

        Query heads that share a KV head are folded into the query axis: one plain attention per KV head
        (no repeated K/V, and the fused kernels take any mask)."""
        b, h, n, hd = q.shape
        kvh = k.shape[1]
        if h != kvh:
            q = q.reshape(b, kvh, (h // kvh) * n, hd)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return out.reshape(b, h, n, hd).transpose(1, 2).reshape(b, n, h * hd)

    # -- prefix -----------------------------------------------------------------------------------------
    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """SigLIP + projector: (N, 3, H, W) -> (N, tokens, lm hidden)."""
        vt = self.vision
        x = vt.embeddings(pixels)
        for layer in vt.encoder.layers:
            attn = layer.self_attn
            h = layer.layer_norm1(x)
            q, k, v = (self._split(p(h), attn.num_heads) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
            x = x + attn.out_proj(self._attend(q, k, v, None, attn.scale))
            x = x + layer.mlp(layer.layer_norm2(x))
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
        cos, sin = self.lm.rotary_emb(x, positions)
        key_mask = mask[:, None, None, :]
        last = len(self.lm.layers) - 1
        for i, layer in enumerate(self.lm.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            k = _rope(self._split(attn.k_proj(h), self.kv_heads), cos, sin)
            v = self._split(attn.v_proj(h), self.kv_heads)
            cache.k[i][:, :, :p].copy_(k)
            cache.v[i][:, :, :p].copy_(v)
            if i == last:
                break  # nothing reads the last layer's output, only its K/V
            q = _rope(self._split(attn.q_proj(h), self.heads), cos, sin)
            x = x + attn.o_proj(self._attend(q, k, v, key_mask, attn.scaling))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        # Expert masks: the state token sees the valid prefix and itself; action tokens see the valid
        # prefix, the state and every action (transformers' block mask in PI0Model.forward).
        n = cache.suffix_len
        rows = torch.zeros(mask.shape[0], n, cache.total, dtype=torch.bool, device=mask.device)
        rows[:, :, :p] = mask[:, None, :]
        rows[:, 0, p] = True
        rows[:, 1:, p : p + n] = True
        cache.suffix_mask.copy_(rows.repeat(1, self.groups, 1)[:, None])
        # Positions continue after the valid prefix tokens (cumsum over [mask, ones] - 1).
        valid = mask.long().sum(-1, keepdim=True)
        cache.positions.copy_(valid + torch.arange(n, device=mask.device))

    # -- action expert ----------------------------------------------------------------------------------
    def velocity(
        self,
        cache: Cache,
        x: torch.Tensor,
        t: float,
        state: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        b = x.shape[0]
        time = torch.full((b,), t, dtype=torch.float32, device=x.device)
        h = self.model.embed_action_time(state, x, time)
        cos, sin = rope
        p, n = cache.prefix_len, cache.suffix_len
        for i, layer in enumerate(self.dit.layers):
            attn = layer.self_attn
            a = layer.input_layernorm(h)
            q = _rope(self._split(attn.q_proj(a), self.heads), cos, sin)
            k = _rope(self._split(attn.k_proj(a), self.kv_heads), cos, sin)
            v = self._split(attn.v_proj(a), self.kv_heads)
            # detach(): an alias of the static buffer with no autograd history, so RTC's backward of
            # this step never reaches an earlier step's graph through the shared storage.
            kk, vv = cache.k[i].detach(), cache.v[i].detach()
            kk[:, :, p : p + n] = k
            vv[:, :, p : p + n] = v
            h = h + attn.o_proj(self._attend(q, kk, vv, cache.suffix_mask, attn.scaling))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        h = self.dit.norm(h)
        return self.model.action_out_proj(h[:, -self.chunk :])

    def denoise(self, cache: Cache, batch: Batch, num_steps: int, beta: float = DEFAULT_BETA) -> torch.Tensor:
        """Euler flow matching from ``batch.noise`` (t = 1) to actions (t = 0), RTC-guided when the batch
        carries targets. Returns (B, chunk, max_action_dim) in the model dtype."""
        x = batch.noise
        rope = self.dit.rotary_emb(x.new_zeros(1, dtype=self.dtype), cache.positions)
        dt = -1.0 / num_steps
        rtc = batch.target is not None
        for step in range(num_steps):
            t = 1.0 + step * dt
            if not rtc:
                x = x + dt * self.velocity(cache, x, t, batch.state, rope)
                continue
            x = x + dt * self._guided_velocity(cache, batch, x, t, rope, beta)
            # Hard inpainting: frozen steps stay on the straight noise->target path (exact at t = 0).
            t_next = max(0.0, 1.0 + (step + 1) * dt) if step + 1 < num_steps else 0.0
            assert batch.frozen is not None and batch.target is not None
            on_path = t_next * batch.noise.float() + (1.0 - t_next) * batch.target
            x = torch.where(batch.frozen, on_path.to(x.dtype), x)
        return x

    def _guided_velocity(
        self,
        cache: Cache,
        batch: Batch,
        x: torch.Tensor,
        t: float,
        rope: tuple[torch.Tensor, torch.Tensor],
        beta: float,
    ) -> torch.Tensor:
        """v - c(t) * J^T (W * (Y - A_hat)), A_hat = x - t v(x): PiGDM with the Jacobian of the
        one-step action estimate (a vector-Jacobian product through the expert)."""
        assert batch.target is not None and batch.weights is not None
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            v = self.velocity(cache, xg, t, batch.state, rope)
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
    """Static inputs, cache and output of one batch size, and the graphs captured over them."""

    def __init__(
        self,
        fn: Pi0Functional,
        size: int,
        slots: int,
        image: tuple[int, int],
        prompt_len: int,
        device: torch.device,
    ) -> None:
        dt = fn.dtype
        h, w = image
        tokens = prompt_len
        self.size = size
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
        self.cache = Cache(fn, size, tokens, device)
        self.out = torch.zeros((size, fn.chunk, fn.max_action_dim), dtype=dt, device=device)
        self.graphs: dict[tuple[str, int], Any] = {}

    def plain(self) -> Batch:
        b = self.batch
        return Batch(b.pixel_values, b.input_ids, b.mask, b.state, b.noise)


class FastPi0Runner(Pi0Runner):
    """``Pi0Runner`` with the fast sampler: static KV, bucketed CUDA graphs on CUDA (eager elsewhere)."""

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
    ) -> None:
        super().__init__(model, tokenizer, spec, device, norm, rtc_beta)
        self.fn = Pi0Functional(model)
        self._functional = self.fn
        self.buckets = tuple(sorted(set(buckets)))
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self._buckets: dict[int, _Bucket] = {}
        self._graph_failed: set[tuple[str, int, int]] = set()

    def run(self, prepared: list[Prepared], num_steps: int | None) -> list[np.ndarray]:
        steps = num_steps or self.spec.num_inference_steps
        out: list[np.ndarray] = []
        top = self.buckets[-1]
        for i in range(0, len(prepared), top):
            group = prepared[i : i + top]
            out += self.finish(group, self._sample_group(group, steps))
        return out

    def warmup(self) -> None:
        """Capture every bucket's graphs (plain and RTC) at the default step count."""
        if not self.cuda_graphs:
            return
        for size in self.buckets:
            bucket = self._bucket(size)
            for kind in ("prefix", "plain", "rtc"):
                self._graph(bucket, kind, self.spec.num_inference_steps)
        torch.cuda.synchronize(self.device)

    # -- internals ------------------------------------------------------------------------------------
    @torch.no_grad()
    def _sample_group(self, group: list[Prepared], steps: int) -> torch.Tensor:
        rtc = any(p.rtc is not None for p in group)
        if not self.cuda_graphs:
            return self.fn.sample(group, steps, self.device, self.rtc_beta)
        n = len(group)
        bucket = self._bucket(next(b for b in self.buckets if b >= n))
        self._load(bucket, group, rtc)
        self._launch(bucket, "prefix", steps)
        self._launch(bucket, "rtc" if rtc else "plain", steps)
        return bucket.out[:n].clone()  # the caller's .cpu() is the one host sync

    def _bucket(self, size: int) -> _Bucket:
        if size not in self._buckets:
            tokens = self.spec.image_slots * self.tokens_per_image + self.spec.max_prompt_tokens
            self._buckets[size] = _Bucket(
                self.fn, size, self.spec.image_slots, self.spec.image_size, tokens, self.device
            )
        return self._buckets[size]

    def _load(self, bucket: _Bucket, group: list[Prepared], rtc: bool) -> None:
        n, b = len(group), bucket.batch
        b.pixel_values[:n].copy_(torch.stack([p.pixel_values for p in group]), non_blocking=False)
        b.input_ids[:n].copy_(torch.stack([p.input_ids for p in group]))
        b.mask[:n].copy_(torch.stack([p.attention_mask for p in group]))
        b.state[:n].copy_(torch.stack([p.state for p in group]))
        b.noise[:n].copy_(torch.stack([p.noise for p in group]))
        if rtc:
            target, weights, frozen = rtc_stack(group, self.fn.chunk, self.fn.max_action_dim)
            assert b.target is not None and b.weights is not None and b.frozen is not None
            b.target[:n].copy_(target)
            b.weights[:n].copy_(weights)
            b.frozen[:n].copy_(frozen)

    def _body(self, bucket: _Bucket, kind: str, steps: int) -> Callable[[], None]:
        fn, beta = self.fn, self.rtc_beta
        if kind == "prefix":
            return lambda: fn.fill_prefix(bucket.cache, bucket.batch)
        batch = bucket.batch if kind == "rtc" else bucket.plain()

        def denoise() -> None:
            bucket.out.copy_(fn.denoise(bucket.cache, batch, steps, beta))

        return denoise

    def _launch(self, bucket: _Bucket, kind: str, steps: int) -> None:
        graph = self._graph(bucket, kind, steps)
        if graph is None:
            self._body(bucket, kind, steps)()
        else:
            graph.replay()

    def _graph(self, bucket: _Bucket, kind: str, steps: int) -> Any:
        key = (kind, 0 if kind == "prefix" else steps)
        if key in bucket.graphs:
            return bucket.graphs[key]
        if (kind, key[1], bucket.size) in self._graph_failed:
            return None
        body = self._body(bucket, kind, steps)
        try:
            with torch.cuda.device(self.device):
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):  # warm-up outside the capture (cuBLAS handles, autograd state)
                        if kind != "prefix":
                            self.fn.fill_prefix(bucket.cache, bucket.batch)
                        body()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    body()
        except Exception as e:  # capture is an optimisation: fall back to launching the same code
            log.warning(
                "policy: CUDA graph capture of %s (batch %d, %d steps) failed: %s",
                kind,
                bucket.size,
                steps,
                e,
            )
            self._graph_failed.add((kind, key[1], bucket.size))
            return None
        bucket.graphs[key] = graph
        return graph
