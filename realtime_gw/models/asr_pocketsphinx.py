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
from realtime_gw.models.types import AsrRequest, AsrResult
from realtime_gw.protocols.audio import resample

log = logging.getLogger(__name__)

ASR_RATE = 16000
"""The bundled acoustic model is trained on 16 kHz audio."""


@dataclass(eq=False)
class AsrState:
    slot: int
    decoder: Any
    pcm16k: bytes
    decoded: bool = False


class PocketsphinxAsrBackend:
    name = "asr-pocketsphinx"

    def __init__(self, slots: int = 4, **decoder_kwargs: Any) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self._decoder_kwargs = {"loglevel": "ERROR", **decoder_kwargs}
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
        d = state.decoder
        d.start_utt()
        try:
            if state.pcm16k:
                # full_utt=True: batch cepstral mean normalisation over the whole utterance (more
                # accurate than the live estimate, and we have the whole utterance anyway).
                d.process_raw(state.pcm16k, no_search=False, full_utt=True)
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
