"""Named shapes of the Kyutai STT architecture for random init, and the stream timing.

``1b`` is kyutai/stt-1b-en_fr as transformers builds it (``KyutaiSpeechToTextConfig``): a 16-layer
decoder (hidden 2048, 16 heads of 128, gated SiLU MLP with ``ffn_dim`` 11264 = 2 x 5632, RMS norm eps 1e-8,
RoPE theta 100000), 8000 text ids + the text start id (8001 rows in ``vocab_size``), 32 Mimi codebooks of
2048 (+1 audio BOS = 2049 ids each), a 750-position attention context; Mimi as published (kyutai/mimi:
8-layer encoder transformer over a 250-position window, 32 quantizers). The numbers are those of the
model card and of moshi-server's stt-1b-en_fr config (``d_model`` 2048, 16 heads, 16 layers,
``context`` 750, ``max_period`` 100000, ``text_in_vocab_size`` 8001, 32 codebooks, text padding id 3,
``asr_delay_in_tokens`` 6 = 0.5 s); transformers' own defaults are the 2.6B-en shape.

``tiny`` keeps every structural feature (GQA, both sliding windows wrapping within a test, all conv
kinds, 1920-sample frames, split RVQ) at toy widths so CPU tests run in seconds; its text ids follow the
byte tokenizer (``models/tokenizers.ByteTokenizer``: byte ``b`` = id ``b + 3``), plus a start id.

Stream timing is the feature extractor's: ``audio_silence_prefix_seconds`` of silence before the audio,
and ``audio_delay_seconds + 1`` s of silence after it, so the text (which lags the audio by the model's
delay) is flushed. A checkpoint directory's ``preprocessor_config.json`` overrides the named values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from realtime_gw.models.speech.codec.spec import TINY_MIMI

SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920


@dataclass(frozen=True)
class StreamTiming:
    silence_prefix_s: float = 0.0
    audio_delay_s: float = 0.5

    @property
    def prefix_samples(self) -> int:
        return int(self.silence_prefix_s * SAMPLE_RATE)

    @property
    def flush_samples(self) -> int:
        """Silence after the audio, as the reference's feature extractor pads it (delay + 1 s)."""
        return int((self.audio_delay_s + 1.0) * SAMPLE_RATE)

    @property
    def pause_flush_samples(self) -> int:
        """Silence run once a turn's end was heard, as Kyutai's Unmute runs it after a detected pause: the
        delay in whole frames, plus one."""
        return (-(-round(self.audio_delay_s * SAMPLE_RATE) // FRAME_SAMPLES) + 1) * FRAME_SAMPLES

    @classmethod
    def from_dir(cls, path: str | Path, default: StreamTiming) -> StreamTiming:
        f = Path(path) / "preprocessor_config.json"
        if not f.exists():
            return default
        data = json.loads(f.read_text())
        prefix, delay = data.get("audio_silence_prefix_seconds"), data.get("audio_delay_seconds")
        return cls(
            silence_prefix_s=float(prefix) if prefix is not None else default.silence_prefix_s,
            audio_delay_s=float(delay) if delay is not None else default.audio_delay_s,
        )


@dataclass(frozen=True)
class NamedConfig:
    name: str
    model: dict[str, Any]
    """``KyutaiSpeechToTextConfig`` kwargs (``codec_config``: ``MimiConfig`` kwargs)."""
    timing: StreamTiming


def _kyutai(
    *, vocab: int, hidden: int, layers: int, heads: int, kv: int, ffn: int, k: int, codebook: int,
    window: int, bos: int, pad: int, codec: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    cbv = codebook + 1  # each codebook's ids plus the audio BOS
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hidden // heads,
        "ffn_dim": ffn,
        "num_codebooks": k,
        "codebook_vocab_size": cbv,
        "audio_bos_token_id": codebook,
        "audio_pad_token_id": vocab + k * cbv,
        "bos_token_id": bos,
        "pad_token_id": pad,
        "sliding_window": window,
        "max_position_embeddings": 750,
        "rms_norm_eps": 1e-8,
        "rope_parameters": {"rope_type": "default", "rope_theta": 100_000.0},
        "codec_config": {"model_type": "mimi", **codec},
    }


def stt_1b() -> NamedConfig:
    model = _kyutai(
        vocab=8001, hidden=2048, layers=16, heads=16, kv=16, ffn=11264, k=32, codebook=2048,
        window=750, bos=8000, pad=3,
        codec={"num_quantizers": 32, "sliding_window": 250},
    )  # fmt: skip
    return NamedConfig("1b", model, StreamTiming(silence_prefix_s=0.0, audio_delay_s=0.5))


def stt_tiny() -> NamedConfig:
    codec = {**TINY_MIMI, "num_quantizers": 8}
    model = _kyutai(
        vocab=260, hidden=64, layers=2, heads=4, kv=2, ffn=128, k=8, codebook=64, window=6, bos=259, pad=0,
        codec=codec,
    )  # fmt: skip
    return NamedConfig("tiny", model, StreamTiming(silence_prefix_s=0.0, audio_delay_s=0.16))


def named_config(name: str) -> NamedConfig:
    if name == "1b":
        return stt_1b()
    if name == "tiny":
        return stt_tiny()
    raise ValueError(f"unknown asr_config {name!r}; expected 'tiny' or '1b'")
