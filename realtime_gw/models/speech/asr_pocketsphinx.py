"""PocketSphinx ASR backend (CPU), using the en-US model that ships inside the ``pocketsphinx`` wheel.

One-shot: each request is a committed utterance (``AsrRequest.pcm``); it is decoded in one ``step``
and finishes. Decoders are preallocated slots (loading one takes ~0.5 s), so ``open`` is just taking
a free one, and a full pool answers ``NoFreeSlot`` at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from realtime_gw.models.runtime import NoFreeSlot, StepResult
from realtime_gw.protocols.audio import resample
from realtime_gw.records.voice import AsrRequest, AsrResult

log = logging.getLogger(__name__)

ASR_RATE = 16000
"""The bundled acoustic model is trained on 16 kHz audio."""


@dataclass(eq=False)
class AsrState:
    slot: int
    decoder: Any
    pcm16k: bytes
    decoded: bool = False


def trim_silence(pcm16k: bytes, margin_ms: int = 200, floor: float = 0.02) -> bytes:
    """Cut leading and trailing near-silence (keeping a margin): batch CMN averages over the whole
    utterance, and long silent stretches around the words skew it and cost accuracy."""
    x = np.frombuffer(pcm16k, dtype="<i2").astype(np.float32)
    hop = ASR_RATE // 100  # 10 ms
    n = len(x) // hop
    if n == 0:
        return pcm16k
    rms = np.sqrt(np.mean(x[: n * hop].reshape(n, hop) ** 2, axis=1))
    loud = np.flatnonzero(rms > max(rms.max() * floor, 30.0))
    if loud.size == 0:
        return pcm16k
    margin = margin_ms // 10
    lo = max(0, loud[0] - margin) * hop
    hi = min(n, loud[-1] + 1 + margin) * hop
    return pcm16k[2 * lo : 2 * hi]


class PocketsphinxAsrBackend:
    name = "asr-pocketsphinx"

    def __init__(self, slots: int = 4, **decoder_kwargs: Any) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        # dither: digital silence (all zeros) otherwise decodes to a random word ("dog", "ah"); a fixed
        # seed keeps results reproducible. Measured: no WER change on speech.
        self._decoder_kwargs = {"loglevel": "ERROR", "dither": True, "seed": 1, **decoder_kwargs}
        self._decoders: list[Any] = []
        self._free: list[int] = []

    def _ensure_pool(self) -> None:
        # Built lazily on the worker thread (warm-up or first open): ~0.5 s per decoder must not run on
        # the event loop when the registry constructs backends.
        if self._decoders:
            return
        from pocketsphinx import Decoder

        self._decoders = [Decoder(**self._decoder_kwargs) for _ in range(self.slots)]
        self._free = list(range(self.slots - 1, -1, -1))

    @property
    def free_slots(self) -> int:
        return len(self._free) if self._decoders else self.slots

    def open(self, request: AsrRequest) -> AsrState:
        if len(request.pcm) % 2:
            raise ValueError(f"PCM16 data must have an even number of bytes, got {len(request.pcm)}")
        if request.sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {request.sample_rate}")
        self._ensure_pool()
        if not self._free:
            raise NoFreeSlot(f"{self.name}: no free slot ({self.slots} decoders busy)")
        pcm16k = resample(request.pcm, request.sample_rate, ASR_RATE)  # before taking the slot: may raise
        slot = self._free.pop()
        return AsrState(slot=slot, decoder=self._decoders[slot], pcm16k=pcm16k)

    def has_work(self, state: AsrState) -> bool:
        return not state.decoded

    def step(self, work: list[tuple[AsrState, list[Any]]]) -> list[StepResult]:
        results = []
        for state, _inputs in work:  # pushed inputs are ignored: the utterance came with the request
            try:
                results.append(StepResult(outputs=[AsrResult(self._decode(state))], done=True))
            except Exception as e:  # fail this utterance only
                log.warning("%s: decode failed: %s", self.name, e)
                results.append(StepResult(done=True, error=f"{self.name}: {e}"))
            state.decoded = True
        return results

    def _decode(self, state: AsrState) -> str:
        if len(state.pcm16k) < 2 * ASR_RATE // 10:
            return ""  # under 100 ms: no word fits, and the search errors on a too-short utterance
        pcm = trim_silence(state.pcm16k)
        d = state.decoder
        d.start_utt()
        try:
            # full_utt=True: batch cepstral mean normalisation over the whole utterance (more
            # accurate than the live estimate, and we have the whole utterance anyway).
            d.process_raw(pcm, no_search=False, full_utt=True)
        finally:
            d.end_utt()
        hyp = d.hyp()
        return hyp.hypstr.strip() if hyp is not None else ""

    def release(self, state: AsrState) -> None:
        if state.decoder is not None:
            state.decoder = None
            self._free.append(state.slot)

    def warmup(self) -> None:
        self._ensure_pool()
        # One real decode per decoder: a second of low noise, so each slot has run its search once.
        rng = np.random.default_rng(0)
        clip = (rng.standard_normal(ASR_RATE) * 100).astype("<i2").tobytes()
        states = [self.open(AsrRequest(pcm=clip, sample_rate=ASR_RATE)) for _ in range(self.slots)]
        try:
            self.step([(s, []) for s in states])
        finally:
            for s in states:
                self.release(s)
