"""PersonaPlex voices made at run time (``/v1/audio/voices`` with ``model: personaplex``), through the
stage-worker interface: the server submits a ``VoiceRegistration`` to the speech-to-speech worker like any
request, and the stage encodes the voice prompt.

A registration's sample is float32 mono at 24 kHz already brought to -24 LUFS by the gateway
(``protocols.loudness.normalized``, in a thread beside the upload's decoding; a silent sample is refused
there with a 400), as a sample of ``--s2s-voices-dir`` is at start. The stage only frames it and encodes it
with its own Mimi into codes, one frame per 80 ms. Conversations hold the engine's encoder slots, so a voice
is encoded in an encoder of its own (``MoshiEngine.voice_encoder``, built with the stage and run once at
warm-up, never first inside a live step), a few frames per stage step (up to
``VOICE_FRAMES_PER_STEP``, none started past ``VOICE_STEP_BUDGET_S``): a registration adds a bounded time
to each step of the conversations live meanwhile (counted as their lateness) instead of one stall of the
whole sample. One voice is encoded at a time; others wait their turn. An encoding that fails fails its
voice alone (an error on its registration's stream): the conversations of that step go on.

The answer (``VoiceAdded``) carries the codes and the codec's card, and the stage keeps nothing: the
server's library keeps them (``server/voice_library.py``, files 0600 with ``--voices-dir``) and an opening
that names the voice carries them (``S2sOpen.custom_voice``), so every replica of a stage served by Ray,
or one restarted, opens it alike, and deleting a voice is the library's alone. A voice prompt must leave
room in the context for the prompt's silences: a longer sample is refused at submit (``check``), before
anything is computed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from realtime_gw.models.contract import StepResult
from realtime_gw.models.s2s.config import MoshiShape
from realtime_gw.models.s2s.engine import MoshiEngine
from realtime_gw.models.s2s.prompt import SILENCE_FRAMES
from realtime_gw.records.voice import VoiceAdded, VoiceRegistration

VOICE_RECORDS = (VoiceRegistration,)
VOICE_FRAMES_PER_STEP = 8
"""Most frames of a voice sample encoded per stage step (0.64 s of audio)."""
VOICE_STEP_BUDGET_S = 0.010
"""Encoding time per step after which no further frame is started (at least one frame a step): what a
registration adds to each step of the conversations, whatever the hardware encodes a frame in."""
SAMPLE_RATE = 24000

log = logging.getLogger(__name__)


@dataclass(eq=False)
class VoiceJob:
    """A voice registration on the stage: answered once its sample is encoded."""

    voice_id: str
    pcm: np.ndarray | None = None
    """``(frames, hop)``: the sample still to encode (None: encoded)."""
    codes: list[np.ndarray] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    error: str | None = None
    """Why the encoding failed (the registration is answered with it)."""
    released: bool = False


class VoiceRegistrar:
    """Makes the stage's custom voices: checks a registration at submit, opens it, encodes a few frames per
    step. It keeps no voice: the answer's codes are the voice."""

    def __init__(self, engine: MoshiEngine, shape: MoshiShape, max_prompt_frames: int) -> None:
        self.engine = engine
        self.shape = shape
        self.max_voice_frames = max_prompt_frames - 2 * SILENCE_FRAMES
        """A voice prompt's most frames: the prompt's two silences still fit (with no persona)."""
        self._encoding: VoiceJob | None = None
        self.encoder = engine.voice_encoder()
        """The voices' own one-slot encoder, built here with the stage (``warm`` runs it once)."""

    def check(self, request: VoiceRegistration) -> str | None:
        """Why the stage cannot make this voice (checked at submit, on the event loop: only sizes), or None."""
        if request.kind != "audio_sample":
            return (f"this speech-to-speech model makes voices from audio samples only (a voice prompt is a "
                    f"recording of the voice), not {request.kind!r} voices")  # fmt: skip
        samples = len(request.sample) // 4
        if not samples or len(request.sample) % 4:
            return "the voice sample is empty or not float32 PCM"
        if -(-samples // self.engine.hop) > self.max_voice_frames:
            most = self.max_voice_frames * self.engine.hop / SAMPLE_RATE
            return (f"the voice sample lasts {samples / SAMPLE_RATE:.1f} s; this model's context holds a "
                    f"voice prompt of at most {most:.1f} s")  # fmt: skip
        return None

    def open(self, request: VoiceRegistration) -> VoiceJob:
        if (why := self.check(request)) is not None:
            raise ValueError(why)
        pcm = np.frombuffer(request.sample, "<f4")
        hop = self.engine.hop
        frames = -(-len(pcm) // hop)
        padded = np.zeros(frames * hop, np.float32)
        padded[: len(pcm)] = pcm
        return VoiceJob(request.voice_id, pcm=padded.reshape(frames, hop))

    def step(self, jobs: list[VoiceJob]) -> list[StepResult]:
        """Each job's answer when it has one; the encoding job encodes its next frames."""
        if self._encoding is None or self._encoding.released:
            self._encoding = next((j for j in jobs if j.pcm is not None and j.error is None), None)
        if (current := self._encoding) is not None:
            try:
                if not current.codes:  # its first frames: from a reset encoder
                    self._reset()
                self._encode(current)
            except Exception as e:  # this voice fails alone: the conversations' step goes on
                log.exception("%s: encoding voice %s failed", self.engine.name, current.voice_id)
                current.error, current.pcm, current.codes = f"encoding the voice failed: {e}", None, []
                self._encoding = None
        results = []
        for job in jobs:
            done = job.pcm is None
            results.append(StepResult(outputs=job.outputs if done else [], done=done, error=job.error))
        return results

    @torch.no_grad()
    def warm(self) -> None:
        """One frame of silence through the voices' encoder (at the stage's warm-up), then reset."""
        self._reset()
        frame = torch.zeros(1, self.engine.hop, device=self.engine.device)
        self.encoder.step(1, frame, torch.ones(1, dtype=torch.bool, device=self.engine.device))
        self._reset()

    def release(self, job: VoiceJob) -> None:
        job.released = True
        if job is self._encoding:
            self._encoding = None

    @torch.no_grad()
    def _encode(self, job: VoiceJob) -> None:
        assert job.pcm is not None
        encoder, device = self.encoder, self.engine.device
        active = torch.ones(1, dtype=torch.bool, device=device)
        start, began = len(job.codes), time.perf_counter()
        for frame in torch.from_numpy(job.pcm[start : start + VOICE_FRAMES_PER_STEP]).to(device):
            job.codes.append(encoder.step(1, frame[None], active)[0].cpu().numpy())  # the copy syncs
            if time.perf_counter() - began >= VOICE_STEP_BUDGET_S:
                break
        if len(job.codes) == len(job.pcm):
            codes = np.stack(job.codes).astype(np.int64)
            job.outputs, job.pcm, job.codes = [self._added(job.voice_id, codes)], None, []
            self._encoding = None

    def _reset(self) -> None:
        self.encoder.reset(torch.zeros(1, dtype=torch.long, device=self.engine.device))

    def _added(self, voice_id: str, codes: np.ndarray) -> VoiceAdded:
        return VoiceAdded(voice_id, codes=tuple(tuple(int(c) for c in row) for row in codes), card=self.shape.card)
