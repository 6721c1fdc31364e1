"""Fixed slots and the batched frame step shared by the codec-LM stages (Mimi codec LM, Qwen3-TTS).

One ``step`` advances every listed slot by one 80 ms frame: the talker runtime's ``frame_step`` (all
codebooks of the frame) then the streaming decoder's ``step``, then float -> PCM16. On CUDA the whole frame
is one CUDA graph per (batch bucket, KV-length bucket); the only host sync per step is the copy of the PCM
and codes back. Buckets: the batch covers slots ``[0, B)`` (slots are handed out lowest-first so active
ones stay packed) and attention reads ``[0, L)`` of the KV cache, ``L`` the smallest bucket above the
furthest active position. Subclasses build the runtimes and may add per-stream set-up (``_reset_fresh``).

``pipelined``: a frame's decoder runs behind the next frame's talker instead of inside its step. ``launch``
returns the frame's codes once the talker is done and leaves its decoding running (on a CUDA stream of its
own, a graph per batch bucket in a pool of its own). The next ``launch`` (or ``flush``) picks that
frame's PCM up for ``take`` (or a ``flush`` right after the launch waits for it: a stream's first frame).
The decoder then overlaps the next talker step and the host's work between steps, and a stream's audio
arrives one step later than its codes.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from realtime_gw.models.kernels import GraphCapture, bucket_for, pow2_buckets
from realtime_gw.models.runtime import NoFreeSlot
from realtime_gw.models.slot_pool import SlotPool


class SlotEngine:
    """Fixed slots on one device; ``step`` = one frame for the given slots, batched. It is the
    ``frame_engine.FrameEngine`` that ``tts_base.FrameTtsLoop`` drives. ``talker`` is a runtime with
    ``reset(slots)`` and ``frame_step(b, length, text_tokens, active, eos_ok) -> codes``; ``decoder`` a
    streaming decoder with ``hop`` and ``reset(slots)``, ``step(b, codes, active) -> pcm``."""

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
        pipelined: bool = False,
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
        self.pipelined = pipelined
        # pipelined: the decoder's own inputs (taken from the talker's outputs on its stream), graphs, pool
        self.d_dec_codes = torch.zeros(slots, k, dtype=torch.long, device=dev)
        self.d_dec_active = torch.zeros(slots, dtype=torch.bool, device=dev)
        self._dec_graphs: dict[int, Any] = {}
        self._dec_capturer = GraphCapture(self.device)
        cuda = self.device.type == "cuda" and pipelined
        self._dec_stream = torch.cuda.Stream(self.device) if cuda else None
        self._taken = torch.cuda.Event() if cuda else None
        """Recorded once the decoder has copied its inputs: the next talker step may overwrite them."""
        self._decoded = torch.cuda.Event() if cuda else None
        self._generation = [0] * slots
        """Bumped when a slot is handed out or freed: a frame in flight for an earlier stream is dropped."""
        self._in_flight: list[tuple[int, int]] = []
        """(slot, generation) of the frame being decoded."""
        self._ready: dict[int, deque[np.ndarray]] = {}
        """Decoded PCM16 frames not taken yet, by slot, oldest first (a flush right after a launch lands
        a frame while the slot's previous one is still untaken)."""

    @property
    def graph_count(self) -> int:
        return len(self._graphs) + len(self._dec_graphs)

    # -- slots ---------------------------------------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return len(self.slot_pool)

    def alloc(self) -> int:
        """Lowest free slot (keeps active slots packed, so the batch bucket stays small)."""
        slot = self.slot_pool.take()
        if slot is None:
            raise NoFreeSlot(f"{self.name}: no free slot ({self.slots} streams active)")
        if slot not in self._fresh:  # freed before its first step and taken again: reset it once
            self._fresh.append(slot)  # state reset happens batched, at the next step
        self.frames[slot] = 0
        self._generation[slot] += 1
        return slot

    def _reset_fresh(self) -> None:
        """Reset every slot allocated since the last step: ~45 small kernels in all, not per stream."""
        if self._fresh:
            idx = torch.as_tensor(self._fresh, dtype=torch.long).to(self.device, non_blocking=True)
            self._fresh = []
            self.talker.reset(idx)
            with self.decoding(idx):
                self.decoder.reset(idx)

    def free(self, slot: int) -> None:
        self.slot_pool.give(slot)  # raises on a slot freed twice
        self._generation[slot] += 1
        self._ready.pop(slot, None)

    @contextlib.contextmanager
    def decoding(self, *uses: torch.Tensor) -> Iterator[None]:
        """Where decoder state may be touched: pipelined on CUDA, the decoder's stream (after what the
        current stream has queued, e.g. the upload of ``uses``, which that stream then keeps alive), so
        it lands after the frame being decoded; elsewhere in place."""
        if self._dec_stream is None:
            yield
            return
        self._dec_stream.wait_stream(torch.cuda.current_stream(self.device))
        for t in uses:
            t.record_stream(self._dec_stream)
        with torch.cuda.stream(self._dec_stream):
            yield

    # -- the frame -----------------------------------------------------------------------------------------
    def _frame(self, b: int, length: int) -> None:
        """A whole frame: the talker step, then its decoding (what ``launch`` splits across streams)."""
        self._talk(b, length)
        self._take_inputs(b)
        self._decode(b)

    def _take_inputs(self, b: int) -> None:
        """The decoder's inputs from the talker's outputs (pipelined, the next talker step rewrites those)."""
        self.d_dec_codes[:b].copy_(self.d_codes[:b])
        self.d_dec_active[:b].copy_(self.d_active[:b])

    def _talk(self, b: int, length: int) -> None:
        self.d_codes[:b] = self.talker.frame_step(
            b, length, self.d_tok[:b], self.d_active[:b], self.d_eos_ok[:b]
        )

    def _decode(self, b: int) -> None:
        audio = self.decoder.step(b, self.d_dec_codes[:b], self.d_dec_active[:b])
        self.d_pcm[:b] = (audio * 32768.0).round().clamp(-32768, 32767).to(torch.int16)

    def _capture(self, b: int, length: int) -> Any:
        """Record one frame (pipelined: its talker step) for bucket (b, length). Warm-up runs use
        all-inactive rows: no state changes. Pipelined, the frame in flight is finished first (the
        warm-up writes the buffers it reads)."""
        self._collect()
        self.d_active[:b] = False
        body = (lambda: self._talk(b, length)) if self.pipelined else (lambda: self._frame(b, length))
        graph = self._capturer.capture(body)
        self._graphs[(b, length)] = graph
        return graph

    def _capture_decode(self, b: int) -> Any:
        self._collect()
        self.d_dec_active[:b] = False
        graph = self._dec_capturer.capture(lambda: self._decode(b))
        self._dec_graphs[b] = graph
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
            if self.pipelined and b not in self._dec_graphs:
                self._capture_decode(b)
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    @torch.no_grad()
    def step(
        self, slots: Sequence[int], tokens: Sequence[int], eos_ok: Sequence[bool] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """One frame for each slot (text token each); returns codes ``(n, K)`` and PCM16 ``(n, 1920)``.
        Pipelined, the frame is launched and then waited for (its PCM taken)."""
        if not slots:
            return np.zeros((0, self.num_codebooks), np.int64), np.zeros((0, self.hop), np.int16)
        if self.pipelined:
            codes = self.launch(slots, tokens, eos_ok)
            self.flush()
            return codes, np.stack([self.take(s) for s in slots])
        b, length, graph = self._prepare(slots, tokens, eos_ok)
        if graph is not None:
            graph.replay()
        else:
            self._frame(b, length)
        self.h_pcm[:b].copy_(self.d_pcm[:b], non_blocking=True)
        self.h_codes[:b].copy_(self.d_codes[:b], non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        idx = self._advance(slots)
        return self.h_codes[idx].numpy(), self.h_pcm[idx].numpy()

    @torch.no_grad()
    def launch(
        self, slots: Sequence[int], tokens: Sequence[int], eos_ok: Sequence[bool] | None = None
    ) -> np.ndarray:
        """Pipelined: one frame for each slot; returns its codes ``(n, K)`` once the talker is done and
        leaves the frame decoding. The previous frame's PCM becomes ``take``-able here."""
        assert self.pipelined, "launch is the pipelined engine's step"
        if self._taken is not None:  # the frame in flight has copied out the inputs this step rewrites
            torch.cuda.current_stream(self.device).wait_event(self._taken)
        b, length, graph = self._prepare(slots, tokens, eos_ok)
        dec_graph = None
        if self.use_graphs:
            dec_graph = self._dec_graphs.get(b) or self._capture_decode(b)
        if graph is not None:
            graph.replay()
        else:
            self._talk(b, length)
        self.h_codes[:b].copy_(self.d_codes[:b], non_blocking=True)
        codes_done = torch.cuda.Event() if self._taken is not None else None
        if codes_done is not None:
            codes_done.record()
        self._collect()  # the previous frame's PCM: its decoding ran beside this talker step
        with self.decoding():
            self._take_inputs(b)
            if self._taken is not None:
                self._taken.record()
            if dec_graph is not None:
                dec_graph.replay()
            else:
                self._decode(b)
            self.h_pcm[:b].copy_(self.d_pcm[:b], non_blocking=True)
            if self._decoded is not None:
                self._decoded.record()
        self._in_flight = [(s, self._generation[s]) for s in slots]
        if codes_done is not None:
            codes_done.synchronize()
        idx = self._advance(slots)
        return self.h_codes[idx].numpy()

    def flush(self) -> None:
        """Pipelined: wait for the frame being decoded; its PCM becomes ``take``-able."""
        self._collect()

    def take(self, slot: int) -> np.ndarray | None:
        """Pipelined: the slot's oldest decoded frame not taken yet, once (None if there is none)."""
        frames = self._ready.get(slot)
        return frames.popleft() if frames else None  # ``free`` drops the slot's queue

    def _collect(self) -> None:
        if not self._in_flight:
            return
        if self._decoded is not None:
            self._decoded.synchronize()
        for slot, generation in self._in_flight:
            if self._generation[slot] == generation:  # not freed (or handed out again) since
                self._ready.setdefault(slot, deque()).append(self.h_pcm[slot].numpy().copy())
        self._in_flight = []

    def _prepare(
        self, slots: Sequence[int], tokens: Sequence[int], eos_ok: Sequence[bool] | None
    ) -> tuple[int, int, Any]:
        """Checks, buckets, the bucket's graph (captured if new), fresh slots' state, and the inputs on
        the device: (batch bucket, KV-length bucket, graph or None)."""
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
        # non_blocking from pinned memory; safe to rewrite next step because every step ends in a sync
        self.d_tok[:b].copy_(self.h_tok[:b], non_blocking=True)
        self.d_active[:b].copy_(self.h_active[:b], non_blocking=True)
        self.d_eos_ok[:b].copy_(self.h_eos_ok[:b], non_blocking=True)
        return b, length, graph

    def _advance(self, slots: Sequence[int]) -> torch.Tensor:
        for s in slots:
            self.frames[s] += 1
        return torch.as_tensor(list(slots), dtype=torch.long)


class MovableSlotEngine(SlotEngine):
    """A slot engine whose streams can move between slots (``exchange``): subclasses name every tensor of
    per-slot state (``slot_tensors``). A stream's arithmetic does not depend on its row, so a moved stream
    continues unchanged; the backends use it to pack streams into the low slots (small batch buckets)."""

    def slot_tensors(self) -> list[torch.Tensor]:
        """Every tensor holding per-slot state (first dim = slot): what a slot *is* between steps."""
        raise NotImplementedError

    def _lockstep(
        self,
        slots: Sequence[int],
        lookahead: int,
        stage: Callable[[torch.Tensor], None],
        uploads: Sequence[tuple[torch.Tensor, torch.Tensor]],
        downloads: Sequence[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """One frame for each of ``slots`` in the (batch, length) bucket's graph, or eagerly: the length
        bucket covers the furthest slot's position + ``lookahead``; ``stage(idx)`` fills the pinned host
        inputs of those rows, ``uploads`` (device, host) go over, ``downloads`` (host, device) come back.
        Returns the slots as an index of the host outputs."""
        b = bucket_for(self.batch_buckets, max(slots) + 1)
        length = bucket_for(self.len_buckets, min(max(self.frames[s] for s in slots) + lookahead, self.max_positions))
        graph = None
        if self.use_graphs:  # capture (if new) before this step's inputs land: capture clears d_active
            graph = self._graphs.get((b, length)) or self._capture(b, length)
        self._reset_fresh()
        idx = torch.as_tensor(list(slots), dtype=torch.long)
        self.h_active[:b] = False
        self.h_active[idx] = True
        stage(idx)
        # non_blocking from pinned memory; safe to rewrite next step because this step ends in a sync
        self.d_active[:b].copy_(self.h_active[:b], non_blocking=True)
        for device_side, host in uploads:
            device_side[:b].copy_(host[:b], non_blocking=True)
        if graph is not None:
            graph.replay()
        else:
            self._frame(b, length)
        for host, device_side in downloads:
            host[:b].copy_(device_side[:b], non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        for s in slots:
            self.frames[s] += 1
        return idx

    @torch.no_grad()
    def exchange(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Swap the state of each slot pair ``(a, b)`` (pairs disjoint): rows, host frame counts, and which
        of the two is free when one is. Two kernels per state tensor for all pairs together."""
        if not pairs:
            return
        flat = [s for pair in pairs for s in pair]
        if len(set(flat)) != len(flat):
            raise ValueError(f"slot pairs overlap: {list(pairs)}")
        self._reset_fresh()  # a pending reset names slots: apply it before they move
        src = [a for a, _ in pairs] + [b for _, b in pairs]
        dst = [b for _, b in pairs] + [a for a, _ in pairs]
        src_t = torch.tensor(src, dtype=torch.long, device=self.device)
        dst_t = torch.tensor(dst, dtype=torch.long, device=self.device)
        for t in self.slot_tensors():
            t.index_copy_(0, dst_t, t.index_select(0, src_t))  # index_select copies first: a true swap
        pool = self.slot_pool
        for a, b in pairs:
            self.frames[a], self.frames[b] = self.frames[b], self.frames[a]
            if pool.is_free(a) != pool.is_free(b):  # being free moves with the state: swap which is free
                held, free = (a, b) if pool.is_free(b) else (b, a)
                pool.take_slot(free)
                pool.give(held)
