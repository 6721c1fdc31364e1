"""PersonaPlex voices made at run time (``/v1/audio/voices`` with ``model: personaplex``), through the
stage-worker interface: the server submits a ``VoiceRegistration`` (or ``VoiceRemoval``) to the
speech-to-speech worker like any request, and the stage makes the voice prompt itself.

A registration's sample (float32 mono at 24 kHz, as ``protocols.voices`` decodes an upload) is brought
to -24 LUFS (``voices.normalized``, as a sample of ``--s2s-voices-dir``) and encoded by the stage's own
Mimi into codes, one frame per 80 ms, the codes a sample of the voice directory gets at start-up.
Conversations hold the engine's encoder slots, so a voice is encoded in an encoder of its own
(``MoshiEngine.voice_encoder``), a few frames per stage step (up to ``VOICE_FRAMES_PER_STEP``, none
started past ``VOICE_STEP_BUDGET_S``): a registration adds a bounded time to each step of the
conversations live meanwhile (counted as their lateness) instead of one stall of the whole sample. One voice is encoded at a time; others wait their turn.

The answer (``VoiceAdded``) carries the codes and the codec's card: the server keeps them
(``server/voice_library.py``, files 0600) and registers them again after a restart, so nothing is
encoded again (codes of another codec are refused). A voice prompt must leave room in the context for
the prompt's silences: a longer sample is refused at submit (``check``), before anything is computed.
Custom voices live beside the directory's (``VoicePrompts.custom``) but are not listed in the stage's
``S2sSpec.voices``: the gateway lets only the API key that made one name it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from realtime_gw.models.contract import StepResult
from realtime_gw.models.s2s.config import MoshiShape
from realtime_gw.models.s2s.engine import MoshiEngine
from realtime_gw.models.s2s.prompt import SILENCE_FRAMES
from realtime_gw.models.s2s.voices import VoicePrompts, normalized
from realtime_gw.records.voice import VoiceAdded, VoiceRegistration, VoiceRemoval

VOICE_RECORDS = (VoiceRegistration, VoiceRemoval)
VOICE_FRAMES_PER_STEP = 8
"""Most frames of a voice sample encoded per stage step (0.64 s of audio)."""
VOICE_STEP_BUDGET_S = 0.010
"""Encoding time per step after which no further frame is started (at least one frame a step): what a
registration adds to each step of the conversations, whatever the hardware encodes a frame in."""
SAMPLE_RATE = 24000
QUIETEST_SAMPLE_DBFS = -60.0
"""A sample quieter than this (RMS) is refused at submit: its loudness could not be measured (BS.1770's
absolute gate is -70 LUFS), so it could not be brought to the prompt's level."""


@dataclass(eq=False)
class VoiceJob:
    """A voice record on the stage: answered at its first step (a removal, codes given) or once its
    sample is encoded."""

    voice_id: str
    pcm: np.ndarray | None = None
    """``(frames, hop)``: the normalized sample still to encode (None: nothing to encode)."""
    codes: list[np.ndarray] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    released: bool = False


class VoiceRegistrar:
    """The stage's custom voices: checks a record at submit, opens it, encodes a few frames per step."""

    def __init__(self, engine: MoshiEngine, shape: MoshiShape, store: VoicePrompts, max_prompt_frames: int) -> None:
        self.engine = engine
        self.shape = shape
        self.store = store
        self.max_voice_frames = max_prompt_frames - 2 * SILENCE_FRAMES
        """A voice prompt's most frames: the prompt's two silences still fit (with no persona)."""
        self._encoding: VoiceJob | None = None

    def check(self, request: VoiceRegistration | VoiceRemoval) -> str | None:
        """Why the stage cannot make this voice (checked at submit, before any work), or None."""
        if isinstance(request, VoiceRemoval):
            return None
        if request.kind != "audio_sample":
            return (f"this speech-to-speech model makes voices from audio samples only (a voice prompt is a "
                    f"recording of the voice), not {request.kind!r} voices")  # fmt: skip
        if request.codes:
            return self._check_codes(request)
        pcm = np.frombuffer(request.sample, "<f4")
        frames = -(-len(pcm) // self.engine.hop)
        if frames > self.max_voice_frames:
            most = self.max_voice_frames * self.engine.hop / SAMPLE_RATE
            return (f"the voice sample lasts {len(pcm) / SAMPLE_RATE:.1f} s; this model's context holds a "
                    f"voice prompt of at most {most:.1f} s")  # fmt: skip
        rms = float(np.sqrt(np.mean(np.square(pcm, dtype=np.float64)))) if len(pcm) else 0.0
        if rms <= 10 ** (QUIETEST_SAMPLE_DBFS / 20):
            return f"the voice sample is silent or too quiet (below {QUIETEST_SAMPLE_DBFS:g} dBFS)"
        return None

    def _check_codes(self, request: VoiceRegistration) -> str | None:
        rows = {len(r) for r in request.codes}
        if request.card != self.shape.card or rows != {self.shape.own_q}:
            return (f"the voice's codes were made by another codec (card {request.card}, "
                    f"{'/'.join(map(str, sorted(rows)))} codebooks; this model's: {self.shape.card}, "
                    f"{self.shape.own_q})")  # fmt: skip
        if len(request.codes) > self.max_voice_frames:
            return f"the voice takes {len(request.codes)} frames; this model's context holds {self.max_voice_frames}"
        if min(min(r) for r in request.codes) < 0 or max(max(r) for r in request.codes) >= self.shape.card:
            return "the voice's codes are outside the codec's card"
        return None

    def open(self, request: VoiceRegistration | VoiceRemoval) -> VoiceJob:
        if (why := self.check(request)) is not None:
            raise ValueError(why)
        if isinstance(request, VoiceRemoval):
            self.store.custom.pop(request.voice_id, None)
            return VoiceJob(request.voice_id)
        if request.codes:
            codes = np.asarray(request.codes, np.int64)
            self.store.custom[request.voice_id] = codes
            return VoiceJob(request.voice_id, outputs=[self._added(request.voice_id, codes)])
        pcm = normalized(np.frombuffer(request.sample, "<f4"))  # ValueError: silent
        hop = self.engine.hop
        frames = -(-len(pcm) // hop)
        padded = np.zeros(frames * hop, np.float32)
        padded[: len(pcm)] = pcm
        return VoiceJob(request.voice_id, pcm=padded.reshape(frames, hop))

    def step(self, jobs: list[VoiceJob]) -> list[StepResult]:
        """Each job's answer when it has one; the encoding job encodes its next frames."""
        if self._encoding is None or self._encoding.released:
            self._encoding = next((j for j in jobs if j.pcm is not None), None)
            if self._encoding is not None:
                self._reset()
        if self._encoding is not None:
            self._encode(self._encoding)
        results = []
        for job in jobs:
            done = job.pcm is None
            results.append(StepResult(outputs=job.outputs if done else [], done=done))
        return results

    def release(self, job: VoiceJob) -> None:
        job.released = True
        if job is self._encoding:
            self._encoding = None

    @torch.no_grad()
    def _encode(self, job: VoiceJob) -> None:
        assert job.pcm is not None
        encoder, device = self.engine.voice_encoder(), self.engine.device
        active = torch.ones(1, dtype=torch.bool, device=device)
        start, began = len(job.codes), time.perf_counter()
        for frame in torch.from_numpy(job.pcm[start : start + VOICE_FRAMES_PER_STEP]).to(device):
            job.codes.append(encoder.step(1, frame[None], active)[0].cpu().numpy())  # the copy syncs
            if time.perf_counter() - began >= VOICE_STEP_BUDGET_S:
                break
        if len(job.codes) == len(job.pcm):
            codes = np.stack(job.codes).astype(np.int64)
            self.store.custom[job.voice_id] = codes
            job.outputs, job.pcm, job.codes = [self._added(job.voice_id, codes)], None, []
            self._encoding = None

    def _reset(self) -> None:
        self.engine.voice_encoder().reset(torch.zeros(1, dtype=torch.long, device=self.engine.device))

    def _added(self, voice_id: str, codes: np.ndarray) -> VoiceAdded:
        return VoiceAdded(voice_id, codes=tuple(tuple(int(c) for c in row) for row in codes), card=self.shape.card)
