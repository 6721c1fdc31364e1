"""Kyutai STT on the shared slot engine (``streaming/slot_engine.py``): one step = one 80 ms frame for every slot.

The frame runs the other way round from the TTS stages: PCM in, text tokens out. ``SlotEngine`` keeps
its roles: its ``decoder`` (the per-frame audio part, ``hop`` = 1920) is here the streaming Mimi
*encoder*, its ``talker`` the text LM; it only resets both and owns slots, buckets and graphs. Batch
buckets cover slots ``[0, B)``; length buckets bound the LM's ring columns read (``min(positions,
window)``). On CUDA each (batch, length) bucket is one CUDA graph for the whole frame (encoder + LM +
argmax); the only host sync per step is the copy of tokens and codes back.

``exchange`` (``MovableSlotEngine``'s) swaps whole slots (every tensor of ``slot_tensors``: the encoder's and the
LM's per-slot rows, and the host frame count): the backend's catch-up moves an ending stream into the low
slots, whose steps run at a small batch bucket. A stream's arithmetic does not depend on its row, so a
moved stream continues unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from realtime_gw.models.speech.kyutai.decoder import KyutaiLmRuntime
from realtime_gw.models.speech.kyutai.encoder import StreamingMimiEncoder
from realtime_gw.models.speech.streaming.slot_engine import MovableSlotEngine

PCM_SCALE = 1.0 / 32768.0


class KyutaiAsrEngine(MovableSlotEngine):
    """Fixed slots; ``step(slots, pcm)`` encodes one frame per slot and returns its next text token."""

    name = "asr-kyutai"

    def __init__(self, model: Any, slots: int, *, cuda_graphs: bool | None = None) -> None:
        lm = KyutaiLmRuntime(model, slots)
        encoder = StreamingMimiEncoder(model.codec_model, slots, lm.num_codebooks)
        self.lm = lm
        self.encoder = encoder
        super().__init__(
            lm,
            encoder,
            slots,
            max_positions=lm.ring,  # length buckets: LM ring columns read per step
            num_codebooks=lm.num_codebooks,
            device=lm.device,
            cuda_graphs=cuda_graphs,
        )

    @property
    def bos_token(self) -> int:
        """The token every stream starts with (predicted at position 0, before any audio)."""
        return self.lm.bos_token

    def _frame(self, b: int, length: int) -> None:
        active = self.d_active[:b]
        pcm = self.d_pcm[:b].float() * PCM_SCALE
        codes = self.encoder.step(b, pcm, active)
        self.d_tok[:b] = self.lm.step(b, length, codes, active)
        self.d_codes[:b] = codes

    def slot_tensors(self) -> list[torch.Tensor]:
        """Every tensor holding per-slot state (first dim = slot): what a slot *is* between steps."""
        lm, enc = self.lm, self.encoder
        return [
            *lm.k_ring, *lm.v_ring, lm.kpos, lm.pos, lm.last_tok,
            *enc.states.tensors, *enc.ring.slot_tensors(),
        ]  # fmt: skip

    @torch.no_grad()
    def step(  # type: ignore[override]  # the ASR frame: PCM in, tokens out
        self, slots: Sequence[int], pcm: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """One frame for each slot: PCM16 ``(n, 1920)`` -> (text tokens ``(n,)``, codes ``(n, K)``)."""
        n = len(slots)
        if not n:
            return np.zeros(0, np.int64), np.zeros((0, self.num_codebooks), np.int64)
        if pcm.shape != (n, self.hop):
            raise ValueError(f"expected PCM of shape {(n, self.hop)}, got {pcm.shape}")

        def stage(idx: torch.Tensor) -> None:  # copies only a read-only array
            self.h_pcm[idx] = torch.from_numpy(np.require(pcm, np.int16, ["C", "W"]))

        # LM position p is written at column p % window; before the ring wraps, [0, p] is all there is
        idx = self._lockstep(
            slots, 2, stage, uploads=[(self.d_pcm, self.h_pcm)], downloads=[(self.h_tok, self.d_tok), (self.h_codes, self.d_codes)]
        )
        return self.h_tok[idx].numpy(), self.h_codes[idx].numpy()
