"""The PersonaPlex speech-to-speech backend (``--s2s personaplex``): Moshi's stage, with a voice and a persona.

NVIDIA's PersonaPlex (nvidia/personaplex-7b-v1; its code, github.com/NVIDIA/personaplex, is a fork of
Kyutai's ``moshi`` package, read for this stage: no ``personaplex`` package is published) is Moshi 7B
with a 16-sub-step depformer (``config.personaplex_7b``), a step that reads the user's frame one step after
it arrives (``user_lead = 1``), and a session prompt: a voice prompt (the model hears a voice sample as
its own voice) and a text persona (``S2sOpen.persona``: a session's instructions). The prompt is
prefilled when the conversation opens, in one parallel pass into the slot's ring (``prompt.py``); the
conversation then steps with every other in the batch, as Moshi's do.

Voices (``voices.py``): the samples of ``--s2s-voices-dir``, encoded once into Mimi codes; a conversation
names one (``S2sOpen.voice``) or gets ``--s2s-voice`` (unset: no voice prompt). ``S2sSpec`` lists the
voices and the prompt's room (``max_prompt_frames``): a voice and persona longer than the context are
refused at open with a clear error, as is an unknown voice. Voices are also made at run time from an
uploaded sample (``voice_records``: a ``VoiceRegistration`` submitted to this stage, encoded here a few
frames per step, kept by the gateway, not here) and named by their id: an opening that names one carries
its codes (``S2sOpen.custom_voice``), so every replica of the stage opens it alike; a persona is tokenized once per text (the check at submit and
the opening share it).

The prompt's silence and sine frames are the published Mimi's codes (``SILENCE_TOKENS``/``SINE_TOKENS``)
when the weights are a published checkpoint (card 2048, 8 codebooks), else this codec's own codes of a
silent frame and of the sine (random init).

One known difference, past the context only: the fork's streaming K/V cache (an older ``moshi``'s
``RingKVCache``) labels its oldest entry with a future position once the ring is full, so it attends 2999
frames where its training mask (``delta < context``) and Kyutai's current package attend 3000; this stage
attends 3000.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import msgspec
import numpy as np
import torch

from realtime_gw.config import GatewayConfig
from realtime_gw.models.contract import StepResult
from realtime_gw.models.families import StagePlan
from realtime_gw.models.s2s.backend import CAPABILITIES, MoshiBackend, MoshiState, build_moshi, stage_plan
from realtime_gw.models.s2s.prompt import (
    SILENCE_TOKENS,
    SINE_TOKENS,
    VoiceEmbeddings,
    prompt_frames,
    system_text,
)
from realtime_gw.models.s2s.voice_records import VOICE_RECORDS, VoiceJob, VoiceRegistrar
from realtime_gw.models.s2s.voices import VoicePrompts
from realtime_gw.records.s2s import S2sOpen, VoiceCodes
from realtime_gw.records.voice import VoiceRegistration

PROMPT_CAPABILITIES = (*CAPABILITIES, "voice_prompt", "persona")


class PersonaPlexBackend(MoshiBackend):
    name = "s2s-personaplex"
    family = "personaplex"
    capabilities = PROMPT_CAPABILITIES
    user_lead = 1

    def __init__(
        self, config: str = "tiny", path: str | None = None, device: str = "cpu", slots: int = 4, *,
        voices_dir: str | None = None, voice: str | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        """``voices_dir``: the voice store (None: no voices); ``voice``: the default voice (None: none)."""
        super().__init__(config, path, device, slots, **kwargs)
        ck, lm = self.checkpoint, self.engine.lm
        published = not ck.random_init and ck.shape.card == 2048 and ck.shape.own_q == len(SILENCE_TOKENS)
        if published:
            lm.silence_codes.copy_(torch.tensor(SILENCE_TOKENS))
        self.silence = tuple(int(c) for c in lm.silence_codes.tolist())
        self.sine = SINE_TOKENS if published else tuple(int(c) for c in self.engine.sine_codes().tolist())
        self.voices = (
            VoicePrompts.open(voices_dir, self.engine.encode_voice, ck.shape)
            if voices_dir
            else VoicePrompts()
        )
        if voice is not None:
            self.voices.prompt(voice)  # an unknown default voice is a setting error, at start
        self.default_voice = voice
        self.prompt_ms = 0.0
        """The last conversation's prompt prefill (ms, host clock, synchronised)."""
        self.spec = msgspec.structs.replace(
            self.spec, voices=self.voices.names(), default_voice=voice, max_prompt_frames=ck.shape.context + 1,
            voice_card=ck.shape.card, voice_codebooks=ck.shape.own_q,
        )
        self.info.update(voices=list(self.voices.names()), default_voice=voice,
                         prompt_codes="published" if published else "this codec's")  # fmt: skip
        self.registrar = VoiceRegistrar(self.engine, ck.shape, self.spec.max_prompt_frames)
        self._persona_tokens = functools.lru_cache(maxsize=64)(self._tokenize)
        """A persona's tokens, made once: the check at submit and the opening on the worker's thread
        (and a client secret's check) read the same (``lru_cache`` is safe across the two threads)."""
        self.prompt(S2sOpen())  # the default voice fits the context: a setting error at start otherwise

    def prompt(self, request: S2sOpen, placeholder: bool = False) -> tuple[np.ndarray, VoiceEmbeddings | None]:
        """The frames of the conversation's prompt (``prompt.prompt_frames``) and its published voice, if
        it is one; ValueError for an unknown voice, a custom voice of another codec or a prompt the context
        cannot hold. ``placeholder``: a custom voice's codes as zeros (the check at submit counts frames)."""
        name = request.voice if request.voice is not None else self.default_voice
        if request.custom_voice is not None:
            voice: np.ndarray | VoiceEmbeddings | None = self._custom(name, request.custom_voice, placeholder)
        else:
            voice = self.voices.prompt(name) if name is not None else None
        published = voice if isinstance(voice, VoiceEmbeddings) else None
        if published is not None:  # its codes are in its embeddings: placeholders here
            voice = np.zeros((published.frames, len(self.silence)), np.int64)
        assert not isinstance(voice, VoiceEmbeddings)
        persona = request.persona or ""
        tokens = self._persona_tokens(persona) if persona.strip() else ()
        frames = prompt_frames(voice, tokens, self.silence, self.sine)
        if len(frames) > self.spec.max_prompt_frames:
            raise ValueError(
                f"the voice prompt and persona take {len(frames)} frames of 80 ms; this model's context holds "
                f"{self.spec.max_prompt_frames} (voice {len(voice) if voice is not None else 0} frames, "
                f"persona {len(tokens)} tokens): use a shorter persona or voice sample"
            )
        return frames, published

    def _custom(self, name: str | None, voice: VoiceCodes, placeholder: bool) -> np.ndarray:
        """A custom voice's codes (``S2sOpen.custom_voice``), checked against this codec."""
        shape = self.checkpoint.shape
        rows = {len(r) for r in voice.codes}
        if voice.card != shape.card or rows != {shape.own_q}:
            raise ValueError(
                f"voice {name!r} was made by another codec (card {voice.card}, "
                f"{'/'.join(map(str, sorted(rows))) or 'no'} codebooks; this model's: card {shape.card}, "
                f"{shape.own_q} codebooks): make the voice again from its sample"
            )
        if placeholder:
            return np.zeros((len(voice.codes), shape.own_q), np.int64)
        codes = np.asarray(voice.codes, np.int64)
        if int(codes.min()) < 0 or int(codes.max()) >= shape.card:
            raise ValueError(f"voice {name!r}: its codes are outside the codec's card")
        return codes

    def _tokenize(self, persona: str) -> tuple[int, ...]:
        return tuple(self.checkpoint.text.encode(system_text(persona), self.checkpoint.shape.text_card))

    def check(self, request: object) -> str | None:
        """The stage's check at submit (``StagePlan.admit``, on the event loop: it only tokenizes, reads
        the voice store and counts a custom voice's frames): why a conversation's prompt cannot open, or a
        voice cannot be made (``voice_records``), or None."""
        if isinstance(request, VOICE_RECORDS):
            why = self.registrar.check(request)
            return None if why is None else f"{self.name}: {why}"
        if not isinstance(request, S2sOpen):
            return None  # refused by ``open`` as any backend refuses a wrong request
        try:
            self.prompt(request, placeholder=True)
        except ValueError as e:
            return f"{self.name}: {e}"
        return None

    def open(self, request: S2sOpen | VoiceRegistration) -> MoshiState | VoiceJob:  # type: ignore[override]
        if isinstance(request, VOICE_RECORDS):
            return self.registrar.open(request)  # framing only: the gateway normalized the sample
        if not isinstance(request, S2sOpen):
            raise TypeError(f"expected S2sOpen, got {type(request).__name__}")
        try:
            frames, voice = self.prompt(request)
        except ValueError as e:  # named as every backend's refusal is
            raise ValueError(f"{self.name}: {e}") from None
        start = time.perf_counter()
        state = self._hold(self._seed_of(request), lambda seed: self.engine.open_prompted(seed, frames, voice))
        if self.engine.device.type == "cuda":
            torch.cuda.synchronize(self.engine.device)
        elapsed = time.perf_counter() - start
        self.prompt_ms = elapsed * 1000  # in a lockstep iteration, before its step: its frames wait for it
        return state

    def warmup(self) -> None:
        super().warmup()
        self.registrar.warm()  # the voices' encoder runs first here, not inside a live step

    def has_work(self, state: MoshiState | VoiceJob) -> bool:  # type: ignore[override]
        return isinstance(state, VoiceJob) or super().has_work(state)

    def release(self, state: MoshiState | VoiceJob) -> None:  # type: ignore[override]
        if isinstance(state, VoiceJob):
            self.registrar.release(state)
        else:
            super().release(state)

    def step(self, work: list[tuple[Any, list[Any]]]) -> list[StepResult]:
        """The conversations' step; before it, the voice records' (a few frames of a voice encoded: the
        conversations' frames are late by their time, as measured against the tick; an encoding that fails
        answers its registration with the error, the conversations step on)."""
        jobs = [i for i, (state, _) in enumerate(work) if isinstance(state, VoiceJob)]
        if not jobs:
            return super().step(work)
        answers = dict(zip(jobs, self.registrar.step([work[i][0] for i in jobs]), strict=True))
        rest = [w for i, w in enumerate(work) if i not in answers]
        stepped = iter(super().step(rest) if rest else [])
        return [answers[i] if i in answers else next(stepped) for i in range(len(work))]


def from_config(config: GatewayConfig) -> StagePlan:
    backend = build_moshi(config, PersonaPlexBackend, voices_dir=config.s2s_voices_dir, voice=config.s2s_voice)
    assert isinstance(backend, PersonaPlexBackend)
    plan = stage_plan(config, backend)
    plan.admit = backend.check  # a prompt that does not fit is refused at submit, not as a fault of the stream
    return plan
