"""Fixed slots and the batched frame step shared by the codec-LM stages (Mimi codec LM, Qwen3-TTS).

One ``step`` advances every listed slot by one 80 ms frame: the talker runtime's ``frame_step`` (all
codebooks of the frame) then the streaming decoder's ``step``, then float -> PCM16. On CUDA the whole frame
is one CUDA graph per (batch bucket, KV-length bucket); the only host sync per step is the copy of the PCM
and codes back. Buckets: the batch covers slots ``[0, B)`` (slots are handed out lowest-first so active
ones stay packed) and attention reads ``[0, L)`` of the KV cache, ``L`` the smallest bucket above the
furthest active position. Subclasses build the runtimes and may add per-stream set-up (``_reset_fresh``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from realtime_gw.models.kernels import GraphCapture, bucket_for, pow2_buckets
from realtime_gw.models.runtime import NoFreeSlot
from realtime_gw.models.slot_pool import SlotPool


class FrameTalker(Protocol):
    def reset(self, slots: torch.Tensor) -> None: ...

    def frame_step(
        self, b: int, length: int, text_tokens: torch.Tensor, active: torch.Tensor, eos_ok: torch.Tensor
    ) -> torch.Tensor: ...


class FrameDecoder(Protocol):
    hop: int

    def reset(self, slots: torch.Tensor) -> None: ...

    def step(self, b: int, codes: torch.Tensor, active: torch.Tensor) -> torch.Tensor: ...


class SlotEngine:
    """Fixed slots on one device; ``step`` = one frame for the given slots, batched."""

    name = "tts"

    def __init__(
        self,
        talker: Any,
        decoder: Any,
        slots: int,
        *,
        max_positions: int,
        num_codebooks: int,
        device: torch.device,
        cuda_graphs: bool | None = None,
    ) -> None:
        self.talker = talker
        self.decoder = decoder
        self.slots = slots
        self.max_positions = max_positions
        self.num_codebooks = num_codebooks
        self.device = device
        if self.decoder.hop != 1920:
            raise ValueError(
                f"codec frames are {self.decoder.hop} samples; the gateway needs 1920 (80 ms at 24 kHz)"
            )
        self.hop = self.decoder.hop
        self.use_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.batch_buckets = pow2_buckets(slots, 1)
        self.len_buckets = pow2_buckets(self.max_positions, min(64, self.max_positions))
        self.slot_pool = SlotPool(slots, self.name)
        self._fresh: list[int] = []
        self.frames = [0] * slots
        """Host mirror of each slot's talker position (frames decoded so far)."""
        k, dev = self.num_codebooks, self.device
        pin = self.device.type == "cuda"
        self.h_tok = torch.zeros(slots, dtype=torch.long, pin_memory=pin)
        self.h_active = torch.zeros(slots, dtype=torch.bool, pin_memory=pin)
        self.h_eos_ok = torch.zeros(slots, dtype=torch.bool, pin_memory=pin)
        self.h_pcm = torch.zeros(slots, self.hop, dtype=torch.int16, pin_memory=pin)
        self.h_codes = torch.zeros(slots, k, dtype=torch.long, pin_memory=pin)
        self.d_tok = torch.zeros(slots, dtype=torch.long, device=dev)
        self.d_active = torch.zeros(slots, dtype=torch.bool, device=dev)
        self.d_eos_ok = torch.zeros(slots, dtype=torch.bool, device=dev)
        self.d_pcm = torch.zeros(slots, self.hop, dtype=torch.int16, device=dev)
        self.d_codes = torch.zeros(slots, k, dtype=torch.long, device=dev)
        self._graphs: dict[tuple[int, int], Any] = {}
        self._capturer = GraphCapture(self.device)

    @property
    def graph_count(self) -> int:
        return len(self._graphs)

    # -- slots ---------------------------------------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return len(self.slot_pool)

    def alloc(self) -> int:
        """Lowest free slot (keeps active slots packed, so the batch bucket stays small)."""
        slot = self.slot_pool.take()
        if slot is None:
            raise NoFreeSlot(f"{self.name}: no free slot ({self.slots} streams active)")
        self._fresh.append(slot)  # state reset happens batched, at the next step
        self.frames[slot] = 0
        return slot

    def _reset_fresh(self) -> None:
        """Reset every slot allocated since the last step: ~45 small kernels in all, not per stream."""
        if self._fresh:
            idx = torch.as_tensor(self._fresh, dtype=torch.long).to(self.device, non_blocking=True)
            self._fresh = []
            self.talker.reset(idx)
            self.decoder.reset(idx)

    def free(self, slot: int) -> None:
        self.slot_pool.give(slot)  # raises on a slot freed twice

    # -- the frame -----------------------------------------------------------------------------------------
    def _frame(self, b: int, length: int) -> None:
        active = self.d_active[:b]
        codes = self.talker.frame_step(b, length, self.d_tok[:b], active, self.d_eos_ok[:b])
        audio = self.decoder.step(b, codes, active)
        self.d_pcm[:b] = (audio * 32768.0).round().clamp(-32768, 32767).to(torch.int16)
        self.d_codes[:b] = codes

    def _capture(self, b: int, length: int) -> Any:
        """Record one frame for bucket (b, length). Warm-up runs use all-inactive rows: no state changes."""
        self.d_active[:b] = False
        graph = self._capturer.capture(lambda: self._frame(b, length))
        self._graphs[(b, length)] = graph
        return graph

    @torch.no_grad()
    def capture_all(self) -> float:
        """Capture every bucket now (a lazily captured bucket would stall its first step); returns seconds."""
        if not self.use_graphs:
            return 0.0
        t0 = time.perf_counter()
        for b in self.batch_buckets:
            for length in self.len_buckets:
                if (b, length) not in self._graphs:
                    self._capture(b, length)
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    @torch.no_grad()
    def step(
        self, slots: Sequence[int], tokens: Sequence[int], eos_ok: Sequence[bool] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """One frame for each slot (text token each); returns codes ``(n, K)`` and PCM16 ``(n, 1920)``."""
        if not slots:
            return np.zeros((0, self.num_codebooks), np.int64), np.zeros((0, self.hop), np.int16)
        for s in slots:
            if self.frames[s] >= self.max_positions:
                raise ValueError(f"slot {s} is full ({self.max_positions} frames)")
        b = bucket_for(self.batch_buckets, max(slots) + 1)
        length = bucket_for(self.len_buckets, max(self.frames[s] for s in slots) + 1)
        graph = None
        if self.use_graphs:  # capture (if new) before this step's inputs land: capture clears d_active
            graph = self._graphs.get((b, length)) or self._capture(b, length)
        self._reset_fresh()
        idx = torch.as_tensor(list(slots), dtype=torch.long)
        self.h_tok[:b] = 0  # inactive rows: any valid id, their results are discarded
        self.h_active[:b] = False
        self.h_eos_ok[:b] = False
        self.h_tok[idx] = torch.as_tensor(list(tokens), dtype=torch.long)
        self.h_active[idx] = True
        if eos_ok is not None:
            self.h_eos_ok[idx] = torch.as_tensor(list(eos_ok), dtype=torch.bool)
        # non_blocking from pinned memory; safe to rewrite next step because this step ends in a sync
        self.d_tok[:b].copy_(self.h_tok[:b], non_blocking=True)
        self.d_active[:b].copy_(self.h_active[:b], non_blocking=True)
        self.d_eos_ok[:b].copy_(self.h_eos_ok[:b], non_blocking=True)
        if graph is not None:
            graph.replay()
        else:
            self._frame(b, length)
        self.h_pcm[:b].copy_(self.d_pcm[:b], non_blocking=True)
        self.h_codes[:b].copy_(self.d_codes[:b], non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        for s in slots:
            self.frames[s] += 1
        return self.h_codes[idx].numpy(), self.h_pcm[idx].numpy()
