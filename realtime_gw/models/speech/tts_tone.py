"""Tone "TTS": a sine beep per sentence instead of speech.

For measuring gateway overhead only (framing, scheduling, transport) with no model cost; it says
nothing. Same contract as ``PiperTtsBackend`` (both are ``tts_base.SentenceTtsBackend``): sentences in,
1920-sample 24 kHz frames out.
"""

from __future__ import annotations

import numpy as np

from realtime_gw.config import GatewayConfig
from realtime_gw.models.families import StagePlan
from realtime_gw.models.speech.tts_base import SentenceTtsBackend, TtsState
from realtime_gw.protocols.audio import float32_to_pcm16
from realtime_gw.records.voice import FRAME_SAMPLES, OUTPUT_RATE


class ToneTtsBackend(SentenceTtsBackend):
    """220 Hz tone, ~60 ms per character (scaled by 1/speed), at least one frame per sentence."""

    name = "tts-tone"
    native_rate = OUTPUT_RATE  # no resampling: the cheapest possible path
    voices = ("tone", "joe")  # "joe" too: a config or client naming the Piper voice still works

    def __init__(self, freq_hz: float = 220.0, ms_per_char: float = 60.0, amplitude: float = 0.2) -> None:
        super().__init__("tone")
        self.freq_hz = freq_hz
        self.ms_per_char = ms_per_char
        self.amplitude = amplitude

    def _synthesize(self, state: TtsState, sentence: str) -> bytes:
        n = round(len(sentence) * self.ms_per_char * state.length_scale * OUTPUT_RATE / 1000)
        n = max(n, FRAME_SAMPLES)
        phase0 = state.extra or 0.0  # phase carried across sentences: no click at the seam
        step = 2 * np.pi * self.freq_hz / OUTPUT_RATE
        phase = phase0 + step * np.arange(n, dtype=np.float64)
        state.extra = float((phase0 + step * n) % (2 * np.pi))
        return float32_to_pcm16(self.amplitude * np.sin(phase))


def from_config(config: GatewayConfig) -> StagePlan:
    """In-thread: a beep costs microseconds of numpy per sentence and its text is bounded, so a process
    hop would only add latency to what it exists to measure (gateway overhead). Sentences are served
    as Piper's are (one per step, a small backlog)."""
    tone = ToneTtsBackend()
    tone.max_text_chars = config.tts_max_text_chars
    return StagePlan(backend=tone, max_batch=1, max_active=config.worker_max_active, max_backlog=25)
