"""Qwen3 talker + code predictor, decoded one codec frame per step for many streams at once.

``CodecTalker`` holds the weights: a Qwen3 decoder (transformers ``Qwen3Model``; its ``embed_tokens`` is
the codebook-0 embedding) over the sum of a text-token embedding and the previous frame's codec
embedding, a codebook-0 head, and a small Qwen3 code predictor that emits codebooks 1..K-1 of the same
frame (Qwen3-TTS's layout). ``TalkerRuntime`` runs it with our own static-KV attention over those
modules' weights (q/k/v/o projections, q_norm/k_norm, rotary, MLP), because every stream sits at its
own position and transformers' caches assume one position per batch.

Each layer's weights are regrouped once (``FusedQwen3Layer``: one QKV GEMM, one gate/up GEMM, residual
adds inside the output GEMMs), about 20 kernels per layer instead of ~60: at batch 1 a decode step is
bound by kernel count, not bytes. The regrouped copies cost ~0.7 GB extra at the full config.

Slots: the KV cache is ``(slots, kv_heads, max_positions + 1, head_dim)`` per layer, preallocated. A step
covers slots ``[0, B)`` with an ``active`` mask: inactive rows compute but write their K/V into the
scratch column ``max_positions`` and keep their position, so a stream that waits for text is untouched
and every shape stays static (CUDA-graph friendly; nothing in a step syncs with the host).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from realtime_gw.models.kernels import (
    KeyMask,
    additive_mask,
    fuse_linears,
    gated_mlp,
    layers_at_positions,
    layers_over_span,
    linear_add,
    qkv_heads,
    rope_attend,
    rope_cos_sin,
)
from realtime_gw.models.speech.codec.spec import CodecSpec


@dataclass
class FusedQwen3Layer:
    """A ``Qwen3DecoderLayer``'s weights regrouped for decode: one QKV GEMM, one gate/up GEMM,
    residual adds fused into the output GEMMs (``addmm``), q/k norms as one ``rms_norm`` + scale."""

    ln1: torch.Tensor
    ln2: torch.Tensor
    eps: float
    w_qkv: torch.Tensor
    b_qkv: torch.Tensor | None
    qk_norm: torch.Tensor  # (H + KV, D): q_norm weight for query heads, k_norm weight for key heads
    qk_eps: float
    w_o: torch.Tensor
    b_o: torch.Tensor | None
    w_gate_up: torch.Tensor
    b_gate_up: torch.Tensor | None
    w_down: torch.Tensor
    b_down: torch.Tensor | None
    heads: int
    kv_heads: int
    head_dim: int
    scale: float

    @classmethod
    def of(cls, layer: Any) -> FusedQwen3Layer:
        att, mlp = layer.self_attn, layer.mlp
        if type(mlp.act_fn).__name__ not in ("SiLU", "SiLUActivation"):
            raise NotImplementedError("the fused talker layer assumes SwiGLU (hidden_act='silu')")
        d = att.head_dim
        heads, kv = att.q_proj.out_features // d, att.k_proj.out_features // d
        w_qkv, b_qkv = fuse_linears(att.q_proj, att.k_proj, att.v_proj)
        w_gate_up, b_gate_up = fuse_linears(mlp.gate_proj, mlp.up_proj)
        with torch.no_grad():
            return cls(
                ln1=layer.input_layernorm.weight,
                ln2=layer.post_attention_layernorm.weight,
                eps=float(layer.input_layernorm.variance_epsilon),
                w_qkv=w_qkv,
                b_qkv=b_qkv,
                qk_norm=torch.cat(
                    [att.q_norm.weight.expand(heads, d), att.k_norm.weight.expand(kv, d)]
                ).contiguous(),
                qk_eps=float(att.q_norm.variance_epsilon),
                w_o=att.o_proj.weight,
                b_o=att.o_proj.bias,
                w_gate_up=w_gate_up,
                b_gate_up=b_gate_up,
                w_down=mlp.down_proj.weight,
                b_down=mlp.down_proj.bias,
                heads=heads,
                kv_heads=kv,
                head_dim=d,
                scale=float(att.scaling),
            )

    def __call__(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        write: Any,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask_add: torch.Tensor,
    ) -> torch.Tensor:
        """``x (B, S, hidden)``; ``cos``/``sin`` broadcast to ``(B, S, 1, D)``; ``write(k, v)`` stores the new
        K/V ``(B, KV, S, D)`` before attention reads ``keys``/``values``."""
        hidden = x.shape[-1]
        h = F.rms_norm(x, (hidden,), self.ln1, self.eps)
        qk, v = qkv_heads(h, self.w_qkv, self.b_qkv, self.heads, self.kv_heads)
        qk = F.rms_norm(qk, (self.head_dim,), None, self.qk_eps) * self.qk_norm
        o = rope_attend(qk, v, self.heads, cos, sin, write, keys, values, mask_add, self.scale)
        x = linear_add(x, o, self.w_o, self.b_o)
        h = F.rms_norm(x, (hidden,), self.ln2, self.eps)
        return gated_mlp(h, self.w_gate_up, self.w_down, x, self.b_gate_up, self.b_down)


class CodecTalker(nn.Module):
    """Weights of the talker and the code predictor."""

    def __init__(self, spec: CodecSpec) -> None:
        super().__init__()
        from transformers import Qwen3Config, Qwen3Model

        tcfg, pcfg = Qwen3Config(**spec.talker), Qwen3Config(**spec.predictor)
        if tcfg.hidden_size != pcfg.hidden_size:
            raise ValueError("talker and code predictor must share hidden_size")
        if tcfg.vocab_size < spec.eos_id + 1 or spec.codec_vocab != tcfg.vocab_size:
            raise ValueError(
                "talker vocab_size must equal codec_vocab and hold the codebook plus pad/bos/eos"
            )
        hidden, th, k = tcfg.hidden_size, spec.text_hidden, spec.num_codebooks
        self.spec = spec
        self.text_embed = nn.Embedding(spec.text_vocab, th)
        self.text_proj = nn.Sequential(nn.Linear(th, th), nn.SiLU(), nn.Linear(th, hidden))
        self.model = Qwen3Model(tcfg)
        self.codec_head = nn.Linear(hidden, spec.codec_vocab, bias=False)
        self.predictor = Qwen3Model(pcfg)
        self.predictor_embeds = nn.ModuleList(nn.Embedding(spec.codebook_size, hidden) for _ in range(k - 1))
        self.predictor_heads = nn.ModuleList(
            nn.Linear(hidden, spec.codebook_size, bias=False) for _ in range(k - 1)
        )
        std = tcfg.initializer_range
        extra = [
            self.text_embed,
            self.text_proj,
            self.codec_head,
            self.predictor_embeds,
            self.predictor_heads,
        ]
        for mod in extra:
            for m in mod.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=std)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)


class TalkerRuntime:
    """Static per-slot state and the batched frame step of a ``CodecTalker``."""

    def __init__(
        self,
        talker: CodecTalker,
        slots: int,
        *,
        temperature: float = 0.9,
        top_k: int = 50,
        allow_eos: bool = False,
    ) -> None:
        spec = talker.spec
        p = next(talker.parameters())
        dev, dt = p.device, p.dtype
        self.talker = talker
        self.spec = spec
        self.slots = slots
        self.temperature = temperature
        self.top_k = top_k
        self.allow_eos = allow_eos
        self.max_positions = spec.max_positions
        tcfg, pcfg = talker.model.config, talker.predictor.config
        self.hidden = tcfg.hidden_size
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        for layer in talker.model.layers:
            kv, d = tcfg.num_key_value_heads, layer.self_attn.head_dim
            shape = (slots, kv, spec.max_positions + 1, d)  # +1: scratch column for inactive rows
            self.k_cache.append(torch.zeros(shape, device=dev, dtype=dt))
            self.v_cache.append(torch.zeros(shape, device=dev, dtype=dt))
        k = spec.num_codebooks
        self.pk_cache: list[torch.Tensor] = []
        self.pv_cache: list[torch.Tensor] = []
        for layer in talker.predictor.layers:
            shape = (slots, pcfg.num_key_value_heads, k, layer.self_attn.head_dim)
            self.pk_cache.append(torch.zeros(shape, device=dev, dtype=dt))
            self.pv_cache.append(torch.zeros(shape, device=dev, dtype=dt))
        self.pos = torch.zeros(slots, dtype=torch.long, device=dev)
        self.last_emb = torch.zeros(slots, self.hidden, device=dev, dtype=dt)
        rot = talker.model.rotary_emb
        self.inv_freq = rot.inv_freq.detach().float().clone()
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        prot = talker.predictor.rotary_emb
        self.p_cos, self.p_sin = rope_cos_sin(
            torch.arange(k, device=dev),
            prot.inv_freq.detach(),
            float(getattr(prot, "attention_scaling", 1.0)),
            dt,
        )
        self.layers = [FusedQwen3Layer.of(layer) for layer in talker.model.layers]
        self.p_layers = [FusedQwen3Layer.of(layer) for layer in talker.predictor.layers]
        # The predictor's per-pass masks are static (same short causal pattern every frame).
        self.p_masks: list[torch.Tensor] = []
        pl = self.p_layers[0]
        start, s = 0, 2
        for _ in range(k - 1):
            q_pos = torch.arange(start, start + s, device=dev)
            m = torch.arange(start + s, device=dev)[None, :] <= q_pos[:, None]
            self.p_masks.append(additive_mask(m[None], 1, pl.heads // pl.kv_heads, dt))
            start, s = start + s, 1
        allowed = torch.full((spec.codec_vocab,), float("-inf"), device=dev)
        allowed[: spec.codebook_size] = 0.0
        self.allowed0 = allowed
        self.codes_out = torch.zeros(slots, k, dtype=torch.long, device=dev)
        self.positions = torch.arange(spec.max_positions, device=dev)
        with torch.no_grad():
            self.bos_emb = talker.model.embed_tokens.weight[spec.bos_id].detach().clone()

    # -- slots -------------------------------------------------------------------------------------------
    @torch.no_grad()
    def reset(self, slots: torch.Tensor) -> None:
        """Fresh streams in ``slots`` (a device index tensor): position 0, previous-frame embedding = codec
        BOS. Old K/V need no clearing: attention only reads columns below a slot's position."""
        self.pos.index_fill_(0, slots, 0)
        self.last_emb.index_copy_(0, slots, self.bos_emb.expand(slots.shape[0], -1))

    # -- the step ----------------------------------------------------------------------------------------
    def _noise(self, b: int, device: torch.device) -> list[torch.Tensor]:
        """Gumbel noise for the whole frame (codebook 0, then 1..K-1), times the temperature, drawn at once:
        ``argmax(logits + T*g) == argmax(logits/T + g)``, so sampling is a top-k mask, an add, an argmax."""
        if self.temperature <= 0:
            return []
        v0, v = self.spec.codec_vocab, self.spec.codebook_size
        u = torch.rand(b, v0 + (self.spec.num_codebooks - 1) * v, device=device).clamp_(1e-10, 1.0 - 1e-7)
        g = u.log_().neg_().log_().neg_().mul_(self.temperature)
        return [g[:, :v0], *g[:, v0:].view(b, -1, v).unbind(1)]

    def _sample(self, logits: torch.Tensor, noise: list[torch.Tensor], i: int) -> torch.Tensor:
        """Temperature + top-k sampling on device: no host sync, graph-capturable; greedy when T <= 0."""
        if self.temperature <= 0:
            return logits.argmax(dim=-1)
        if 0 < self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[:, -1:]
            return (logits + noise[i]).masked_fill(logits < kth, float("-inf")).argmax(dim=-1)
        return (logits + noise[i]).argmax(dim=-1)

    def talker_hidden(self, b: int, length: int, x: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """Talker layers for slots ``[0, b)``: input embeddings ``x (b, hidden)`` -> normed hidden ``(b, hidden)``.

        Writes K/V at each active slot's position (inactive: scratch column); attends to ``[0, length)``,
        which must cover every active slot's position. Does not advance positions (``advance`` does).
        """
        pos = self.pos[:b]
        cos, sin = rope_cos_sin(pos, self.inv_freq, self.rope_scale, x.dtype)
        cos, sin = cos[:, None, None, :], sin[:, None, None, :]
        col = torch.where(active, pos, self.max_positions)
        l0 = self.layers[0]
        mask = (self.positions[None, :length] <= pos[:, None])[:, None, :]  # (b, 1, length)
        mask_add = additive_mask(mask, l0.kv_heads, l0.heads // l0.kv_heads, x.dtype)
        visible = KeyMask(mask_add, (pos + 1).to(torch.int32))  # the decode kernel reads no further
        h = layers_at_positions(
            self.layers, x[:, None, :], cos, sin, self.k_cache, self.v_cache, col, length, visible
        )
        norm = self.talker.model.norm
        return F.rms_norm(h[:, 0], (self.hidden,), norm.weight, norm.variance_epsilon)

    def advance(self, b: int, active: torch.Tensor) -> None:
        self.pos[:b].add_(active.long())

    def predict_codes(
        self, h: torch.Tensor, code0: torch.Tensor, noise: list[torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Code predictor for one frame: ``[h, emb(code0)]`` then one codebook per pass.

        Returns codes ``(b, K)`` and the frame's summed codec embedding (next talker input).
        """
        t = self.talker
        b = h.shape[0]
        if noise is None:
            noise = self._noise(b, h.device)
        e0 = t.model.embed_tokens(code0)
        embs = [e0]
        codes = [code0]
        x = torch.stack([h, e0], dim=1)
        start = 0
        for i in range(self.spec.num_codebooks - 1):
            s = x.shape[1]
            end = start + s
            cos, sin = self.p_cos[None, start:end, None], self.p_sin[None, start:end, None]
            x = layers_over_span(
                self.p_layers, x, cos, sin, self.pk_cache, self.pv_cache, start, end, self.p_masks[i]
            )
            pn = t.predictor.norm
            hp = F.rms_norm(x[:, -1], (self.hidden,), pn.weight, pn.variance_epsilon)
            code = self._sample(t.predictor_heads[i](hp).float(), noise, i + 1)
            codes.append(code)
            e = t.predictor_embeds[i](code)
            embs.append(e)
            x = e[:, None, :]
            start = end
        return torch.stack(codes, dim=1), torch.stack(embs).sum(dim=0)

    def frame_step(
        self, b: int, length: int, text_tokens: torch.Tensor, active: torch.Tensor, eos_ok: torch.Tensor
    ) -> torch.Tensor:
        """Advance every active slot in ``[0, b)`` by one frame; returns codes ``(b, K)`` (also in ``codes_out``).

        Input of a stream = projected text-token embedding + the previous frame's codec embedding.
        ``eos_ok`` lets codebook 0 emit EOS (only once a stream's text is fully consumed).
        """
        t = self.talker
        x = t.text_proj(t.text_embed(text_tokens)) + self.last_emb[:b]
        h = self.talker_hidden(b, length, x, active)
        raw = t.codec_head(h).float()
        logits = raw + self.allowed0
        if self.allow_eos:
            eos = self.spec.eos_id
            logits[:, eos] = raw[:, eos].masked_fill(~eos_ok, float("-inf"))
        noise = self._noise(b, h.device)
        code0 = self._sample(logits, noise, 0)
        codes, emb_sum = self.predict_codes(h, code0, noise)
        self.last_emb[:b] = torch.where(active[:, None], emb_sum, self.last_emb[:b])
        self.advance(b, active)
        self.codes_out[:b] = codes
        return codes
