"""Qwen3-TTS on the shared slot engine: prompts, prefill of new streams, then one frame per step.

``Qwen3Engine`` is a ``SlotEngine`` (``streaming/slot_engine.py``: slots, batch/KV-length buckets, one CUDA graph
per bucket for the frame step) over ``Qwen3TalkerRuntime`` + ``StreamingQwen3Decoder``. A stream is
opened with its prompt (``alloc(prompt)``); at the next step every new stream starts from its prompt's
K/V before the frame step, so a stream's first audio leaves in its first step. A prompt's K/V depend on the
prompt alone (voice and language), so they are computed once (one batched prefill of the prompts not seen
yet) and kept (``prompt_cache`` most recent prompts): a stream's start is then ~60 small copies, and its
first audio is one frame step (talker, code predictor, decoder: one CUDA graph). A per-request prompt
(``Prompt.cache`` false: an ICL clone's, which holds its utterance's text) is prefilled in its stream's
step and never enters the cache, so it evicts no cached voice.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from realtime_gw.models.speech.qwen3.checkpoint import Qwen3TtsCheckpoint
from realtime_gw.models.speech.qwen3.decoder import StreamingQwen3Decoder
from realtime_gw.models.speech.qwen3.talker import VECTOR_POSITION, Qwen3TalkerRuntime, Sampling
from realtime_gw.models.speech.streaming.slot_engine import SlotEngine

NO_CODEC = -1


@dataclass(frozen=True)
class Prompt:
    """The prefill of one stream: per position a text id and a codec id (``NO_CODEC`` = text only,
    ``VECTOR_POSITION`` = the codec part is the next of ``vectors``, a cloned voice's x-vector, then the
    next frame of ``recording``). ``recording``: an ICL recording registered with the engine
    (``add_recording``): its frames fill the positions after ``vectors``, its last frame is the first frame
    step's codec input (else codec BOS) and the codec decoder starts from its state after the recording
    (else silence). ``cache``: keep its K/V for later streams (not for a prompt with an utterance's text)."""

    text_ids: tuple[int, ...]
    codec_ids: tuple[int, ...]
    vectors: tuple[tuple[float, ...], ...] = ()
    recording: str = ""
    cache: bool = field(default=True, compare=False)

    def __len__(self) -> int:
        return len(self.text_ids)


def build_prompt(
    ck: Qwen3TtsCheckpoint,
    role_ids: list[int],
    speaker: str | None,
    language: str,
    instruct_ids: tuple[int, ...] = (),
    vector: tuple[float, ...] = (),
) -> Prompt:
    """The reference's streaming-mode prompt, less its last position (first text token + codec BOS: the
    first frame step's input). ``role_ids``: ``<|im_start|>assistant\\n`` tokenized. ``speaker``: a
    CustomVoice speaker, or ``vector``: a Base x-vector in the speaker's place, or neither (VoiceDesign).
    ``instruct_ids``: ``<|im_start|>user\\n{instruct}<|im_end|>\\n`` tokenized, text-only positions
    ahead of everything (the reference's ``generate`` with ``instruct_ids``), or none."""
    c = ck.talker_config
    lang = language.lower()
    languages = ck.languages()
    if lang == "auto":
        lang_id = None
    elif lang in languages:
        lang_id = languages[lang]
    else:
        raise ValueError(f"unknown language {language!r}; available: auto, {', '.join(sorted(languages))}")
    spk_id = None
    if speaker:
        speakers = ck.speakers()
        if speaker.lower() not in speakers:
            raise ValueError(f"unknown speaker {speaker!r}; available: {', '.join(sorted(speakers))}")
        spk_id = speakers[speaker.lower()]
        dialect = ck.dialects().get(speaker.lower())
        if lang in ("chinese", "auto") and dialect:
            lang_id = languages[dialect.lower()]
    if lang_id is None:
        codec = [c["codec_nothink_id"], c["codec_think_bos_id"], c["codec_think_eos_id"]]
    else:
        codec = [c["codec_think_id"], c["codec_think_bos_id"], lang_id, c["codec_think_eos_id"]]
    if spk_id is not None and vector:
        raise ValueError("a prompt has a speaker or an x-vector, not both")
    if spk_id is not None:
        codec.append(spk_id)
    elif vector:
        codec.append(VECTOR_POSITION)  # the x-vector in the speaker's place
    codec += [c["codec_pad_id"]]  # then codec BOS, which rides on the first frame step
    cfg = ck.config
    text = [*instruct_ids, *role_ids, *[cfg["tts_pad_token_id"]] * (len(codec) - 1), cfg["tts_bos_token_id"]]
    head = [NO_CODEC] * (len(instruct_ids) + len(role_ids))
    return Prompt(tuple(int(t) for t in text), (*head, *(int(x) for x in codec)), (vector,) if vector else ())


class Qwen3Engine(SlotEngine):
    name = "tts-qwen3"

    def __init__(
        self,
        ck: Qwen3TtsCheckpoint,
        slots: int,
        *,
        max_positions: int = 2048,
        sampling: Sampling | None = None,
        cuda_graphs: bool | None = None,
        decoder_precision: str = "fp32",
        fuse_snake: bool = False,
        prompt_cache: int = 64,
        compile_predictor: str | None = None,
        pipelined: bool = False,
        fused_predictor: bool = False,
    ) -> None:
        sampling = sampling or Sampling.from_generation(ck.generation)
        talker = Qwen3TalkerRuntime(ck, slots, max_positions, sampling, compile_predictor, fused_predictor)
        decoder = StreamingQwen3Decoder(ck.decoder, slots, decoder_precision, fuse_snake)
        super().__init__(
            talker,
            decoder,
            slots,
            max_positions=max_positions,
            num_codebooks=talker.num_codebooks,
            device=next(ck.talker.parameters()).device,
            cuda_graphs=cuda_graphs,
            pipelined=pipelined,
        )
        self._prompts: dict[int, Prompt] = {}
        self._recordings: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        """ICL recordings: key -> (per-frame codec embeddings ``(F, H)``, the decoder state after them)."""
        self._prompt_kv: OrderedDict[Prompt, torch.Tensor] = OrderedDict()
        self.prompt_cache = prompt_cache
        self.fused_paths: dict[int, dict[str, Any]] = {}
        """With fused layers: per batch bucket, which path each part runs and their timings."""

    def capture_all(self) -> float:
        """With fused layers on CUDA: first, per batch bucket, fused or eager talker layers and code
        predictor, whichever is faster (``FusedQwen3Frame.choose``, timed at the middle KV-length
        bucket); then every graph, each with its bucket's paths."""
        fused = self.talker.fused_predictor
        if self.use_graphs and fused is not None and not self.fused_paths:
            mid = self.len_buckets[len(self.len_buckets) // 2]
            self.fused_paths = fused.choose(self.batch_buckets, mid)
        return super().capture_all()

    def alloc_prompt(self, prompt: Prompt | None) -> int:
        """A slot for a new stream with ``prompt`` (prefilled at the next step); NoFreeSlot when full.
        ``None``: the slot is held, and the stream starts once ``set_prompt`` gives its prompt."""
        if prompt is not None and len(prompt) >= self.max_positions:
            raise ValueError(f"prompt of {len(prompt)} positions does not fit {self.max_positions}")
        slot = self.alloc()
        self._fresh.remove(slot)
        if prompt is not None:
            self.set_prompt(slot, prompt)
        return slot

    def set_prompt(self, slot: int, prompt: Prompt) -> None:
        """Start a held slot's stream from ``prompt`` at the next step."""
        if len(prompt) >= self.max_positions:
            raise ValueError(f"prompt of {len(prompt)} positions does not fit {self.max_positions}")
        self._prompts[slot] = prompt
        self.frames[slot] = len(prompt)  # host mirror of the talker position after prefill
        self._fresh.append(slot)

    def free(self, slot: int) -> None:
        self._prompts.pop(slot, None)
        super().free(slot)

    def _reset_fresh(self) -> None:
        """Reset the decoder state of every stream opened since the last step and start their talkers
        from their prompts' K/V (prefilling, in one batch, the prompts not cached yet)."""
        if not self._fresh:
            return
        fresh = [s for s in self._fresh if s in self._prompts]
        self._fresh = []
        if not fresh:
            return
        groups: dict[Prompt, list[int]] = {}
        for s in fresh:
            groups.setdefault(self._prompts.pop(s), []).append(s)
        idx = self._index(fresh)
        with self.decoding(idx):  # pipelined: behind the frame being decoded
            self.decoder.reset(idx)
            for key in {p.recording for p in groups} - {""}:
                primed = self._index([s for p, slots in groups.items() if p.recording == key for s in slots])
                self.decoder.load_slot(primed, self._recordings[key][1])
        kvs = self.cache_prompts(list(groups), {p: slots[0] for p, slots in groups.items()})
        for p, slots in groups.items():
            first = self._recordings[p.recording][0][-1] if p.recording else None
            self.talker.load_prompt(self._index(slots), kvs[p], first)

    @torch.no_grad()
    def add_recording(self, key: str, frames: torch.Tensor, codes: torch.Tensor) -> None:
        """An ICL recording for prompts that name ``key``: its per-frame codec embeddings ``(F, H)``, and
        its codes ``(F, K)`` decoded once in a free slot (audio dropped) for the decoder state that such
        streams start from (the reference decodes the recording ahead of the speech, then cuts it)."""
        slot = self.slot_pool.lowest()
        if slot is None:
            raise ValueError("no free slot to prime the decoder in")
        b = slot + 1
        with self.decoding():  # pipelined: behind the frame being decoded, which rewrites the state rows
            self.decoder.reset(self._index([slot]))
            active = torch.zeros(b, dtype=torch.bool, device=self.device)
            active[slot] = True
            batch = torch.zeros(b, codes.shape[1], dtype=torch.long, device=self.device)
            for frame in codes.to(self.device):
                batch[slot] = frame
                self.decoder.step(b, batch, active)
            state = self.decoder.export_slot(slot)
        self._recordings[key] = (frames.to(self.device), state)

    def cache_prompts(
        self, prompts: list[Prompt], scratch: dict[Prompt, int] | None = None
    ) -> dict[Prompt, torch.Tensor]:
        """Every prompt's K/V: the ones not cached yet prefilled in one batch, each in its ``scratch`` slot
        (default: a free slot; its talker state is rewritten when it is next handed out). Those with
        ``cache`` are kept (most recent ``prompt_cache``); per-request ones (``cache`` false) are returned
        only: they neither enter the cache nor evict from it."""
        wanted = list(dict.fromkeys(prompts))
        kvs: dict[Prompt, torch.Tensor] = {}
        for p in wanted:
            if p in self._prompt_kv:
                self._prompt_kv.move_to_end(p)
                kvs[p] = self._prompt_kv[p]
        new = [p for p in wanted if p not in kvs]
        if not new:
            return kvs
        if scratch is None:
            if len(new) > len(self.slot_pool):
                raise ValueError(f"{len(new)} prompts to cache, {len(self.slot_pool)} free slots")
            scratch = dict(zip(new, self.slot_pool.free_slots(), strict=False))
        width = max(len(p) for p in new)
        text = torch.zeros(len(new), width, dtype=torch.long)
        codec = torch.full((len(new), width), NO_CODEC, dtype=torch.long)
        for i, p in enumerate(new):
            text[i, : len(p)] = torch.as_tensor(p.text_ids)
            codec[i, : len(p)] = torch.as_tensor(p.codec_ids)
        lengths = torch.as_tensor([len(p) for p in new], dtype=torch.long)
        dev = self.device
        vectors = None
        if any(p.vectors or p.recording for p in new):
            vectors = torch.zeros(len(new), width, self.talker.hidden, device=dev)
            for i, p in enumerate(new):
                at = (codec[i] == VECTOR_POSITION).nonzero()[:, 0].to(dev)
                rows = [torch.as_tensor(p.vectors, device=dev).reshape(-1, self.talker.hidden)]
                if p.recording:
                    frames = self._recordings[p.recording][0]
                    rows.append(frames[: len(at) - len(p.vectors)].float())
                vectors[i, at] = torch.cat(rows)
        slots = [scratch[p] for p in new]
        self.talker.prefill(self._index(slots), text.to(dev), codec.to(dev), lengths.to(dev), vectors)
        for p, slot in zip(new, slots, strict=True):
            kvs[p] = self.talker.export_prompt(slot, len(p))
            if p.cache:
                self._prompt_kv[p] = kvs[p]
        # This call's cached prompts (cached before or new) are the newest entries now: keep them all
        # (bounding by the new ones alone evicted an older one that the caller also named).
        keep = max(self.prompt_cache, sum(p in self._prompt_kv for p in wanted))
        while len(self._prompt_kv) > keep:
            self._prompt_kv.popitem(last=False)
        return kvs

    def _index(self, slots: list[int]) -> torch.Tensor:
        return torch.as_tensor(slots, dtype=torch.long).to(self.device, non_blocking=True)
