"""Model shapes and the local weight-directory format of the codec-LM TTS.

The ``full`` shape follows Qwen3-TTS-12Hz-0.6B: a 28-layer Qwen3 talker (hidden 1024, 16 heads, 8 KV
heads, head_dim 128) predicting codebook 0 at 12.5 Hz, a 5-layer code predictor for codebooks 1..15,
and a 16-codebook Mimi codec (24 kHz, 1920 samples per frame). ``tiny`` keeps every structural feature
(GQA, sliding-window ring, all conv kinds, 1920-sample frames) at toy widths so CPU tests run in seconds.

Weight directory (``tts_path``)::

    codec_tts.json        {"format": 1, "spec": {...CodecSpec fields...}}
    talker.safetensors    CodecTalker state dict
    codec/                a MimiModel directory (``save_pretrained``; e.g. kyutai/mimi's files)
    tokenizer files       optional; without them text is tokenized as UTF-8 bytes

This is this project's own layout (the Qwen3-TTS checkpoint's codec is not Mimi, so its files do not
load as-is); ``save_codec_tts`` writes it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
SPEC_FILE = "codec_tts.json"
TALKER_FILE = "talker.safetensors"
CODEC_DIR = "codec"


@dataclass(frozen=True)
class CodecSpec:
    """Everything needed to build the talker and the codec at random init."""

    name: str
    talker: dict[str, Any]
    """Qwen3Config kwargs of the talker (its ``embed_tokens`` is the codebook-0 embedding)."""
    predictor: dict[str, Any]
    """Qwen3Config kwargs of the code predictor (codebooks 1..num_codebooks-1)."""
    mimi: dict[str, Any]
    """MimiConfig kwargs of the codec."""
    text_vocab: int = 259
    """Text embedding rows (259 = the byte tokenizer: 0 pad, 1 eos, 2 bos, byte b -> b + 3)."""
    text_hidden: int = 2048
    num_codebooks: int = 16
    codebook_size: int = 2048
    codec_vocab: int = 3072
    """Talker head width: the codebook plus special ids (pad, bos, eos), padded like Qwen3-TTS."""
    max_positions: int = 2048
    """Talker KV positions per slot = the longest utterance in frames (2048 frames = 164 s)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pad_id(self) -> int:
        return self.codebook_size

    @property
    def bos_id(self) -> int:
        return self.codebook_size + 1

    @property
    def eos_id(self) -> int:
        return self.codebook_size + 2

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT_VERSION, "spec": asdict(self)}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> CodecSpec:
        data = json.loads(text)
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(
                f"unsupported codec_tts format {data.get('format')!r} (expected {FORMAT_VERSION})"
            )
        return cls(**data["spec"])


def _qwen3(
    hidden: int, inter: int, layers: int, heads: int, kv: int, head_dim: int, vocab: int
) -> dict[str, Any]:
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "tie_word_embeddings": False,
    }


def full_spec() -> CodecSpec:
    """Qwen3-TTS-12Hz-0.6B-shaped talker + 16-codebook Mimi (kyutai/mimi's shape)."""
    return CodecSpec(
        name="full",
        talker=_qwen3(1024, 3072, 28, 16, 8, 128, vocab=3072),
        predictor=_qwen3(1024, 3072, 5, 16, 8, 128, vocab=1),
        mimi={"num_quantizers": 16},
        text_vocab=259,
        text_hidden=2048,
        num_codebooks=16,
        codebook_size=2048,
        codec_vocab=3072,
        max_positions=2048,
    )


TINY_MIMI: dict[str, Any] = {
    "hidden_size": 32,
    "num_filters": 4,
    "codebook_size": 64,
    "codebook_dim": 16,
    "vector_quantization_hidden_dimension": 16,
    "num_semantic_quantizers": 1,
    "upsample_groups": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "sliding_window": 5,
}
"""A toy Mimi (transformers' ``MimiConfig`` fields) for CPU tests: the real structure at toy widths, a
5-position sliding window so tests wrap the ring; each user sets its ``num_quantizers``."""


def tiny_spec() -> CodecSpec:
    """Toy widths, same structure; the decoder's sliding window is 5 positions so tests wrap the ring."""
    return CodecSpec(
        name="tiny",
        talker=_qwen3(64, 128, 2, 4, 2, 16, vocab=72),
        predictor=_qwen3(64, 128, 1, 4, 2, 16, vocab=1),
        mimi={**TINY_MIMI, "num_quantizers": 16},
        text_vocab=259,
        text_hidden=32,
        num_codebooks=16,
        codebook_size=64,
        codec_vocab=72,
        max_positions=256,
    )


def named_spec(name: str) -> CodecSpec:
    if name == "full":
        return full_spec()
    if name == "tiny":
        return tiny_spec()
    raise ValueError(f"unknown tts_config {name!r}; expected 'tiny' or 'full'")


def save_codec_tts(path: str | Path, spec: CodecSpec, talker: Any, mimi: Any) -> None:
    """Write a weight directory that ``tts_path`` can load (used by tests; also for exporting)."""
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    (out / SPEC_FILE).write_text(spec.to_json())
    state = {k: v.detach().to("cpu").contiguous() for k, v in talker.state_dict().items()}
    save_file(state, str(out / TALKER_FILE))
    mimi.save_pretrained(str(out / CODEC_DIR))
