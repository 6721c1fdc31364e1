"""Streaming Mimi encoder: one frame of 1920 samples (80 ms at 24 kHz) -> one frame of codes, many slots.

Built on a transformers ``MimiModel``'s modules and weights. Per slot it holds the left context of every
causal ``MimiConv1d`` (``padding_total`` = effective kernel - stride samples, so strided convs stream too),
the ring K/V of the encoder transformer (``sliding_window + 2`` positions: the transformer runs at 25 Hz,
two positions per frame) and the replicate-padded downsampling conv's context. The quantizer is the split
RVQ as a batched nearest-neighbour search. Frame by frame this equals ``MimiModel.encode`` of the whole
utterance (causal convs, sliding-window mask), which the tests check. Always float32, like the reference's
codec (``_keep_in_fp32_modules_strict``).

As everywhere in the slot engine, a step covers slots ``[0, b)`` with an ``active`` mask: inactive rows
keep their state and their codes are garbage.
"""

from __future__ import annotations

from typing import Any

import torch

from realtime_gw.models.speech.streaming.layers import (
    ConvProgram,
    FusedScaledLayer,
    RingTransformer,
    SlotStates,
    strict_fp32,
)

POSITIONS_PER_FRAME = 2
"""Encoder-transformer positions per 80 ms frame (SEANet hop 960 samples; the downsampling conv halves it)."""


def mimi_encoder_parts(mimi: Any) -> tuple[Any, Any, Any]:
    """(SEANet encoder, encoder transformer, downsampling conv) across transformers versions.

    transformers >= 5.2x nests them in ``MimiModel.encoder`` (a ``MimiEncoderModel``); 5.17 keeps them on
    the model (``encoder``, ``encoder_transformer``, ``downsample``)."""
    enc = mimi.encoder
    if hasattr(enc, "encoder_seanet"):
        return enc.encoder_seanet, enc.encoder_transformer, enc.downsample
    return mimi.encoder, mimi.encoder_transformer, mimi.downsample


class StreamingMimiEncoder(ConvProgram):
    """``step(b, pcm, active)``: PCM ``(b, 1920)`` float in [-1, 1) -> codes ``(b, K)`` for slots ``[0, b)``."""

    def __init__(self, mimi: Any, slots: int, num_codebooks: int) -> None:
        from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiResnetBlock

        self.conv_type, self.residual_type = MimiConv1d, MimiResnetBlock
        cfg = mimi.config
        if not cfg.use_causal_conv:
            raise ValueError("streaming encode needs a causal Mimi (use_causal_conv=True)")
        if num_codebooks > cfg.num_quantizers:
            raise ValueError(f"{num_codebooks} codebooks > the codec's {cfg.num_quantizers} quantizers")
        if cfg.frame_size != 1920:
            raise ValueError(
                f"codec frames are {cfg.frame_size} samples; the gateway needs 1920 (80 ms at 24 kHz)"
            )
        self.hop = cfg.frame_size
        self.slots = slots
        self.num_codebooks = num_codebooks
        dev = next(mimi.parameters()).device
        self.device = dev
        seanet, transformer, downsample = mimi_encoder_parts(mimi)
        self.states = SlotStates(slots, dev)
        self.ops = [self.compile(layer) for layer in seanet.layers]
        self.down = self.compile(downsample)
        window = int(transformer.config.sliding_window or 0)
        if not window:
            raise ValueError("streaming encode needs a sliding-window encoder transformer")
        rot = transformer.rotary_emb
        self.ring = RingTransformer(
            [FusedScaledLayer.of(layer) for layer in transformer.layers],
            slots,
            window,
            POSITIONS_PER_FRAME,
            rot.inv_freq,
            float(getattr(rot, "attention_scaling", 1.0)),
            dev,
        )
        self._quantizer_tables(mimi.quantizer)

    # -- plan ----------------------------------------------------------------------------------------------
    def conv_context(self, layer: Any) -> int:
        if layer.conv.padding[0] != 0:
            raise NotImplementedError("streaming encode supports unpadded encoder convs only")
        # effective kernel - stride: the left context of the next frame (0 = none, kernel == stride)
        return int(layer.padding_total)

    @torch.no_grad()
    def _quantizer_tables(self, quantizer: Any) -> None:
        """Input projections as matrices and every codebook's entries with their squared norms: the
        nearest entry is ``argmin(|e|^2 - 2 x.e)`` (``|x|^2`` is the same for every entry)."""
        n_sem = quantizer.num_semantic_quantizers
        self.n_semantic = n_sem
        rvqs = (quantizer.semantic_residual_vector_quantizer, quantizer.acoustic_residual_vector_quantizer)
        self.proj = [r.input_proj.weight[:, :, 0].float() if r.input_proj is not None else None for r in rvqs]
        tables = []
        for k in range(self.num_codebooks):
            rvq, j = (rvqs[0], k) if k < n_sem else (rvqs[1], k - n_sem)
            tables.append(rvq.layers[j].codebook.embed.float())
        self.embed = torch.stack(tables).contiguous()  # (K, N, D)
        self.embed_sq = (self.embed * self.embed).sum(-1)  # (K, N)

    # -- the step ------------------------------------------------------------------------------------------
    def _quantize(self, latent: torch.Tensor) -> torch.Tensor:
        """Split RVQ of ``latent (b, hidden)``: the semantic and the acoustic RVQ both start from the latent."""
        codes = []
        for group, (lo, hi) in enumerate(((0, self.n_semantic), (self.n_semantic, self.num_codebooks))):
            w = self.proj[group]
            residual = latent @ w.T if w is not None else latent
            for k in range(lo, hi):
                emb = self.embed[k]
                idx = torch.addmm(self.embed_sq[k][None], residual, emb.T, alpha=-2.0).argmin(dim=-1)
                codes.append(idx)
                if k + 1 < hi:
                    residual = residual - emb[idx]
        return torch.stack(codes, dim=1)

    def step(self, b: int, pcm: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        with strict_fp32(self.device):
            act = active[:, None, None]
            fresh = (self.ring.pos[:b] == 0)[:, None, None]
            x = pcm[:, None, :]
            for op in self.ops:
                x = self.run(op, x, b, act, fresh)
            x = self.ring(x.transpose(1, 2), b, active).transpose(1, 2)
            x = self.run(self.down, x, b, act, fresh)  # (b, hidden, 1)
            return self._quantize(x[:, :, 0])
