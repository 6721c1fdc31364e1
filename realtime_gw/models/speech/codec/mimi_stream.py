"""Streaming Mimi decoder: one codec frame (1920 samples at 24 kHz) per step, for many streams at once.

Built on a transformers ``MimiModel``'s modules and weights. Every stream owns a slot holding
- a context buffer per causal ``MimiConv1d`` (its left padding: the last ``(k-1)*dilation`` inputs),
- an overlap buffer per ``MimiConvTranspose1d`` (the ``k - stride`` output samples still to be summed),
- a ring K/V cache per decoder-transformer layer, ``sliding_window + positions_per_frame`` long, with the
  absolute position stored per ring column so the sliding-window mask is exact after wrap-around.
Decoding frames one at a time this way equals ``MimiModel.decode`` of all frames at once (causal convs,
``trim_right_ratio == 1``), which the tests check. The decoder always runs in float32.

Like the talker, a step covers slots ``[0, B)`` with an ``active`` mask: inactive rows keep their state
(``torch.where``) and write ring K/V into a scratch column, so shapes are static for CUDA graphs.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from realtime_gw.models.kernels import (
    additive_mask,
    apply_rope,
    attend,
    fuse_linears,
    qkv_heads,
    rope_cos_sin,
)


def mimi_decoder_parts(mimi: Any) -> tuple[Any, Any, Any]:
    """(upsample, decoder transformer, SEANet decoder) across transformers versions.

    transformers >= 5.2x nests them in ``MimiModel.decoder`` (a ``MimiDecoderModel``); 5.17 keeps them
    on the model (``upsample``, ``decoder_transformer``, ``decoder``).
    """
    dec = getattr(mimi, "decoder", None)
    if dec is not None and hasattr(dec, "decoder_seanet"):
        return dec.upsample, dec.decoder_transformer, dec.decoder_seanet
    return mimi.upsample, mimi.decoder_transformer, mimi.decoder


def codebook_tables(quantizer: Any, num_codebooks: int) -> torch.Tensor:
    """``(K, codebook_size, hidden)``: each codebook's entries already through its RVQ's output projection.

    The projection is linear and bias-free, so summing projected entries equals projecting the sum
    (what ``MimiSplitResidualVectorQuantizer.decode`` does); one gather + sum replaces 16 lookups.
    """
    n_sem = quantizer.num_semantic_quantizers
    tables = []
    for k in range(num_codebooks):
        rvq, j = (
            (quantizer.semantic_residual_vector_quantizer, k)
            if k < n_sem
            else (quantizer.acoustic_residual_vector_quantizer, k - n_sem)
        )
        emb = rvq.layers[j].codebook.embed.float()
        if rvq.output_proj is not None:
            emb = emb @ rvq.output_proj.weight[:, :, 0].float().T
        tables.append(emb)
    return torch.stack(tables)


@contextlib.contextmanager
def strict_fp32(device: torch.device) -> Iterator[None]:
    """No TF32 in cuDNN convs or cuBLAS matmuls while the decoder runs (or is captured into a graph):
    the decoder is meant to be float32, and TF32 would move samples by ~1e-3."""
    if device.type != "cuda":
        yield
        return
    conv, mm = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = conv, mm


@dataclass
class _Op:
    kind: str  # "conv" | "convt" | "res" | "fn"
    module: Any
    state: int = -1  # index into the decoder's state list; -1 = stateless
    replicate: bool = False
    sub: list[_Op] | None = None
    shortcut: _Op | None = None


@dataclass
class FusedMimiLayer:
    """A ``MimiTransformerLayer`` regrouped for decode: one QKV GEMM, layer scales fused into the residual
    adds (``addcmul``)."""

    ln1: Any
    ln2: Any
    w_qkv: torch.Tensor
    b_qkv: torch.Tensor | None
    o_proj: nn.Linear
    ls1: torch.Tensor
    ls2: torch.Tensor
    mlp: Any
    heads: int
    kv_heads: int
    head_dim: int
    scale: float

    @classmethod
    def of(cls, layer: Any) -> FusedMimiLayer:
        att = layer.self_attn
        w_qkv, b_qkv = fuse_linears(att.q_proj, att.k_proj, att.v_proj)
        with torch.no_grad():
            return cls(
                ln1=layer.input_layernorm,
                ln2=layer.post_attention_layernorm,
                w_qkv=w_qkv,
                b_qkv=b_qkv,
                o_proj=att.o_proj,
                ls1=layer.self_attn_layer_scale.scale,
                ls2=layer.mlp_layer_scale.scale,
                mlp=layer.mlp,
                heads=att.num_heads,
                kv_heads=att.num_key_value_heads,
                head_dim=att.head_dim,
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
        qk, v = qkv_heads(self.ln1(x), self.w_qkv, self.b_qkv, self.heads, self.kv_heads)
        qk = apply_rope(qk, cos, sin)
        write(qk[:, :, self.heads :].transpose(1, 2), v.transpose(1, 2))
        o = attend(qk[:, :, : self.heads], keys, values, mask_add, self.scale)
        x = torch.addcmul(x, self.o_proj(o), self.ls1)
        return torch.addcmul(x, self.mlp(self.ln2(x)), self.ls2)


class StreamingMimiDecoder:
    def __init__(self, mimi: Any, slots: int, num_codebooks: int) -> None:
        from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiConvTranspose1d, MimiResnetBlock

        self._types = (MimiConv1d, MimiConvTranspose1d, MimiResnetBlock)
        cfg = mimi.config
        if not cfg.use_causal_conv:
            raise ValueError("streaming decode needs a causal Mimi (use_causal_conv=True)")
        if num_codebooks > cfg.num_quantizers:
            raise ValueError(f"{num_codebooks} codebooks > the codec's {cfg.num_quantizers} quantizers")
        self.mimi = mimi
        self.slots = slots
        self.num_codebooks = num_codebooks
        self.codebook_size = cfg.codebook_size
        dev = next(mimi.parameters()).device
        self.device = dev
        self.upsample, self.transformer, seanet = mimi_decoder_parts(mimi)
        with torch.no_grad():
            tables = codebook_tables(mimi.quantizer, num_codebooks)
        self.table = tables.reshape(-1, tables.shape[-1]).contiguous()  # (K*N, hidden)
        self.offsets = torch.arange(num_codebooks, device=dev) * self.codebook_size
        self.states: list[torch.Tensor] = []
        self.up_op = self._compile(self.upsample) if self.upsample is not None else None
        self.ops = [self._compile(layer) for layer in seanet.layers]
        self.positions_per_frame = self.upsample.conv.stride[0] if self.upsample is not None else 1
        self.hop = self.positions_per_frame * math.prod(cfg.upsampling_ratios)
        # decoder transformer: ring K/V with absolute positions per column
        tcfg = self.transformer.config
        self.window = int(tcfg.sliding_window) if tcfg.sliding_window else 1 << 30
        if self.window >= 1 << 30:
            raise ValueError("streaming decode needs a sliding-window decoder transformer")
        self.ring = self.window + self.positions_per_frame
        self.layers = [FusedMimiLayer.of(layer) for layer in self.transformer.layers]
        self.k_ring: list[torch.Tensor] = []
        self.v_ring: list[torch.Tensor] = []
        for layer in self.transformer.layers:
            att = layer.self_attn
            shape = (slots, att.num_key_value_heads, self.ring + 1, att.head_dim)  # +1 scratch column
            self.k_ring.append(torch.zeros(shape, device=dev))
            self.v_ring.append(torch.zeros(shape, device=dev))
        self.kpos = torch.full((slots, self.ring + 1), -1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(slots, dtype=torch.long, device=dev)
        rot = self.transformer.rotary_emb
        self.inv_freq = rot.inv_freq.detach().float().clone()
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        self.frame_offsets = torch.arange(self.positions_per_frame, device=dev)
        self.audio_out = torch.zeros(slots, self.hop, device=dev)

    # -- plan ----------------------------------------------------------------------------------------------
    def _new_state(self, channels: int, length: int) -> int:
        self.states.append(torch.zeros(self.slots, channels, length, device=self.device))
        return len(self.states) - 1

    def _compile(self, layer: nn.Module) -> _Op:
        conv1d, convt, resblock = self._types
        if isinstance(layer, conv1d):
            c = layer.conv
            if c.stride[0] != 1 or c.padding[0] != 0:
                raise NotImplementedError("streaming decode supports stride-1, unpadded decoder convs only")
            ctx = (c.kernel_size[0] - 1) * c.dilation[0]
            if layer.pad_mode not in ("constant", "replicate"):
                raise NotImplementedError(f"pad_mode {layer.pad_mode!r} cannot stream")
            state = self._new_state(c.in_channels, ctx) if ctx > 0 else -1
            return _Op("conv", layer, state, replicate=layer.pad_mode == "replicate")
        if isinstance(layer, convt):
            c = layer.conv
            k, s = c.kernel_size[0], c.stride[0]
            if layer.padding_left != 0 or layer.padding_right != k - s or c.padding[0] != 0:
                raise NotImplementedError("streaming decode needs trim_right_ratio == 1 transposed convs")
            state = self._new_state(c.out_channels, k - s) if k > s else -1
            return _Op("convt", layer, state)
        if isinstance(layer, resblock):
            sub = [self._compile(m) for m in layer.block]
            short = self._compile(layer.shortcut) if isinstance(layer.shortcut, conv1d) else None
            return _Op("res", layer, sub=sub, shortcut=short)
        return _Op("fn", layer)

    # -- slots ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def reset(self, slots: torch.Tensor) -> None:
        """Fresh streams in ``slots`` (a device index tensor): one kernel per state tensor, any count."""
        for st in self.states:
            st.index_fill_(0, slots, 0.0)
        self.kpos.index_fill_(0, slots, -1)
        self.pos.index_fill_(0, slots, 0)

    # -- the step ------------------------------------------------------------------------------------------
    def _run(self, op: _Op, x: torch.Tensor, b: int, act: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
        if op.kind == "fn":
            return op.module(x)
        if op.kind == "res":
            assert op.sub is not None
            y = x
            for s in op.sub:
                y = self._run(s, y, b, act, fresh)
            res = self._run(op.shortcut, x, b, act, fresh) if op.shortcut is not None else x
            return res + y
        conv = op.module.conv
        if op.kind == "conv":
            if op.state < 0:
                return conv(x)
            st = self.states[op.state][:b]
            ctx = torch.where(fresh, x[..., :1].expand_as(st), st) if op.replicate else st
            full = torch.cat([ctx, x], dim=-1)
            st.copy_(torch.where(act, full[..., -st.shape[-1] :], st))
            return conv(full)
        # transposed conv: add the previous frames' overlap, emit n*stride samples, keep the new tail
        s = conv.stride[0]
        n = x.shape[-1]
        y = F.conv_transpose1d(x, conv.weight, None, s, 0, 0, conv.groups)
        if op.state >= 0:
            ov = self.states[op.state][:b]
            keep = ov.shape[-1]
            y = torch.cat([y[..., :keep] + ov, y[..., keep:]], dim=-1)
            ov.copy_(torch.where(act, y[..., n * s :], ov))
        out = y[..., : n * s]
        if conv.bias is not None:
            out = out + conv.bias[None, :, None]
        return out

    def _transformer(self, x: torch.Tensor, b: int, active: torch.Tensor) -> torch.Tensor:
        """Decoder transformer over this frame's positions ``x (b, S, hidden)`` with the ring K/V."""
        s = x.shape[1]
        qpos = self.pos[:b, None] + self.frame_offsets[None, :s]  # (b, S)
        cols = torch.where(active[:, None], qpos % self.ring, self.ring)
        kpos = self.kpos[:b]
        kpos.scatter_(1, cols, qpos)
        kp = kpos[:, None, : self.ring]  # (b, 1, R)
        q = qpos[:, :, None]
        mask = (kp >= 0) & (kp <= q) & (kp > q - self.window)
        mask = mask | ~active[:, None, None]  # inactive rows attend to anything: finite, ignored
        l0 = self.layers[0]
        mask_add = additive_mask(mask, l0.kv_heads, l0.heads // l0.kv_heads, x.dtype)
        cos, sin = rope_cos_sin(qpos, self.inv_freq, self.rope_scale, x.dtype)
        cos, sin = cos[:, :, None], sin[:, :, None]  # (b, S, 1, D): broadcast over heads
        for i, layer in enumerate(self.layers):
            kr, vr = self.k_ring[i][:b], self.v_ring[i][:b]
            idx = cols[:, None, :, None].expand(b, kr.shape[1], s, kr.shape[3])

            def write(
                k: torch.Tensor,
                v: torch.Tensor,
                kr: torch.Tensor = kr,
                vr: torch.Tensor = vr,
                idx: torch.Tensor = idx,
            ) -> None:
                kr.scatter_(2, idx, k)
                vr.scatter_(2, idx, v)

            x = layer(x, cos, sin, write, kr[:, :, : self.ring], vr[:, :, : self.ring], mask_add)
        return x

    def step(self, b: int, codes: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """Decode one frame for slots ``[0, b)``: codes ``(b, K)`` -> audio ``(b, hop)`` float32.

        Inactive rows' codes are ignored (their output is garbage); ids outside the codebook (a talker
        special such as EOS) are clamped so the gather stays in range.
        """
        with strict_fp32(self.device):
            return self._step(b, codes, active)

    def _step(self, b: int, codes: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        act = active[:, None, None]
        fresh = (self.pos[:b] == 0)[:, None, None]
        idx = codes[:, : self.num_codebooks].clamp(0, self.codebook_size - 1) + self.offsets
        x = self.table[idx].sum(dim=1)[:, :, None]  # (b, hidden, 1)
        if self.up_op is not None:
            x = self._run(self.up_op, x, b, act, fresh)
        x = self._transformer(x.transpose(1, 2), b, active).transpose(1, 2)
        for op in self.ops:
            x = self._run(op, x, b, act, fresh)
        self.pos[:b].add_(active.long() * self.positions_per_frame)
        audio = x[:, 0]
        self.audio_out[:b] = audio
        return audio
