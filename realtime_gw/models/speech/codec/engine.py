"""Slots and the batched frame step of the codec TTS: talker (all 16 codebooks) -> Mimi decode -> PCM16.

One ``step`` advances every listed slot by one 80 ms frame. On CUDA the whole frame (talker, code
predictor, sampling, codec decoder, float -> PCM16) is one CUDA graph per (batch bucket, KV-length
bucket); the only host sync per step is the copy of the PCM and codes back. Buckets: the batch covers
slots ``[0, B)`` (slots are handed out lowest-first so active ones stay packed) and attention reads
``[0, L)`` of the KV cache, ``L`` the smallest bucket above the furthest active position.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from realtime_gw.models.kernels import GraphCapture, bucket_for, pow2_buckets
from realtime_gw.models.runtime import NoFreeSlot
from realtime_gw.models.speech.codec.mimi_stream import StreamingMimiDecoder
from realtime_gw.models.speech.codec.spec import CODEC_DIR, SPEC_FILE, TALKER_FILE, CodecSpec, named_spec
from realtime_gw.models.speech.codec.talker import CodecTalker, TalkerRuntime
from realtime_gw.models.speech.codec.text import TextTokenizer
from realtime_gw.models.tokenizers import ByteTokenizer, HfTokenizer, has_tokenizer_files

log = logging.getLogger(__name__)

INIT_SEED = 0
"""Random-init weights are seeded, so every process builds the same model."""


@dataclass
class LoadedModels:
    spec: CodecSpec
    talker: CodecTalker
    mimi: Any
    tokenizer: TextTokenizer
    description: str
    random_init: bool


def randomize_codebooks(mimi: Any) -> None:
    """Make a random-init Mimi usable as a stand-in.

    Its init leaves every codebook at zero (all codes would decode alike), so codebooks get unit-normal
    entries; and its output is loud, clipped noise, so the last conv is scaled down to speaking level.
    """
    from realtime_gw.models.speech.codec.mimi_stream import mimi_decoder_parts

    with torch.no_grad():
        for mod in mimi.modules():
            if hasattr(mod, "embed_sum") and hasattr(mod, "cluster_usage"):
                mod.embed_sum.normal_()
                mod.cluster_usage.fill_(1.0)
                mod._embed = None  # the codebook caches embed_sum / usage on first use
        last = mimi_decoder_parts(mimi)[2].layers[-1].conv
        last.weight.mul_(0.05)
        if last.bias is not None:
            last.bias.mul_(0.05)


def build_random(spec: CodecSpec, device: str, dtype: torch.dtype) -> tuple[CodecTalker, Any]:
    from transformers import MimiConfig, MimiModel

    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(INIT_SEED)
        talker = CodecTalker(spec)
        mimi = MimiModel(MimiConfig(**spec.mimi))
        randomize_codebooks(mimi)
    return talker.to(device=device, dtype=dtype).eval(), mimi.to(device=device, dtype=torch.float32).eval()


def load_models(
    config: str, path: str | None, device: str, dtype: torch.dtype, max_positions: int | None = None
) -> LoadedModels:
    """Weights from ``path`` (see ``spec``'s directory format) or random init of the named config.

    ``max_positions`` overrides the slot length (KV memory per slot scales with it)."""
    if not path:
        spec = named_spec(config)
        if max_positions:
            spec = dataclasses.replace(spec, max_positions=max_positions)
        talker, mimi = build_random(spec, device, dtype)
        return LoadedModels(
            spec, talker, mimi, ByteTokenizer(), f"codec-{spec.name} (random init: audio is noise)", True
        )
    from safetensors.torch import load_file
    from transformers import MimiModel

    root = Path(path)
    spec = CodecSpec.from_json((root / SPEC_FILE).read_text())
    if max_positions:
        spec = dataclasses.replace(spec, max_positions=max_positions)
    with torch.device(device):  # not "meta": non-persistent buffers (rotary inv_freq) must be real
        talker = CodecTalker(spec)
    talker.load_state_dict(load_file(str(root / TALKER_FILE), device="cpu"), strict=True)
    talker = talker.to(device=device, dtype=dtype).eval()
    mimi = MimiModel.from_pretrained(str(root / CODEC_DIR), local_files_only=True, dtype=torch.float32)
    mimi = mimi.to(device).eval()
    tok: TextTokenizer = HfTokenizer(root) if has_tokenizer_files(root) else ByteTokenizer()
    if tok.vocab_size > spec.text_vocab:
        raise ValueError(
            f"{root}: tokenizer has {tok.vocab_size} ids but the talker embeds {spec.text_vocab}"
        )
    return LoadedModels(spec, talker, mimi, tok, f"codec-{spec.name} from {root}", False)


class CodecEngine:
    """Fixed slots on one device; ``step`` = one frame for the given slots, batched."""

    def __init__(
        self,
        models: LoadedModels,
        slots: int,
        *,
        temperature: float = 0.9,
        top_k: int = 50,
        allow_eos: bool = False,
        cuda_graphs: bool | None = None,
    ) -> None:
        self.spec = models.spec
        self.slots = slots
        self.device = next(models.talker.parameters()).device
        self.talker = TalkerRuntime(
            models.talker, slots, temperature=temperature, top_k=top_k, allow_eos=allow_eos
        )
        self.decoder = StreamingMimiDecoder(models.mimi, slots, self.spec.num_codebooks)
        if self.decoder.hop != 1920:
            raise ValueError(
                f"codec frames are {self.decoder.hop} samples; the gateway needs 1920 (80 ms at 24 kHz)"
            )
        self.hop = self.decoder.hop
        self.use_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.batch_buckets = pow2_buckets(slots, 1)
        self.len_buckets = pow2_buckets(self.spec.max_positions, min(64, self.spec.max_positions))
        self._free = list(range(slots))
        heapq.heapify(self._free)
        self._fresh: list[int] = []
        self.frames = [0] * slots
        """Host mirror of each slot's talker position (frames decoded so far)."""
        k, dev = self.spec.num_codebooks, self.device
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
        return len(self._free)

    def alloc(self) -> int:
        """Lowest free slot (keeps active slots packed, so the batch bucket stays small)."""
        if not self._free:
            raise NoFreeSlot(f"tts-codec: no free slot ({self.slots} streams active)")
        slot = heapq.heappop(self._free)
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
        if slot in self._free:
            raise ValueError(f"slot {slot} freed twice")
        heapq.heappush(self._free, slot)

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
            return np.zeros((0, self.spec.num_codebooks), np.int64), np.zeros((0, self.hop), np.int16)
        for s in slots:
            if self.frames[s] >= self.spec.max_positions:
                raise ValueError(f"slot {s} is full ({self.spec.max_positions} frames)")
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
