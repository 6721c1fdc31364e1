"""Qwen3-TTS on the shared slot engine: prompts, prefill of new streams, then one frame per step.

``Qwen3Engine`` is a ``SlotEngine`` (``codec/slots.py``: slots, batch/KV-length buckets, one CUDA graph
per bucket for the frame step) over ``Qwen3TalkerRuntime`` + ``StreamingQwen3Decoder``. A stream is
opened with its prompt (``alloc(prompt)``); at the next step every new stream's prompt is prefilled in one
batched pass before the frame step, so a stream's first audio leaves in its first step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from realtime_gw.models.speech.codec.slots import SlotEngine
from realtime_gw.models.speech.qwen3.checkpoint import Qwen3TtsCheckpoint
from realtime_gw.models.speech.qwen3.decoder import StreamingQwen3Decoder
from realtime_gw.models.speech.qwen3.talker import Qwen3TalkerRuntime, Sampling

NO_CODEC = -1


@dataclass(frozen=True)
class Prompt:
    """The prefill of one stream: per position a text id and a codec id (``NO_CODEC`` = text only)."""

    text_ids: tuple[int, ...]
    codec_ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.text_ids)


def build_prompt(ck: Qwen3TtsCheckpoint, role_ids: list[int], speaker: str | None, language: str) -> Prompt:
    """The reference's streaming-mode prompt for CustomVoice, less its last position (first text token +
    codec BOS: the first frame step's input). ``role_ids``: ``<|im_start|>assistant\\n`` tokenized."""
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
    if spk_id is not None:
        codec.append(spk_id)
    codec += [c["codec_pad_id"]]  # then codec BOS, which rides on the first frame step
    cfg = ck.config
    text = [*role_ids, *[cfg["tts_pad_token_id"]] * (len(codec) - 1), cfg["tts_bos_token_id"]]
    return Prompt(tuple(int(t) for t in text), (*[NO_CODEC] * len(role_ids), *(int(x) for x in codec)))


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
    ) -> None:
        sampling = sampling or Sampling.from_generation(ck.generation)
        talker = Qwen3TalkerRuntime(ck, slots, max_positions, sampling)
        decoder = StreamingQwen3Decoder(ck.decoder, slots)
        super().__init__(
            talker,
            decoder,
            slots,
            max_positions=max_positions,
            num_codebooks=talker.num_codebooks,
            device=next(ck.talker.parameters()).device,
            cuda_graphs=cuda_graphs,
        )
        self._prompts: dict[int, Prompt] = {}

    def alloc_prompt(self, prompt: Prompt) -> int:
        """A slot for a new stream with ``prompt`` (prefilled at the next step); NoFreeSlot when full."""
        if len(prompt) >= self.max_positions:
            raise ValueError(f"prompt of {len(prompt)} positions does not fit {self.max_positions}")
        slot = self.alloc()
        self._prompts[slot] = prompt
        self.frames[slot] = len(prompt)  # host mirror of the talker position after prefill
        return slot

    def free(self, slot: int) -> None:
        self._prompts.pop(slot, None)
        super().free(slot)

    def _reset_fresh(self) -> None:
        """Reset the decoder state of every stream opened since the last step and prefill their prompts,
        all in one batch (prompts right-padded; pad positions are never attended)."""
        if not self._fresh:
            return
        fresh = [s for s in self._fresh if s in self._prompts]
        self._fresh = []
        if not fresh:
            return
        prompts = [self._prompts.pop(s) for s in fresh]
        width = max(len(p) for p in prompts)
        text = torch.zeros(len(fresh), width, dtype=torch.long)
        codec = torch.full((len(fresh), width), NO_CODEC, dtype=torch.long)
        for i, p in enumerate(prompts):
            text[i, : len(p)] = torch.as_tensor(p.text_ids)
            codec[i, : len(p)] = torch.as_tensor(p.codec_ids)
        lengths = torch.as_tensor([len(p) for p in prompts], dtype=torch.long)
        dev = self.device
        idx = torch.as_tensor(fresh, dtype=torch.long).to(dev)
        self.decoder.reset(idx)
        self.talker.prefill(idx, text.to(dev), codec.to(dev), lengths.to(dev))
