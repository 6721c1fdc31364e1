"""The Qwen3-TTS 12 Hz codec decoder, streaming: one 80 ms frame (1920 samples) per step for many slots.

Architecture (``decoder.*`` of ``speech_tokenizer/model.safetensors``): split RVQ (1 semantic + 15
acoustic codebooks, each through its RVQ's 1x1 output projection) -> causal pre-conv (k=3) -> input
projection -> 8-layer causal transformer with a 72-frame sliding window (RoPE, layer scales) -> output
projection -> two x2 causal transposed convs, each followed by a ConvNeXt block (causal depthwise k=7) ->
causal conv (k=7) -> four BigVGAN/DAC-style blocks (SnakeBeta, causal transposed conv 2r/r for rates
8,5,4,3, three residual units with dilations 1,3,9) -> SnakeBeta -> causal conv (k=7) -> clamp [-1, 1].

Streaming state per slot (``streaming/layers.py``, shared with the Mimi decoder): the left context of every
causal conv, the ``k - stride`` overlap of every transposed conv, and the transformer's ring K/V over the
last 72 frames. Each frame is decoded once; the result equals the reference decoder's full-utterance
forward, which the tests check against the ``qwen-tts`` package's output.

Precision (``DECODER_PRECISIONS``): ``fp32`` is strict float32 (the parity tests' mode, the CPU default);
``tf32`` lets cuDNN/cuBLAS use TF32 (float32 storage); ``bf16`` runs the convolutional stack after the
transformer (upsamples, ConvNeXt, SnakeBeta blocks: nearly all of the FLOPs) with bfloat16 weights,
activations and conv states, SnakeBeta computed in float32 inside; codebook tables, pre-conv and the
transformer stay float32. ``fuse_snake`` compiles SnakeBeta (``x + 1/b * sin(a x)^2``, float32 math,
one kernel instead of four) with ``torch.compile`` on CUDA; elsewhere it runs as the plain expression.
The GPU benchmark reports each mode's max abs waveform difference from ``fp32``.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import torch.nn.functional as F

from realtime_gw.models.speech.qwen3.modules import (
    CausalConv,
    CausalConvT,
    CodecDecoder,
    ConvNeXt,
    SnakeBeta,
    _Quantizer,
)
from realtime_gw.models.speech.streaming.layers import (
    FusedScaledLayer,
    RingTransformer,
    SlotStates,
    causal_conv_step,
    fp32_mode,
    transposed_conv_step,
)


# -- streaming ------------------------------------------------------------------------------------------------
def _inv_freq(theta: float, dim: int, device: torch.device) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))


DECODER_PRECISIONS = ("fp32", "tf32", "bf16")


def snake_beta(x: torch.Tensor, alpha_exp: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
    """SnakeBeta ``x + 1/b * sin(a x)^2`` in float32 math, returned in ``x``'s dtype (for float32 input the
    casts are no-ops: the same kernels as the reference's expression)."""
    xf = x.float()
    return torch.addcmul(xf, inv_beta, torch.sin(xf * alpha_exp).pow(2)).to(x.dtype)


_compiled_snake: Any = None


def fused_snake_beta() -> Any:
    """``snake_beta`` as one generated kernel (``torch.compile``, dynamic shapes: one compile covers every
    batch bucket and block); built on first use."""
    global _compiled_snake
    if _compiled_snake is None:
        _compiled_snake = torch.compile(snake_beta, dynamic=True, fullgraph=True)
    return _compiled_snake


class StreamingQwen3Decoder:
    """Decodes one frame per step for slots ``[0, B)`` (``step``), with per-slot state (``reset``)."""

    def __init__(
        self, decoder: CodecDecoder, slots: int, precision: str = "fp32", fuse_snake: bool = False
    ) -> None:
        if precision not in DECODER_PRECISIONS:
            raise ValueError(
                f"decoder precision {precision!r}; expected one of {', '.join(DECODER_PRECISIONS)}"
            )
        c = decoder.config
        dev = next(decoder.parameters()).device
        self.device = dev
        self.slots = slots
        self.num_codebooks = c["num_quantizers"]
        self.codebook_size = c["codebook_size"]
        self.hop = math.prod(c["upsample_rates"]) * math.prod(c["upsampling_ratios"])
        self.d = decoder
        self.precision = precision
        self.dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        # the conv stack after the transformer, in the stack's dtype (a bf16 copy; fp32/tf32 share the weights)
        self.upsample: Any = decoder.upsample
        self.blocks: Any = decoder.decoder
        if self.dtype != torch.float32:
            self.upsample = copy.deepcopy(decoder.upsample).to(self.dtype)
            self.blocks = copy.deepcopy(decoder.decoder).to(self.dtype)
        self.snake = fused_snake_beta() if fuse_snake and dev.type == "cuda" else snake_beta
        with torch.no_grad():
            self.table = self._tables(decoder.quantizer).reshape(-1, c["codebook_dim"]).contiguous()
        self.offsets = torch.arange(self.num_codebooks, device=dev) * self.codebook_size
        self.states = SlotStates(slots, dev)
        tr = decoder.pre_transformer
        head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        self.ring = RingTransformer(
            [FusedScaledLayer.of(layer) for layer in tr.layers],
            slots,
            int(c["sliding_window"]),
            1,
            _inv_freq(float(c.get("rope_theta", 10000)), head_dim, dev),
            1.0,
            dev,
        )
        self.audio_out = torch.zeros(slots, self.hop, device=dev)
        # plan: (kind, module, state index) in order; "snake" entries carry (exp(alpha), 1/(exp(beta)+eps))
        self.ctx: dict[int, int] = {}
        stack = [*self.upsample.modules(), *self.blocks.modules()]
        for m, dt in [(decoder.pre_conv, torch.float32), *((m, self.dtype) for m in stack)]:
            if isinstance(m, CausalConv):
                c1 = m.conv
                ctx = (c1.kernel_size[0] - 1) * c1.dilation[0]
                if ctx:
                    self.ctx[id(m)] = self.states.new(c1.in_channels, ctx, dt)
            elif isinstance(m, CausalConvT):
                c2 = m.conv
                k, s = c2.kernel_size[0], c2.stride[0]
                if k > s:
                    self.ctx[id(m)] = self.states.new(c2.out_channels, k - s, dt)
        self.snakes: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        with torch.no_grad():  # float32 tables whatever the stack's dtype: SnakeBeta's math stays float32
            for m in stack:
                if isinstance(m, SnakeBeta):
                    a, beta = m.alpha.float(), m.beta.float()
                    self.snakes[id(m)] = (a.exp()[None, :, None], 1.0 / (beta.exp()[None, :, None] + 1e-9))

    @staticmethod
    def _tables(q: _Quantizer) -> torch.Tensor:
        """``(K, codebook_size, codebook_dim)``: codebook entries through their RVQ's output projection
        (linear, bias-free: summing projected entries = projecting the sum, as the reference does)."""
        out = []
        for rvq in (q.rvq_first, q.rvq_rest):
            w = rvq.output_proj.weight[:, :, 0].float()
            for layer in rvq.vq.layers:
                cb = layer._codebook
                emb = cb.embedding_sum.float() / cb.cluster_usage.float().clamp(min=1e-5)[:, None]
                out.append(emb @ w.T)
        return torch.stack(out)

    @torch.no_grad()
    def reset(self, slots: torch.Tensor) -> None:
        self.states.reset(slots)
        self.ring.reset(slots)

    def _slot_tensors(self) -> list[torch.Tensor]:
        """Every per-slot state tensor (slot first): conv contexts, ring K/V, their positions."""
        return [*self.states.tensors, *self.ring.slot_tensors()]

    @torch.no_grad()
    def export_slot(self, slot: int) -> list[torch.Tensor]:
        """A copy of one slot's whole state (e.g. after decoding a recording's codes in it)."""
        return [t[slot].clone() for t in self._slot_tensors()]

    @torch.no_grad()
    def load_slot(self, slots: torch.Tensor, saved: list[torch.Tensor]) -> None:
        """Put ``export_slot``'s state into ``slots``: they decode on as that slot would have."""
        n = slots.shape[0]
        for t, v in zip(self._slot_tensors(), saved, strict=True):
            t.index_copy_(0, slots, v.unsqueeze(0).expand(n, *v.shape).contiguous())

    # -- pieces ----------------------------------------------------------------------------------------------
    def _snake(self, m: SnakeBeta, x: torch.Tensor) -> torch.Tensor:
        a, inv_b = self.snakes[id(m)]
        return self.snake(x, a, inv_b)

    def _conv(self, m: CausalConv, x: torch.Tensor, b: int, act: torch.Tensor) -> torch.Tensor:
        i = self.ctx.get(id(m))
        return causal_conv_step(m.conv, x, self.states[i][:b] if i is not None else None, act)

    def _convt(self, m: CausalConvT, x: torch.Tensor, b: int, act: torch.Tensor) -> torch.Tensor:
        i = self.ctx.get(id(m))
        return transposed_conv_step(m.conv, x, self.states[i][:b] if i is not None else None, act)

    def _convnext(self, m: ConvNeXt, x: torch.Tensor, b: int, act: torch.Tensor) -> torch.Tensor:
        h = self._conv(m.dwconv, x, b, act).transpose(1, 2)
        h = m.pwconv2(F.gelu(m.pwconv1(m.norm(h))))
        return x + (m.gamma * h).transpose(1, 2)

    # -- the step ----------------------------------------------------------------------------------------------
    def step(self, b: int, codes: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """Codes ``(b, K)`` -> audio ``(b, hop)`` float32 for slots ``[0, b)``; inactive rows keep their
        state (their output is garbage); ids outside the codebook are clamped so the gather stays in range."""
        with fp32_mode(self.device, self.precision != "fp32", cudnn_benchmark=True):
            return self._step(b, codes, active)

    def _step(self, b: int, codes: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        d = self.d
        act = active[:, None, None]
        idx = codes[:, : self.num_codebooks].clamp(0, self.codebook_size - 1) + self.offsets
        x = self.table[idx].sum(dim=1)[:, :, None]  # (b, codebook_dim, 1)
        x = self._conv(d.pre_conv, x, b, act)
        tr = d.pre_transformer
        h = tr.input_proj(x.transpose(1, 2))
        h = self.ring(h, b, active)
        x = tr.output_proj(tr.norm(h)).transpose(1, 2).to(self.dtype)
        for up, block in self.upsample:
            x = self._convnext(block, self._convt(up, x, b, act), b, act)
        blocks = list(self.blocks)
        x = self._conv(blocks[0], x, b, act)
        for blk in blocks[1:-2]:
            snake, convt, *units = blk.block
            x = self._convt(convt, self._snake(snake, x), b, act)
            for u in units:
                y = self._conv(u.conv1, self._snake(u.act1, x), b, act)
                x = x + self._conv(u.conv2, self._snake(u.act2, y), b, act)
        x = self._conv(blocks[-1], self._snake(blocks[-2], x), b, act)
        audio = x[:, 0].float().clamp(-1.0, 1.0)
        self.audio_out[:b] = audio
        return audio
