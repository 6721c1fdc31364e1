"""Moshi on the shared slot engine (``streaming/slot_engine.py``): one step = one 80 ms frame, every slot.

The frame: the user's PCM through the streaming Mimi encoder (``kyutai/encoder.py``, 8 codebooks), the
LM step (``lm.py``: temporal transformer + depformer + sampling), the model's frame through the streaming
Mimi decoder (``codec/mimi_stream.py``), float -> PCM16. ``SlotEngine`` keeps its roles: its ``talker``
is the LM, its ``decoder`` the Mimi decoder; it owns the slots, the batch buckets (slots ``[0, B)``), the
length buckets (ring columns read: ``min(steps + 1, context + 1)``) and one CUDA graph per (batch,
length) bucket for the whole frame; the only host sync per step is the copy of tokens and PCM back.

Batch buckets: powers of two up to 32, then four per doubling (40, 48, 56, 64, 80, ...: ``kernels.fine_buckets``),
or the ones ``s2s_batch_buckets`` names. At a full context the step's time grows with the batch (every row
reads its 3000-frame ring), and a padded row costs as much as a live one: with powers of two, 48
conversations would run as 64. Each batch bucket is one graph per length bucket (7 at the 3000-frame
context), captured at warm-up into one shared memory pool: 64 slots take 10 x 7 = 70 graphs instead of 7 x 7 = 49.

A slot's first step has no complete frame yet (the model's acoustic delay): its PCM is silence and its
text the padding id. PersonaPlex (``user_lead = 1``) opens a slot with its prompt (``prompt.py``): the
slot is reset and prefilled at once, so its first step already continues the prompt. While a slot is silent (``S2sSilence``) its PCM is zeros (the decoder still runs
on the silence codes, so it goes on smoothly when released).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from realtime_gw.models.kernels import chosen_buckets, fine_buckets
from realtime_gw.models.s2s.config import SAMPLE_RATE, MoshiShape
from realtime_gw.models.s2s.lm import MoshiLmRuntime
from realtime_gw.models.s2s.prompt import SINE_AMPLITUDE, SINE_HZ, VoiceEmbeddings, prefill
from realtime_gw.models.s2s.sampling import Sampler
from realtime_gw.models.speech.codec.mimi_stream import StreamingMimiDecoder
from realtime_gw.models.speech.kyutai.encoder import StreamingMimiEncoder
from realtime_gw.models.speech.streaming.slot_engine import MovableSlotEngine

PCM_SCALE = 1.0 / 32768.0
SILENCE_WARMUP_FRAMES = 4
"""Frames of zeros encoded to find the codec's steady silence codes."""


class MoshiEngine(MovableSlotEngine):
    """Fixed slots; ``step(slots, pcm, silent)`` runs one frame for each and returns what it said."""

    name = "s2s-moshi"

    def __init__(
        self,
        weights: dict[str, torch.Tensor],
        mimi: Any,
        shape: MoshiShape,
        slots: int,
        *,
        text: Sampler,
        audio: Sampler,
        cuda_graphs: bool | None = None,
        user_lead: int = 0,
        kv_dtype: torch.dtype | None = None,
        batch_buckets: Sequence[int] = (),
    ) -> None:
        """``batch_buckets``: the batch sizes with a graph (up to ``slots``, which is always one); empty:
        ``fine_buckets``."""
        self.shape = shape
        self.lm = MoshiLmRuntime(weights, shape, slots, text, audio, user_lead, kv_dtype)
        self.encoder = StreamingMimiEncoder(mimi, slots, shape.own_q)
        decoder = StreamingMimiDecoder(mimi, slots, shape.own_q)
        super().__init__(
            self.lm, decoder, slots, max_positions=self.lm.columns, num_codebooks=shape.own_q + 1,
            device=self.lm.device, cuda_graphs=cuda_graphs,
        )  # fmt: skip
        self.batch_buckets = chosen_buckets(batch_buckets, slots) if batch_buckets else fine_buckets(slots)
        pin = self.device.type == "cuda"
        self.h_in = torch.zeros(slots, self.hop, dtype=torch.int16, pin_memory=pin)
        self.d_in = torch.zeros(slots, self.hop, dtype=torch.int16, device=self.device)
        self.h_silent = torch.zeros(slots, dtype=torch.bool, pin_memory=pin)
        self.d_silent = torch.zeros(slots, dtype=torch.bool, device=self.device)
        self.h_valid = torch.zeros(slots, dtype=torch.bool, pin_memory=pin)
        self.d_valid = torch.zeros(slots, dtype=torch.bool, device=self.device)
        self._seeds: dict[int, int] = {}
        self._mimi = mimi
        self._voice_encoder: StreamingMimiEncoder | None = None
        self.lm.silence_codes.copy_(self._steady_codes(torch.zeros(self.hop, device=self.device)))

    @torch.no_grad()
    def _steady_codes(self, frame: torch.Tensor) -> torch.Tensor:
        """The encoder's codes for ``frame`` repeated (steady state), through slot 0 (reset again before
        any stream)."""
        idx = torch.zeros(1, dtype=torch.long, device=self.device)
        self.encoder.reset(idx)
        active = torch.ones(1, dtype=torch.bool, device=self.device)
        codes = None
        for _ in range(SILENCE_WARMUP_FRAMES):
            codes = self.encoder.step(1, frame[None].float(), active)
        self.encoder.reset(idx)
        assert codes is not None
        return codes[0]

    @torch.no_grad()
    def sine_codes(self) -> torch.Tensor:
        """The codes of a frame of 440 Hz sine at amplitude 0.5 (``lm.create_sinewave``, one frame, as the
        reference encodes it for its constant ``SINE_TOKENS``): a prompt's user channel."""
        t = torch.arange(self.hop, device=self.device, dtype=torch.float64) / SAMPLE_RATE
        return self._steady_codes((SINE_AMPLITUDE * torch.sin(2 * torch.pi * SINE_HZ * t)).float())

    @torch.no_grad()
    def encode_voice(self, pcm: np.ndarray) -> np.ndarray:
        """Mimi codes ``(F, own_q)`` of float PCM at 24 kHz (a voice prompt's sample), one frame per 80 ms,
        the last zero-padded, encoded streaming through slot 0 (reset before and after): while no
        conversation holds a slot (the stage's start)."""
        if self.free_slots != self.slots:
            raise RuntimeError("voices are encoded while no conversation is open (slot 0's encoder)")
        frames = -(-len(pcm) // self.hop)
        padded = np.zeros(frames * self.hop, np.float32)
        padded[: len(pcm)] = pcm
        idx = torch.zeros(1, dtype=torch.long, device=self.device)
        active = torch.ones(1, dtype=torch.bool, device=self.device)
        self.encoder.reset(idx)
        x = torch.from_numpy(padded).to(self.device).view(frames, 1, self.hop)
        codes = [self.encoder.step(1, x[f], active)[0] for f in range(frames)]
        self.encoder.reset(idx)
        return torch.stack(codes).cpu().numpy().astype(np.int64)

    def voice_encoder(self) -> StreamingMimiEncoder:
        """A one-slot Mimi encoder of the voices' own (built at the first call, the stage's voice registrar's
        construction; it shares the codec): a voice
        registered while conversations hold the slots is encoded there, a few frames per step, with
        the codes slot 0's encoder gives at start (``encode_voice``)."""
        if self._voice_encoder is None:
            self._voice_encoder = StreamingMimiEncoder(self._mimi, 1, self.shape.own_q)
        return self._voice_encoder

    @torch.no_grad()
    def open_prompted(self, seed: int, frames: np.ndarray, voice: VoiceEmbeddings | None = None) -> int:
        """A slot opened with a prompt (``prompt.py``) prefilled now, in one pass: its slot."""
        slot = self.alloc_seeded(seed)
        try:
            self._reset_fresh()
            prefill(self.lm, slot, torch.from_numpy(frames), voice)
        except BaseException:
            self.free(slot)
            raise
        self.frames[slot] = frames.shape[0] - 1
        return slot

    def alloc_seeded(self, seed: int) -> int:
        slot = self.alloc()  # NoFreeSlot when full
        self._seeds[slot] = seed & 0xFFFFFFFF
        return slot

    def _reset_fresh(self) -> None:
        if self._fresh:
            fresh = self._fresh
            idx = torch.as_tensor(fresh, dtype=torch.long).to(self.device, non_blocking=True)
            seeds = torch.as_tensor([self._seeds.pop(s, 0) for s in fresh], dtype=torch.long)
            self._fresh = []
            self.lm.reset(idx)
            self.lm.seeds.index_copy_(0, idx, seeds.to(self.device))
            self.encoder.reset(idx)
            self.decoder.reset(idx)

    def _frame(self, b: int, length: int) -> None:
        active = self.d_active[:b]
        silent = self.d_silent[:b]
        self.lm.silent[:b] = silent
        user = self.encoder.step(b, self.d_in[:b].float() * PCM_SCALE, active)
        frame, valid = self.lm.step(b, length, user, active)
        frame[:, 0] = torch.where(silent, self.shape.text_padding_id, frame[:, 0])
        audio = self.decoder.step(b, frame[:, 1:], active & valid)
        pcm = (audio * 32768.0).round().clamp(-32768, 32767).to(torch.int16)
        self.d_pcm[:b] = torch.where((silent | ~valid)[:, None], 0, pcm)
        self.d_codes[:b] = frame
        self.d_valid[:b] = valid

    def slot_tensors(self) -> list[torch.Tensor]:
        """Every tensor holding per-slot state (slot first)."""
        return [*self.lm.slot_tensors(), *self.encoder.states.tensors, *self.encoder.ring.slot_tensors(),
                *self.decoder.states.tensors, *self.decoder.ring.slot_tensors()]  # fmt: skip

    @torch.no_grad()
    def step(  # type: ignore[override]  # the duplex frame: PCM in, frame tokens and PCM out
        self, slots: Sequence[int], pcm: np.ndarray, silent: Sequence[bool]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One frame per slot: PCM16 ``(n, 1920)`` -> (frame tokens ``(n, 1 + own_q)``: text then the
        model's codes, valid ``(n,)``, PCM16 ``(n, 1920)``)."""
        n = len(slots)
        if not n:
            k = self.num_codebooks
            return np.zeros((0, k), np.int64), np.zeros(0, bool), np.zeros((0, self.hop), np.int16)
        if pcm.shape != (n, self.hop):
            raise ValueError(f"expected PCM of shape {(n, self.hop)}, got {pcm.shape}")

        def stage(idx: torch.Tensor) -> None:
            self.h_silent.fill_(False)  # rows outside this step stay quiet
            self.h_silent[idx] = torch.as_tensor(list(silent), dtype=torch.bool)
            self.h_in[idx] = torch.from_numpy(np.require(pcm, np.int16, ["C", "W"]))

        idx = self._lockstep(
            slots, 1, stage,
            uploads=[(self.d_silent, self.h_silent), (self.d_in, self.h_in)],
            downloads=[(self.h_codes, self.d_codes), (self.h_valid, self.d_valid), (self.h_pcm, self.d_pcm)],
        )  # fmt: skip
        return self.h_codes[idx].numpy(), self.h_valid[idx].numpy(), self.h_pcm[idx].numpy()
