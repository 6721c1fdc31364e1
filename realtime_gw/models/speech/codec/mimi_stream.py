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

import math
from typing import Any

import torch
from torch import nn

from realtime_gw.models.speech.streaming.layers import (
    ConvOp,
    ConvProgram,
    FusedScaledLayer,
    RingTransformer,
    SlotStates,
    strict_fp32,
    transposed_conv_step,
)

FusedMimiLayer = FusedScaledLayer
"""A ``MimiTransformerLayer`` regrouped for decode (the shared ``FusedScaledLayer``)."""
__all__ = ["FusedMimiLayer", "StreamingMimiDecoder", "codebook_tables", "mimi_decoder_parts", "strict_fp32"]


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


class StreamingMimiDecoder(ConvProgram):
    def __init__(self, mimi: Any, slots: int, num_codebooks: int) -> None:
        from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiConvTranspose1d, MimiResnetBlock

        self.conv_type, self.residual_type = MimiConv1d, MimiResnetBlock
        self.transposed_type = MimiConvTranspose1d
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
        self.states = SlotStates(slots, dev)
        self.up_op = self.compile(self.upsample) if self.upsample is not None else None
        self.ops = [self.compile(layer) for layer in seanet.layers]
        self.positions_per_frame = self.upsample.conv.stride[0] if self.upsample is not None else 1
        self.hop = self.positions_per_frame * math.prod(cfg.upsampling_ratios)
        # decoder transformer: ring K/V with absolute positions per column
        tcfg = self.transformer.config
        window = int(tcfg.sliding_window) if tcfg.sliding_window else 0
        if not window:
            raise ValueError("streaming decode needs a sliding-window decoder transformer")
        rot = self.transformer.rotary_emb
        self.ring = RingTransformer(
            [FusedScaledLayer.of(layer) for layer in self.transformer.layers],
            slots,
            window,
            self.positions_per_frame,
            rot.inv_freq,
            float(getattr(rot, "attention_scaling", 1.0)),
            dev,
        )
        self.audio_out = torch.zeros(slots, self.hop, device=dev)

    # -- plan ----------------------------------------------------------------------------------------------
    def conv_context(self, layer: Any) -> int:
        c = layer.conv
        if c.stride[0] != 1 or c.padding[0] != 0:
            raise NotImplementedError("streaming decode supports stride-1, unpadded decoder convs only")
        return (c.kernel_size[0] - 1) * c.dilation[0]

    def compile(self, layer: nn.Module) -> ConvOp:
        """The shared conv/residual/module ops plus ``"convt"``: a transposed conv with its overlap state."""
        if not isinstance(layer, self.transposed_type):
            return super().compile(layer)
        c = layer.conv
        k, s = c.kernel_size[0], c.stride[0]
        if layer.padding_left != 0 or layer.padding_right != k - s or c.padding[0] != 0:
            raise NotImplementedError("streaming decode needs trim_right_ratio == 1 transposed convs")
        state = self.states.new(c.out_channels, k - s) if k > s else -1
        return ConvOp("convt", layer, state)

    # -- the step ------------------------------------------------------------------------------------------
    def run(
        self, op: ConvOp, x: torch.Tensor, b: int, act: torch.Tensor, fresh: torch.Tensor
    ) -> torch.Tensor:
        if op.kind == "convt":
            return transposed_conv_step(op.module.conv, x, self.state_of(op, b), act)
        return super().run(op, x, b, act, fresh)

    def step(self, b: int, codes: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """Decode one frame for slots ``[0, b)``: codes ``(b, K)`` -> audio ``(b, hop)`` float32.

        Inactive rows' codes are ignored (their output is garbage); ids outside the codebook (a talker
        special such as EOS) are clamped so the gather stays in range.
        """
        with strict_fp32(self.device):
            return self._step(b, codes, active)

    def _step(self, b: int, codes: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        act = active[:, None, None]
        fresh = (self.ring.pos[:b] == 0)[:, None, None]
        idx = codes[:, : self.num_codebooks].clamp(0, self.codebook_size - 1) + self.offsets
        x = self.table[idx].sum(dim=1)[:, :, None]  # (b, hidden, 1)
        if self.up_op is not None:
            x = self.run(self.up_op, x, b, act, fresh)
        x = self.ring(x.transpose(1, 2), b, active).transpose(1, 2)
        for op in self.ops:
            x = self.run(op, x, b, act, fresh)
        audio = x[:, 0]
        self.audio_out[:b] = audio
        return audio
