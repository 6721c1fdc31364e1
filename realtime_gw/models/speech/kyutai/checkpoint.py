"""Kyutai STT weights: a transformers ``save_pretrained`` directory, or random init at a named shape.

Directory layout (what ``KyutaiSpeechToTextForConditionalGeneration.from_pretrained`` reads, e.g.
kyutai/stt-1b-en_fr-trfs)::

    config.json                 model_type "kyutai_speech_to_text" (with the Mimi ``codec_config``)
    model.safetensors           the LM ("model.*", "lm_head.*") and the codec ("codec_model.*")
    generation_config.json      optional
    preprocessor_config.json    optional: ``audio_delay_seconds``, ``audio_silence_prefix_seconds``
    tokenizer files             optional (tokenizer.json / tokenizer.model): without them, text ids are
                                decoded as the byte tokenizer's

transformers reads the files (its own name mapping across versions); every weight the ASR path uses must
be there (the codec's decoder half may be missing). The LM runs in ``dtype``, the codec in float32 as
the reference keeps it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from realtime_gw.models.speech.kyutai.config import NamedConfig, StreamTiming, named_config
from realtime_gw.models.tokenizers import ByteTokenizer, HfTokenizer, has_tokenizer_files

log = logging.getLogger(__name__)

INIT_SEED = 0
"""Random-init weights are seeded, so every process builds the same model."""
_CODEC_DECODER_KEYS = ("codec_model.decoder", "codec_model.upsample")
"""Weights the ASR path never reads (Mimi's decoder half); a checkpoint may lack them."""


@dataclass
class KyutaiCheckpoint:
    model: Any
    """A ``KyutaiSpeechToTextForConditionalGeneration`` (eval): LM in the serving dtype, codec float32."""
    tokenizer: ByteTokenizer | HfTokenizer
    timing: StreamTiming
    description: str
    random_init: bool


def _model_class() -> Any:
    from transformers import KyutaiSpeechToTextForConditionalGeneration

    return KyutaiSpeechToTextForConditionalGeneration


def randomize_codec(codec: Any) -> None:
    """Mimi's init leaves every codebook at zero (all frames would quantize alike): unit-normal entries."""
    from realtime_gw.models.speech.codec.engine import randomize_codebooks

    randomize_codebooks(codec)


def _finish(model: Any, device: str, dtype: torch.dtype) -> Any:
    """On ``device``, eval; the LM's parameters in ``dtype`` (buffers such as the rotary frequencies keep
    theirs), the codec float32."""
    model = model.to(device).eval()
    with torch.no_grad():
        for part in (model.model, model.lm_head):
            for param in part.parameters():
                param.data = param.data.to(dtype)
    model.codec_model.to(torch.float32)
    return model


def random_model(named: NamedConfig, device: str, dtype: torch.dtype) -> Any:
    """The architecture at ``named``'s shape with seeded random weights (real cost, no speech)."""
    from transformers import KyutaiSpeechToTextConfig

    cfg = KyutaiSpeechToTextConfig(**named.model)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(INIT_SEED)
        model = _model_class()(cfg)
        randomize_codec(model.codec_model)
    return _finish(model, device, dtype)


def random_checkpoint(name: str, device: str, dtype: torch.dtype) -> KyutaiCheckpoint:
    named = named_config(name)
    model = random_model(named, device, dtype)
    desc = f"kyutai-stt-{name} (random init: transcripts are noise)"
    return KyutaiCheckpoint(model, ByteTokenizer(), named.timing, desc, True)


def load_checkpoint(
    path: str | Path, device: str, dtype: torch.dtype, default_timing: StreamTiming
) -> KyutaiCheckpoint:
    """A ``save_pretrained`` directory (local files only); refuses one that lacks weights the ASR reads."""
    root = Path(path)
    if not (root / "config.json").exists():
        raise FileNotFoundError(f"{root}: no config.json (expected a transformers save_pretrained directory)")
    model, info = _model_class().from_pretrained(
        str(root), local_files_only=True, dtype=dtype, output_loading_info=True
    )
    missing = [k for k in info.get("missing_keys", ()) if not k.startswith(_CODEC_DECODER_KEYS)]
    mismatched = list(info.get("mismatched_keys", ()))
    if missing or mismatched:
        raise ValueError(f"{root}: weights do not match config.json (missing {missing[:5]}, "
                         f"mismatched {mismatched[:5]})")  # fmt: skip
    tok: ByteTokenizer | HfTokenizer = HfTokenizer(root) if has_tokenizer_files(root) else ByteTokenizer()
    vocab = int(model.config.vocab_size)
    if isinstance(tok, HfTokenizer) and tok.vocab_size > vocab:
        raise ValueError(f"{root}: tokenizer has {tok.vocab_size} ids but the model predicts {vocab}")
    timing = StreamTiming.from_dir(root, default_timing)
    return KyutaiCheckpoint(_finish(model, device, dtype), tok, timing, f"kyutai-stt from {root}", False)


def load(config: str, path: str | None, device: str, dtype: torch.dtype) -> KyutaiCheckpoint:
    """Weights from ``path`` or random init of the named config (``tiny`` | ``1b``)."""
    if path:
        return load_checkpoint(path, device, dtype, named_config(config).timing)
    return random_checkpoint(config, device, dtype)
