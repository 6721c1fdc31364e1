"""Silero VAD in torch, batched over every session's stream in one forward per round, on CUDA or the CPU.

The network is the one in the ``silero-vad`` wheel at 16 kHz (v5/v6; the weights are read from its
TorchScript file, ``data/silero_vad.jit``, and nothing is downloaded): a window of 64 context + 512 new
samples, right-reflect-padded by 64, goes through an STFT as a strided conv (256-sample frames, hop 128,
4 frames), magnitudes of 129 bins, four conv+ReLU layers (strides 1, 2, 2, 1) down to one 128-vector, one
LSTM cell (per-stream ``(h, c)``), ReLU, a 1x1 conv and a sigmoid. The gateway resamples every stream to
16 kHz, so the wheel's 8 kHz network is not loaded.

State: ``(h, c)`` live in fixed slot rows of two preallocated device tensors (plus one scratch row that
padded batch rows write to); the 64-sample context stays with the stream on the host, where each window's
input is assembled anyway (``vad_silero.take_rounds``). One round = the next window of every stream that has
one: its rows gather their slots' ``(h, c)``, run the network and scatter the new state back. On CUDA each
round is one CUDA graph replay per batch bucket (``pow2_buckets`` up to ``max_batch``, all captured at warm-up
in strict float32), on a high-priority stream of the stage's own so its small steps do not queue behind the
other stages' work on the default stream; a step ends in one copy of every round's probabilities back to the
host. On the CPU (and with ``cuda_graphs=False``) the same round function runs eagerly on exactly the rows.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from realtime_gw.models.kernels import GraphCapture, bucket_for, pow2_buckets
from realtime_gw.models.runtime import NoFreeSlot
from realtime_gw.models.slot_pool import SlotPool
from realtime_gw.models.speech.streaming.layers import strict_fp32
from realtime_gw.models.speech.vad_silero import (
    CONTEXT,
    MAX_WINDOWS_PER_STEP,
    WINDOW,
    Round,
    SileroVadStreams,
    VadState,
    silero_data_path,
)
from realtime_gw.records.voice import VadRequest

HIDDEN = 128
STAGED = MAX_WINDOWS_PER_STEP
"""Launches (rounds, or pieces of a round wider than ``max_batch``) staged per host sync: a worker step
(``MAX_WINDOWS_PER_STEP`` rounds of at most ``max_batch`` streams) is one sync."""
ENCODER_STRIDES = (1, 2, 2, 1)
_SHAPES = {
    "stft.forward_basis_buffer": (258, 1, 256),
    "encoder.0.reparam_conv.weight": (128, 129, 3),
    "encoder.1.reparam_conv.weight": (64, 128, 3),
    "encoder.2.reparam_conv.weight": (64, 64, 3),
    "encoder.3.reparam_conv.weight": (128, 64, 3),
    "decoder.rnn.weight_ih": (4 * HIDDEN, HIDDEN),
    "decoder.rnn.weight_hh": (4 * HIDDEN, HIDDEN),
    "decoder.decoder.2.weight": (1, HIDDEN, 1),
}


def load_silero_weights(path: str | Path | None = None) -> dict[str, torch.Tensor]:
    """The 16 kHz network's tensors from the wheel's TorchScript file, keyed without the ``_model.``
    prefix; raises if the file's layout is not the one ``SileroVadNet`` computes."""
    with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript loading; the wheel ships .jit
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.load(str(path or silero_data_path("silero_vad.jit")), map_location="cpu")
    prefix = "_model."
    weights = {
        k[len(prefix) :]: v.detach().clone() for k, v in module.state_dict().items() if k.startswith(prefix)
    }
    for name, shape in _SHAPES.items():
        if name not in weights or tuple(weights[name].shape) != shape:
            found = tuple(weights[name].shape) if name in weights else None
            raise RuntimeError(
                f"silero_vad.jit: {name} is {found}, expected {shape} (an unknown Silero version)"
            )
    return weights


class SileroVadNet:
    """The 16 kHz network as functions of fixed weight tensors on one device."""

    def __init__(self, weights: dict[str, torch.Tensor], device: torch.device) -> None:
        w = {k: v.to(device=device, dtype=torch.float32).contiguous() for k, v in weights.items()}
        self.basis = w["stft.forward_basis_buffer"]
        self.convs = [
            (w[f"encoder.{i}.reparam_conv.weight"], w[f"encoder.{i}.reparam_conv.bias"]) for i in range(4)
        ]
        self.lstm = (
            w["decoder.rnn.weight_ih"],
            w["decoder.rnn.weight_hh"],
            w["decoder.rnn.bias_ih"],
            w["decoder.rnn.bias_hh"],
        )
        self.head_w = w["decoder.decoder.2.weight"].view(1, HIDDEN)
        self.head_b = w["decoder.decoder.2.bias"]

    def __call__(
        self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [B, 64 + 512]``, ``h, c [B, 128]`` -> (speech probability ``[B]``, new h, new c)."""
        frames = F.pad(x[:, None], (0, CONTEXT), mode="reflect")
        spec = F.conv1d(frames, self.basis, stride=self.basis.shape[-1] // 2)
        bins = spec.shape[1] // 2
        real, imag = spec[:, :bins], spec[:, bins:]
        y = torch.sqrt(real * real + imag * imag)
        for (weight, bias), stride in zip(self.convs, ENCODER_STRIDES, strict=True):
            y = F.relu(F.conv1d(y, weight, bias, stride=stride, padding=1))
        h, c = torch.lstm_cell(y[:, :, 0], (h, c), *self.lstm)
        # Silero averages the head over its (one) time step; a 1x1 conv on one step is a linear.
        prob = torch.sigmoid(F.linear(F.relu(h), self.head_w, self.head_b))[:, 0]
        return prob, h, c


class TorchSileroVadBackend(SileroVadStreams):
    """``SileroVadStreams`` with the network in torch on ``device``, ``slots`` streams at most."""

    name = "vad-silero-torch"

    def __init__(
        self,
        device: str | torch.device = "cpu",
        *,
        slots: int = 256,
        max_batch: int = 256,
        cuda_graphs: bool | None = None,
        pad_to_buckets: bool | None = None,
        model_path: str | Path | None = None,
    ) -> None:
        """``cuda_graphs``: default on CUDA. ``pad_to_buckets``: run each round at its batch bucket's rows
        (scratch rows padding it), as the graphs do; default with graphs, and eagerly it checks the
        padding on the CPU."""
        self.device = torch.device(device)
        self.slots = slots
        self.max_batch = max_batch
        self.use_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.pad_to_buckets = self.use_graphs if pad_to_buckets is None else pad_to_buckets
        if self.use_graphs and not self.pad_to_buckets:
            raise ValueError("CUDA graphs run at batch-bucket shapes: pad_to_buckets cannot be off with them")
        self.net = SileroVadNet(load_silero_weights(model_path), self.device)
        self.batch_buckets = pow2_buckets(max_batch, 1)
        self.slot_pool = SlotPool(slots, self.name)
        dev, pin = self.device, self.device.type == "cuda"
        self.scratch = slots
        """The slot row that padded batch rows gather from and write to."""
        self.h = torch.zeros(slots + 1, HIDDEN, device=dev)
        self.c = torch.zeros(slots + 1, HIDDEN, device=dev)
        # Graph inputs and outputs (fixed addresses), and pinned host staging for every round of a step.
        self.d_x = torch.zeros(max_batch, CONTEXT + WINDOW, device=dev)
        self.d_idx = torch.full((max_batch,), self.scratch, dtype=torch.long, device=dev)
        self.d_prob = torch.zeros(max_batch, device=dev)
        self.d_probs = torch.zeros(STAGED, max_batch, device=dev)
        self.h_x = torch.zeros(STAGED, max_batch, CONTEXT + WINDOW, pin_memory=pin)
        self.h_idx = torch.full((STAGED, max_batch), self.scratch, dtype=torch.long, pin_memory=pin)
        self.h_probs = torch.zeros(STAGED, max_batch, pin_memory=pin)
        self._graphs: dict[int, Any] = {}
        self._capturer = GraphCapture(self.device)
        self._stream: Any = None
        if self.device.type == "cuda":
            self._stream = torch.cuda.Stream(self.device, priority=-1)
            self._stream.wait_stream(torch.cuda.current_stream(self.device))  # the zeroed tensors above

    # -- slots ---------------------------------------------------------------------------------------------
    def open(self, request: VadRequest) -> VadState:
        state = super().open(request)
        slot = self.slot_pool.take()
        if slot is None:
            raise NoFreeSlot(f"{self.name}: no free slot ({self.slots} streams active)")
        state.slot = slot
        with self._on_stream():  # a fresh stream starts from zero state, whoever held the slot before
            self.h[state.slot].zero_()
            self.c[state.slot].zero_()
        return state

    def release(self, state: VadState) -> None:
        super().release(state)
        if state.slot >= 0:
            self.slot_pool.give(state.slot)  # raises on a slot freed twice
            state.slot = -1

    @property
    def free_slots(self) -> int:
        return len(self.slot_pool)

    # -- the network ---------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _on_stream(self) -> Iterator[None]:
        with (
            torch.no_grad(),
            torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext(),
        ):
            yield

    def _round(self, b: int) -> None:
        """Rows ``[0, b)`` of ``d_x``/``d_idx``, a window each: (h, c) advanced, probs in ``d_prob``."""
        idx = self.d_idx[:b]
        prob, h, c = self.net(self.d_x[:b], self.h.index_select(0, idx), self.c.index_select(0, idx))
        self.h.index_copy_(0, idx, h)
        self.c.index_copy_(0, idx, c)
        self.d_prob[:b] = prob

    def _capture(self, b: int) -> Any:
        """Record a round of ``b`` rows; the warm-up and capture runs touch only the scratch slot."""
        self.d_idx.fill_(self.scratch)
        with strict_fp32(self.device):  # TF32 convs would move probabilities by ~1e-3
            graph = self._capturer.capture(lambda: self._round(b))
        self._graphs[b] = graph
        return graph

    def capture_all(self) -> float:
        """Capture every batch bucket now (a lazily captured one would stall its first step); seconds."""
        if not self.use_graphs:
            return 0.0
        t0 = time.perf_counter()
        with self._on_stream():
            for b in self.batch_buckets:
                if b not in self._graphs:
                    self._capture(b)
            torch.cuda.current_stream(self.device).synchronize()
        return time.perf_counter() - t0

    def run_rounds(self, rounds: list[Round]) -> list[np.ndarray]:
        # Launches: a round's rows in pieces of at most max_batch (rows are independent), rounds in order
        # (round r + 1 continues round r's state); staged and synced STAGED launches at a time.
        launches = [
            (r, lo, min(lo + self.max_batch, len(ready)))
            for r, (ready, _) in enumerate(rounds)
            for lo in range(0, len(ready), self.max_batch)
        ]
        out = [np.empty(len(ready), dtype=np.float32) for ready, _ in rounds]
        for k in range(0, len(launches), STAGED):
            self._run_launches(rounds, launches[k : k + STAGED], out)
        return out

    def _run_launches(
        self, rounds: list[Round], launches: list[tuple[int, int, int]], out: list[np.ndarray]
    ) -> None:
        # Every launch's inputs into pinned staging first (the previous batch ended in a sync: reuse is safe).
        for i, (r, lo, hi) in enumerate(launches):
            ready, x = rounds[r]
            b = self._rows(hi - lo)
            self.h_x[i, : hi - lo] = torch.from_numpy(x[lo:hi])
            self.h_idx[i, :b] = self.scratch
            self.h_idx[i, : hi - lo] = torch.as_tensor([s.slot for s in ready[lo:hi]], dtype=torch.long)
        with self._on_stream():
            for i, (_, lo, hi) in enumerate(launches):
                b = self._rows(hi - lo)
                # A bucket not captured at warm-up is captured now, before this launch's inputs land.
                graph = (self._graphs.get(b) or self._capture(b)) if self.use_graphs else None
                self.d_x[:b].copy_(self.h_x[i, :b], non_blocking=True)
                self.d_idx[:b].copy_(self.h_idx[i, :b], non_blocking=True)
                if graph is not None:
                    graph.replay()
                else:
                    with strict_fp32(self.device):
                        self._round(b)
                self.d_probs[i, :b].copy_(self.d_prob[:b])
            # Whole rows: a contiguous copy stays asynchronous (a strided one goes via a pageable temporary).
            self.h_probs[: len(launches)].copy_(self.d_probs[: len(launches)], non_blocking=True)
            if self._stream is not None:
                self._stream.synchronize()
        for i, (r, lo, hi) in enumerate(launches):
            out[r][lo:hi] = self.h_probs[i, : hi - lo].numpy()

    def _rows(self, n: int) -> int:
        """Batch rows a launch of ``n`` streams runs: its bucket, or exactly ``n``."""
        return bucket_for(self.batch_buckets, n) if self.pad_to_buckets else n

    def warmup(self) -> None:
        self.capture_all()
        super().warmup()
