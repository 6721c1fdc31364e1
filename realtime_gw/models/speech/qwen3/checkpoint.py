"""A Qwen3-TTS-12Hz checkpoint directory as published, read without the reference package.

Layout (what ``Qwen3TTSModel.from_pretrained`` reads)::

    config.json               model_type "qwen3_tts": talker_config (+ code_predictor_config), token ids
    model.safetensors         "talker.*" (and "speaker_encoder.*" in Base checkpoints, unused here)
    generation_config.json    sampling defaults (do_sample, top_k, temperature, repetition_penalty, ...)
    tokenizer files           the Qwen2 BPE text tokenizer (vocab.json/merges.txt or tokenizer.json)
    speech_tokenizer/         the 12 Hz codec: config.json (model_type "qwen3_tts_tokenizer_12hz") and
                              model.safetensors ("encoder.*" unused, "decoder.*" loaded)

The modules below only hold weights under the published parameter names (strict loading checks every
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

INIT_SEED = 0
SPEAKERS = ("vivian", "serena", "uncle_fu", "dylan", "eric", "ryan", "aiden", "ono_anna", "sohee")
LANGUAGES = ("chinese", "english", "german", "italian", "portuguese", "spanish", "japanese", "korean",
             "french", "russian")


# -- weight holders (published names) -------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.rms_norm(x.float(), (x.shape[-1],), None, self.variance_epsilon).to(x.dtype) * self.weight


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv: int, head_dim: int, eps: float, qk_norm: bool) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.scaling = head_dim**-0.5
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)


class Mlp(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))


class Layer(nn.Module):
    """A Qwen3 decoder layer (talker, code predictor: q/k norms) or the codec's (layer scales, no q/k norm)."""

    def __init__(self, c: dict[str, Any], codec: bool = False) -> None:
        super().__init__()
        hidden, eps = c["hidden_size"], c.get("rms_norm_eps", 1e-6)
        head_dim = c.get("head_dim") or hidden // c["num_attention_heads"]
        kv = c.get("num_key_value_heads") or c["num_attention_heads"]
        self.self_attn = Attention(hidden, c["num_attention_heads"], kv, head_dim, eps, qk_norm=not codec)
        self.mlp = Mlp(hidden, c["intermediate_size"])
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        if codec:
            self.self_attn_layer_scale = LayerScale(hidden)
            self.mlp_layer_scale = LayerScale(hidden)


class Stack(nn.Module):
    def __init__(self, c: dict[str, Any], codec: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(c, codec) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c.get("rms_norm_eps", 1e-6))


class ResizeMlp(nn.Module):
    def __init__(self, d_in: int, inter: int, d_out: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(d_in, inter, bias=True)
        self.linear_fc2 = nn.Linear(inter, d_out, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(nn.functional.silu(self.linear_fc1(x)))


class CodePredictor(nn.Module):
    def __init__(self, c: dict[str, Any], talker_hidden: int) -> None:
        super().__init__()
        groups = c.get("num_code_groups", 16)
        self.model = Stack(c)
        self.model.codec_embedding = nn.ModuleList(
            nn.Embedding(c["vocab_size"], talker_hidden) for _ in range(groups - 1)
        )
        self.lm_head = nn.ModuleList(
            nn.Linear(c["hidden_size"], c["vocab_size"], bias=False) for _ in range(groups - 1)
        )
        self.small_to_mtp_projection: nn.Module = (
            nn.Linear(talker_hidden, c["hidden_size"], bias=True)
            if c["hidden_size"] != talker_hidden
            else nn.Identity()
        )


class Talker(nn.Module):
    """``talker.*`` of a Qwen3-TTS checkpoint: text embedding + projection, the talker stack, the codebook-0
    head, and the code predictor (codebooks 1..15)."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.config = c
        self.model = Stack(c)
        self.model.codec_embedding = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.model.text_embedding = nn.Embedding(c["text_vocab_size"], c["text_hidden_size"])
        th = c["text_hidden_size"]
        self.text_projection = ResizeMlp(th, th, c["hidden_size"])
        self.codec_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.code_predictor = CodePredictor(c["code_predictor_config"], c["hidden_size"])


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

    from realtime_gw.models.speech.qwen3.decoder import CodecDecoder

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
    gen_path = root / "generation_config.json"
    generation = _read_json(gen_path) if gen_path.exists() else {}
    return Qwen3TtsCheckpoint(
        config, codec_config, talker.to(device=device, dtype=dtype).eval(),
        decoder.to(device=device, dtype=torch.float32).eval(), generation, root,
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
    from realtime_gw.models.speech.qwen3.decoder import CodecDecoder, randomize_decoder

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
