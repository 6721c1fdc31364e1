"""Real speech for tests and load scripts: Piper synthesizes, pocketsphinx transcribes (both the embedded
backends); ``wer`` scores a transcript (``jiwer``, from the ``dev`` extra)."""

from __future__ import annotations

import functools
import re

from realtime_gw.models.speech.asr_pocketsphinx import PocketsphinxAsrBackend
from realtime_gw.models.speech.tts_piper import PiperTtsBackend
from realtime_gw.protocols.audio import resample
from realtime_gw.records.voice import AsrRequest


@functools.lru_cache(maxsize=1)
def _tts() -> PiperTtsBackend:
    # Without sampling noise: a test's speech is the same in every run (Piper's default samples anew
    # each call, and pocketsphinx's words on a short sentence moved with it).
    return PiperTtsBackend(deterministic=True)


@functools.lru_cache(maxsize=1)
def _asr() -> PocketsphinxAsrBackend:
    backend = PocketsphinxAsrBackend(slots=1)
    backend.warmup()
    return backend


def synthesize(text: str, rate: int = 24000) -> bytes:
    """PCM16 mono of ``text`` at ``rate``, through the same backend the server uses."""
    pcm = _tts().synthesize(text)
    return pcm if rate == 24000 else resample(pcm, 24000, rate)


def transcribe(pcm: bytes, rate: int) -> str:
    backend = _asr()
    state = backend.open(AsrRequest(pcm=pcm, sample_rate=rate))
    try:
        (result,) = backend.step([(state, [])])
    finally:
        backend.release(state)
    return " ".join(r.text for r in result.outputs)


_CONTRACTIONS = {
    "n't": " not",
    "'ll": " will",
    "'re": " are",
    "'ve": " have",
    "'m": " am",
    "'d": " would",
    "'s": " is",
}


def normalize(text: str) -> str:
    """Lower case, no punctuation, contractions expanded (as standard WER normalizers do)."""
    text = text.lower()
    for short, long in _CONTRACTIONS.items():
        text = text.replace(short, long)
    return " ".join(re.sub(r"[^a-z ]+", " ", text).split())


def wer(reference: str, hypothesis: str) -> float:
    import jiwer  # the dev extra's; the rest of this module needs only the gateway's own packages

    return jiwer.wer(normalize(reference), normalize(hypothesis) or "<empty>")
