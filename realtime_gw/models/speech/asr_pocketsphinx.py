"""PocketSphinx ASR backend (CPU), using the en-US model that ships inside the ``pocketsphinx`` wheel.

Streaming: an ``AsrStreamRequest`` takes a decoder when the user starts speaking; the PCM pushed to
it is decoded as it arrives (``process_raw`` per 100 ms block), each step reports the partial
hypothesis when it changed (``AsrResult(final=False)``), and ``END_OF_INPUT`` ends the utterance:
the transcript (``final=True``) comes in that same step, so it is ready when the turn is committed.
A one-shot ``AsrRequest`` (an ``input_audio`` item, or a turn whose stream could not be had) has the
whole utterance up front: one step, batch CMN over the utterance trimmed of long silences (more
robust than any running estimate on a mismatched channel, e.g. 8 kHz telephone audio).

Streamed cepstral mean normalisation: the model's initial mean is far from real speech and the live estimate
moves slowly, so each utterance starts from the batch mean of its own first 0.5 s of speech (a
feature-only pass, no search; leading silence skipped), then decodes live from its beginning. Measured on six Piper sentences: the same
mean WER as the one-shot decode at 16/24 kHz, and words equal to it on the test sentences. Fixed blocks make the words
independent of how the client chunked its audio, and no state carries over from a decoder's previous
utterance (another session's).

Decoders are preallocated slots (loading one takes ~0.3 s and ~90 MB), so ``open`` is just taking a
free one, and a full pool answers ``NoFreeSlot`` at once.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from realtime_gw.config import ConfigError, GatewayConfig
from realtime_gw.models.families import StagePlan
from realtime_gw.models.runtime import END_OF_INPUT, NoFreeSlot, StepResult
from realtime_gw.models.speech.asr_base import AsrBackendBase, check_pcm, noise_clip, utterance_bound
from realtime_gw.protocols.audio import resample
from realtime_gw.records.voice import AsrRequest, AsrResult, AsrStreamRequest, TrailingSilence, WordTime

log = logging.getLogger(__name__)

ASR_RATE = 16000
"""The bundled acoustic model is trained on 16 kHz audio."""
BLOCK_BYTES = 2 * ASR_RATE // 10
"""100 ms of 16 kHz PCM16: the unit ``process_raw`` is fed in."""
CMN_PRIME_BYTES = ASR_RATE
"""The first half second of speech sets the utterance's cepstral mean (the first words wait for it)."""
SPEECH_RMS = 100.0
"""A 10 ms frame louder than this (about -50 dBFS) is where speech may begin: silence before it (a
client that streams from its first append) would make a useless mean."""
MAX_PRIME_WAIT_BYTES = 2 * ASR_RATE * 10
"""With no speech after 10 s the decode starts anyway (bounded memory, and words, if any, come)."""
MAX_BLOCKS_PER_STEP = 5
"""A step decodes at most 0.5 s of a stream's audio: a stream that fell behind (a busy box) catches up
over several steps, so no step grows past the worker's deadline and other streams get their turn."""
FRAMES_PER_S = 100
"""The decoder's feature frame rate: segment frames to seconds."""
MIN_UTTERANCE_BYTES = 2 * ASR_RATE // 10
"""Under 100 ms no word fits, and the search errors on a too-short utterance."""


@dataclass(eq=False)
class AsrState:
    slot: int
    decoder: Any
    resampler: FloatResampler
    pending: bytearray = field(default_factory=bytearray)
    """16 kHz PCM not yet decoded (the first 0.5 s until it is complete, then less than a block)."""
    decoded_bytes: int = 0
    ended: bool = False
    whole: bytes | None = None
    """A one-shot request's utterance (16 kHz), decoded in its first step."""
    in_utterance: bool = False
    dither: Dither = field(default_factory=lambda: Dither())
    partial: str = ""
    """The last partial hypothesis reported."""
    word_times: bool = False


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


class PocketsphinxAsrBackend(AsrBackendBase):
    name = "asr-pocketsphinx"
    native_rate = ASR_RATE
    word_times = True

    def __init__(self, slots: int = 4, **decoder_kwargs: Any) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        # Dither: digital silence (all zeros) otherwise decodes to a random word ("dog", "ah"). Ours, per
        # utterance (``Dither``): pocketsphinx's own draws from one process-wide generator, so streams
        # decoded side by side would change each other's words.
        # seed keeps results reproducible. Measured: no WER change on speech.
        self._decoder_kwargs = {"loglevel": "ERROR", "dither": False, **decoder_kwargs}
        self._decoders: list[Any] = []
        self._free: list[int] = []

    def _ensure_pool(self) -> None:
        # Built lazily on the worker thread (warm-up or first open): ~0.3 s per decoder must not run on
        # the event loop when the registry constructs backends.
        if self._decoders:
            return
        from pocketsphinx import Decoder

        self._decoders = [Decoder(**self._decoder_kwargs) for _ in range(self.slots)]
        self._free = list(range(self.slots - 1, -1, -1))

    @property
    def free_slots(self) -> int:
        return len(self._free) if self._decoders else self.slots

    def open(self, request: AsrRequest | AsrStreamRequest) -> AsrState:
        self.check_request(request)
        resampler = FloatResampler(request.sample_rate)
        whole = None
        if isinstance(request, AsrRequest):
            whole = resample(request.pcm, request.sample_rate, ASR_RATE)  # before taking the slot: may raise
        self._ensure_pool()
        if not self._free:
            raise NoFreeSlot(f"{self.name}: no free slot ({self.slots} decoders busy)")
        slot = self._free.pop()
        word_times = isinstance(request, AsrStreamRequest) and request.word_times
        return AsrState(slot, self._decoders[slot], resampler, whole=whole, word_times=word_times)

    def has_work(self, state: AsrState) -> bool:
        if state.whole is not None:
            return True  # a one-shot request decodes in its first step
        primed = state.in_utterance or _primable(state.pending)
        return state.ended or (primed and len(state.pending) >= BLOCK_BYTES)  # audio left from a step

    def step(self, work: list[tuple[AsrState, list[Any]]]) -> list[StepResult]:
        results = []
        for state, inputs in work:
            try:
                results.append(self._advance(state, inputs))
            except Exception as e:  # fail this utterance only
                results.append(self._failed(e))
        return results

    def _advance(self, state: AsrState, inputs: list[Any]) -> StepResult:
        if state.whole is not None:  # pushed inputs are ignored: the utterance came with the request
            return StepResult(outputs=[AsrResult(self._decode_whole(state))], done=True)
        for item in inputs:
            if item is END_OF_INPUT:
                state.pending += state.dither(state.resampler.flush())
                state.ended = True
            elif isinstance(item, TrailingSilence):
                continue  # no text lag to flush: the decode ends with the audio
            elif isinstance(item, (bytes, bytearray, memoryview)):
                if state.ended:
                    raise ValueError("audio pushed after END_OF_INPUT")
                check_pcm(item)
                state.pending += state.dither(state.resampler.push(bytes(item)))
            else:
                raise TypeError(f"ASR input must be PCM16 bytes, got {type(item).__name__}")
        if state.ended and len(state.pending) <= MAX_BLOCKS_PER_STEP * BLOCK_BYTES:
            text = self._finish(state)
            words = _word_times(state.decoder) if state.word_times and text else [] if state.word_times else None
            return StepResult(outputs=[AsrResult(text, words=words)], done=True)
        if not state.in_utterance and not state.ended and not _primable(state.pending):
            return StepResult()
        if not self._decode_blocks(state, MAX_BLOCKS_PER_STEP):
            return StepResult()
        hyp = state.decoder.hyp()
        text = hyp.hypstr.strip() if hyp is not None else ""
        if text == state.partial:
            return StepResult()
        state.partial = text
        return StepResult(outputs=[AsrResult(text, final=False)])

    def _start(self, state: AsrState) -> None:
        """Set the cepstral mean from the utterance's first 0.5 s of speech, then start decoding it
        from its beginning."""
        d = state.decoder
        d.reinit_feat()  # fresh front end: CMN as at load, whatever the decoder did before
        d.start_utt()
        lo = _speech_start(state.pending) or 0
        d.process_raw(bytes(state.pending[lo : lo + CMN_PRIME_BYTES]), no_search=True, full_utt=True)
        d.end_utt()
        d.set_cmn(d.get_cmn())
        d.start_utt()
        state.in_utterance = True

    def _decode_blocks(self, state: AsrState, max_blocks: int | None = None) -> int:
        """Decode the whole blocks pending (at most ``max_blocks``); returns the bytes decoded."""
        if not state.in_utterance:
            self._start(state)
        full = len(state.pending) - len(state.pending) % BLOCK_BYTES
        if max_blocks is not None:
            full = min(full, max_blocks * BLOCK_BYTES)
        for i in range(0, full, BLOCK_BYTES):
            state.decoder.process_raw(
                bytes(state.pending[i : i + BLOCK_BYTES]), no_search=False, full_utt=False
            )
        del state.pending[:full]
        state.decoded_bytes += full
        return full

    def _finish(self, state: AsrState) -> str:
        if state.decoded_bytes + len(state.pending) < MIN_UTTERANCE_BYTES:
            return ""
        self._decode_blocks(state)
        d = state.decoder
        if state.pending:
            d.process_raw(bytes(state.pending), no_search=False, full_utt=False)
            state.pending.clear()
        state.in_utterance = False
        d.end_utt()
        hyp = d.hyp()
        return hyp.hypstr.strip() if hyp is not None else ""

    def _decode_whole(self, state: AsrState) -> str:
        assert state.whole is not None
        pcm, state.whole = state.whole, None
        if len(pcm) < MIN_UTTERANCE_BYTES:
            return ""
        d = state.decoder
        d.reinit_feat()  # fresh front end: CMN as at load, whatever the decoder did before
        d.start_utt()
        state.in_utterance = True
        pcm = Dither()(pcm)
        # full_utt=True: batch cepstral mean normalisation over the whole (trimmed) utterance.
        d.process_raw(trim_silence(pcm), no_search=False, full_utt=True)
        state.in_utterance = False
        d.end_utt()
        hyp = d.hyp()
        return hyp.hypstr.strip() if hyp is not None else ""

    def release(self, state: AsrState) -> None:
        if state.decoder is None:
            return
        if state.in_utterance:
            # Cancelled (or failed) mid-utterance: close it so the decoder can start the next one.
            try:
                state.decoder.end_utt()
            except Exception:  # the decoder stays usable
                log.debug("%s: end_utt on release failed", self.name, exc_info=True)
        state.decoder = None
        self._free.append(state.slot)

    def _warm_up(self) -> dict[str, Any]:
        self._ensure_pool()
        # One real decode per decoder: a second of low noise, so each slot has run its search once.
        clip = noise_clip(ASR_RATE)
        states: list[AsrState] = []
        try:  # slots taken before an open fails (another request holds one) come back too
            for _ in range(self.slots):
                states.append(self.open(AsrRequest(pcm=clip, sample_rate=ASR_RATE)))
            self.step([(s, []) for s in states])
        finally:
            for s in states:
                self.release(s)
        return {"decoders": len(states)}


class Dither:
    """Adds 1 to about a quarter of the samples (pocketsphinx's own dither), from a generator of the
    utterance's own: the same audio gets the same noise however it was chunked or interleaved."""

    def __init__(self, seed: int = 1) -> None:
        self._rng = np.random.default_rng(seed)

    def __call__(self, pcm16: bytes) -> bytes:
        x = np.frombuffer(pcm16, dtype="<i2")
        if x.size == 0:
            return pcm16
        bump = self._rng.random(x.size) < 0.25  # one draw per sample, in order: chunking-independent
        return np.minimum(x.astype(np.int32) + bump, 32767).astype("<i2").tobytes()


class FloatResampler:
    """To 16 kHz in float32: soxr's int16 streams dither their output, so the samples (and the words)
    would depend on how the audio was chunked; float32 streams do not."""

    def __init__(self, in_rate: int) -> None:
        import soxr

        self._stream = (
            None if in_rate == ASR_RATE else soxr.ResampleStream(in_rate, ASR_RATE, 1, dtype="float32")
        )

    def push(self, pcm16: bytes, last: bool = False) -> bytes:
        if self._stream is None:
            return pcm16
        x = np.frombuffer(pcm16, dtype="<i2").astype(np.float32)
        y = self._stream.resample_chunk(x, last=last)
        return np.clip(np.rint(y), -32768, 32767).astype("<i2").tobytes()

    def flush(self) -> bytes:
        return self.push(b"", last=True)


def _word_times(decoder: Any) -> list[WordTime]:
    """The last utterance's words with their times (fillers, silences and sentence marks left out;
    alternate pronunciations' ``(2)`` cut)."""
    out = []
    for seg in decoder.seg():
        word = seg.word
        if not word or word[0] in "<[":
            continue
        out.append(WordTime(word.split("(")[0], seg.start_frame / FRAMES_PER_S, (seg.end_frame + 1) / FRAMES_PER_S))
    return out


def _speech_start(pcm16k: bytes | bytearray) -> int | None:
    """Byte offset of the first 10 ms frame louder than ``SPEECH_RMS``; None: all quiet."""
    hop = ASR_RATE // 100
    x = np.frombuffer(pcm16k, dtype="<i2")
    n = len(x) // hop
    if n == 0:
        return None
    rms = np.sqrt(np.mean(x[: n * hop].astype(np.float32).reshape(n, hop) ** 2, axis=1))
    loud = np.flatnonzero(rms > SPEECH_RMS)
    return int(loud[0]) * hop * 2 if loud.size else None


def _primable(pending: bytearray) -> bool:
    """Enough audio to set the cepstral mean: 0.5 s from where speech begins (or a long silence)."""
    if len(pending) >= MAX_PRIME_WAIT_BYTES:
        return True
    lo = _speech_start(pending)
    return lo is not None and len(pending) - lo >= CMN_PRIME_BYTES


def build_pocketsphinx(slots: int) -> PocketsphinxAsrBackend:
    """Built where it runs (a top-level function, so a child process can be told to call it)."""
    return PocketsphinxAsrBackend(slots=slots)


def from_config(config: GatewayConfig) -> StagePlan:
    """pocketsphinx holds the GIL while it decodes: built in a child process of its own. One decoder
    per request: a full pool refuses at submit."""
    if config.asr_slots < 1:
        raise ConfigError(f"--asr pocketsphinx: asr_slots must be >= 1, got {config.asr_slots}")
    return StagePlan(
        factory=functools.partial(build_pocketsphinx, config.asr_slots),
        name=PocketsphinxAsrBackend.name,
        max_batch=config.asr_slots,
        max_active=config.asr_slots,
        admit=utterance_bound(config.asr_max_utterance_s),
    )
