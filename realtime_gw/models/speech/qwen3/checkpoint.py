"""A Qwen3-TTS-12Hz checkpoint directory as published, read without the reference package.

Layout (what ``Qwen3TTSModel.from_pretrained`` reads)::

    config.json               model_type "qwen3_tts", tts_model_type (custom_voice | voice_design | base):
                              talker_config (+ code_predictor_config), token ids, speaker_encoder_config
    model.safetensors         "talker.*" (and "speaker_encoder.*" in Base checkpoints: ``speaker.py``)
    generation_config.json    sampling defaults (do_sample, top_k, temperature, repetition_penalty, ...)
    tokenizer files           the Qwen2 BPE text tokenizer (vocab.json/merges.txt or tokenizer.json)
    speech_tokenizer/         the 12 Hz codec: config.json (model_type "qwen3_tts_tokenizer_12hz") and
                              model.safetensors ("encoder.*" unused, "decoder.*" loaded)

``modules.py`` holds the weights under the published parameter names (strict loading checks every
name); the runtimes in ``talker.py`` and ``decoder.py`` compute with them. ``published_configs`` gives
the 0.6B and 1.7B shapes for random-init benchmarks (no weights needed, none downloaded).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from realtime_gw.models.speech.qwen3.modules import CodecDecoder, Talker, randomize_decoder
from realtime_gw.models.speech.qwen3.speaker import SpeakerEncoder

INIT_SEED = 0
SPEAKERS = ("vivian", "serena", "uncle_fu", "dylan", "eric", "ryan", "aiden", "ono_anna", "sohee")
KINDS = ("custom_voice", "voice_design", "base")
"""``tts_model_type``: named speakers (+ optional instruct), a voice described in words, a cloned voice."""
LANGUAGES = ("chinese", "english", "german", "italian", "portuguese", "spanish", "japanese", "korean",
             "french", "russian")


# -- the whole checkpoint -------------------------------------------------------------------------------------
@dataclass
class Qwen3TtsCheckpoint:
    config: dict[str, Any]
    """config.json"""
    codec_config: dict[str, Any]
    """speech_tokenizer/config.json"""
    talker: Talker
    decoder: nn.Module
    generation: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    speaker_encoder: SpeakerEncoder | None = None
    """Base checkpoints only: reference audio -> x-vector (float32)."""

    @property
    def kind(self) -> str:
        return str(self.config.get("tts_model_type", "custom_voice"))

    def takes_instruct(self) -> bool:
        """Whether an ``instruct`` text conditions the voice: VoiceDesign always (it is the voice), Base
        never, CustomVoice except at 0.6B (the reference drops it when ``tts_model_size in "0b6"``)."""
        if self.kind == "voice_design":
            return True
        size = str(self.config.get("tts_model_size", "")).lower()
        small = size in "0b6" or size == "0.6b"  # the reference's substring test; "0.6b": our random init
        return self.kind == "custom_voice" and not small

    @property
    def talker_config(self) -> dict[str, Any]:
        return self.config["talker_config"]

    @property
    def decoder_config(self) -> dict[str, Any]:
        return self.codec_config["decoder_config"]

    def speakers(self) -> dict[str, int]:
        """Speaker name (lower case) -> codec-embedding id; the config stores an id or a one-id list."""
        out = {}
        for name, v in (self.talker_config.get("spk_id") or {}).items():
            out[name.lower()] = int(v[0] if isinstance(v, list) else v)
        return out

    def languages(self) -> dict[str, int]:
        return {k.lower(): int(v) for k, v in (self.talker_config.get("codec_language_id") or {}).items()}

    def dialects(self) -> dict[str, str]:
        return {k.lower(): v for k, v in (self.talker_config.get("spk_is_dialect") or {}).items() if v}


def _read_json(p: Path) -> dict[str, Any]:
    return json.loads(p.read_text())


def _prefixed(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def load_checkpoint(path: str | Path, device: str, dtype: torch.dtype) -> Qwen3TtsCheckpoint:
    """Load a published checkpoint directory (local files only). The talker in ``dtype``, the decoder float32."""
    from safetensors.torch import load_file

    root = Path(path)
    config = _read_json(root / "config.json")
    if config.get("model_type") != "qwen3_tts":
        raise ValueError(f"{root}/config.json: model_type {config.get('model_type')!r}, expected 'qwen3_tts'")
    codec_config = _read_json(root / "speech_tokenizer" / "config.json")
    if codec_config.get("model_type") != "qwen3_tts_tokenizer_12hz":
        raise ValueError(f"{root}/speech_tokenizer: only the 12 Hz tokenizer is supported, got "
                         f"{codec_config.get('model_type')!r}")
    state: dict[str, torch.Tensor] = {}
    for f in sorted(root.glob("*.safetensors")):
        state.update(load_file(str(f), device="cpu"))
    with torch.device(device):
        talker = Talker(config["talker_config"])
        decoder = CodecDecoder(codec_config["decoder_config"])
    talker.load_state_dict(_prefixed(state, "talker."), strict=True)
    codec_state: dict[str, torch.Tensor] = {}
    for f in sorted((root / "speech_tokenizer").glob("*.safetensors")):
        codec_state.update(load_file(str(f), device="cpu"))
    decoder.load_state_dict(_prefixed(codec_state, "decoder."), strict=True)
    kind = config.get("tts_model_type", "custom_voice")
    if kind not in KINDS:
        raise ValueError(f"{root}/config.json: tts_model_type {kind!r}, expected one of {', '.join(KINDS)}")
    speaker_encoder = None
    if kind == "base":
        speaker_encoder = SpeakerEncoder(config["speaker_encoder_config"])
        speaker_encoder.load_state_dict(_prefixed(state, "speaker_encoder."), strict=True)
        speaker_encoder.eval()
    gen_path = root / "generation_config.json"
    generation = _read_json(gen_path) if gen_path.exists() else {}
    return Qwen3TtsCheckpoint(
        config, codec_config, talker.to(device=device, dtype=dtype).eval(),
        decoder.to(device=device, dtype=torch.float32).eval(), generation, root, speaker_encoder,
    )


# -- published shapes for random init -------------------------------------------------------------------------
def published_configs(size: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json, speech_tokenizer/config.json) of Qwen3-TTS-12Hz-{0.6B,1.7B}-CustomVoice's shapes; the
    speaker and language ids are placeholders (random init has no learned voices)."""
    if size not in ("0.6b", "1.7b"):
        raise ValueError(f"unknown Qwen3-TTS size {size!r}; expected '0.6b' or '1.7b'")
    hidden, inter = (1024, 3072) if size == "0.6b" else (2048, 6144)
    talker = {
        "vocab_size": 3072, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000, "num_code_groups": 16, "text_hidden_size": 2048, "text_vocab_size": 151936,
        # 3-D rotary sections as published; text-only positions make them the plain 1-D rotary we compute
        "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20], "interleaved": True},
        "max_position_embeddings": 32768,
        "codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_think_id": 2154,
        "codec_nothink_id": 2155, "codec_think_bos_id": 2156, "codec_think_eos_id": 2157,
        "spk_id": {name: 3000 + i for i, name in enumerate(SPEAKERS)},
        "spk_is_dialect": {name: False for name in SPEAKERS},
        "codec_language_id": {name: 2050 + i for i, name in enumerate(LANGUAGES)},
        "code_predictor_config": {
            "vocab_size": 2048, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000, "num_code_groups": 16,
        },
    }
    config = {
        "model_type": "qwen3_tts", "tts_model_type": "custom_voice", "tts_model_size": size,
        "tokenizer_type": "qwen3_tts_tokenizer_12hz", "im_start_token_id": 151644, "im_end_token_id": 151645,
        "tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
        "talker_config": talker,
    }
    codec = {
        "model_type": "qwen3_tts_tokenizer_12hz", "decode_upsample_rate": 1920, "output_sample_rate": 24000,
        "decoder_config": {
            "attention_bias": False, "latent_dim": 1024, "codebook_dim": 512, "codebook_size": 2048,
            "decoder_dim": 1536, "hidden_act": "silu", "hidden_size": 512, "intermediate_size": 1024,
            "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000, "head_dim": 64,
            "num_attention_heads": 16, "num_hidden_layers": 8, "num_key_value_heads": 16, "num_quantizers": 16,
            "rms_norm_eps": 1e-5, "rope_theta": 10000, "sliding_window": 72, "upsample_rates": [8, 5, 4, 3],
            "upsampling_ratios": [2, 2],
        },
    }
    return config, codec


def random_checkpoint(size: str, device: str, dtype: torch.dtype) -> Qwen3TtsCheckpoint:
    """The real architecture at a published shape with seeded random weights (for speed, not speech)."""
    config, codec = published_configs(size)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(INIT_SEED)
        talker = Talker(config["talker_config"])
        for m in talker.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
        decoder = CodecDecoder(codec["decoder_config"])
        randomize_decoder(decoder)
    gen = {"do_sample": True, "top_k": 50, "temperature": 0.9, "repetition_penalty": 1.05,
           "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_temperature": 0.9}
    return Qwen3TtsCheckpoint(
        config, codec, talker.to(device=device, dtype=dtype).eval(),
        decoder.to(device=device, dtype=torch.float32).eval(), gen, None,
    )
