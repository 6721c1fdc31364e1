"""Moshi's weights from Kyutai's published layout, or random init at a named shape.

A checkpoint directory (``--s2s-path``), as kyutai/moshiko-pytorch-bf16 ships it (local files only)::

    model.safetensors                              the LM, Kyutai's names (``weights.py``)
    tokenizer-e351c8d8-checkpoint125.safetensors   Mimi, Kyutai's names (``moshi.models.compression``);
                                                   any other ``tokenizer-*.safetensors`` is taken when
                                                   it is the only one
    tokenizer_spm_32k_3.model                      the SentencePiece text tokenizer (any one ``*.model``)
    config.json                                    optional: the LM's kwargs (7b when absent) and the
                                                   files' names (``moshi_name``, ``mimi_name``,
                                                   ``tokenizer_name``) as Kyutai's newer repos give them

Mimi runs as transformers' ``MimiModel`` (the streaming encoder and decoder of ``models/speech`` are built
on it): Kyutai's names map onto it as transformers' own conversion script maps them (its rename list;
the fused attention projection split into q/k/v with RoPE pairs de-interleaved), strictly: a missing or
extra tensor is an error naming it. Text pieces: the SentencePiece piece with ``▁`` as a space, as
Kyutai's server prints them. Random init has no vocabulary: a text token is shown as `` <id>`` (one word
per token), and says so in the stage's description; a persona's text is then one token per UTF-8 byte
(``PieceText.encode``), which costs what a real one does and means nothing.

PersonaPlex (``family="personaplex"``, nvidia/personaplex-7b-v1) ships the same files under the same names
(``loaders.py`` of NVIDIA/personaplex: ``model.safetensors``, the same Mimi and tokenizer) and no
config.json: its LM is the 7b shape with 16 depformer sub-steps, loaded as strictly as Moshi's (NVIDIA's
loader would fill missing sub-steps 8..15 from 0..7, a bridge from Moshi's weights; here a file without
them is refused, naming what is missing).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from realtime_gw.models.s2s.config import MoshiShape, named_shape, shape_from_dir
from realtime_gw.models.s2s.weights import load_weights, random_weights

log = logging.getLogger(__name__)

LM_FILE = "model.safetensors"
MIMI_FILE = "tokenizer-e351c8d8-checkpoint125.safetensors"
TEXT_TOKENIZER = "tokenizer_spm_32k_3.model"

_MIMI_RENAMES = (
    ("conv.conv.conv", "conv"), ("convtr.convtr.convtr", "conv"), ("conv.conv", "conv"),
    ("convtr.convtr", "conv"),
    ("quantizer.rvq_first.vq", "quantizer.semantic_residual_vector_quantizer"),
    ("quantizer.rvq_first", "quantizer.semantic_residual_vector_quantizer"),
    ("quantizer.rvq_rest.vq", "quantizer.acoustic_residual_vector_quantizer"),
    ("quantizer.rvq_rest", "quantizer.acoustic_residual_vector_quantizer"),
    ("_codebook", "codebook"), ("_initialized", "initialized"), ("embedding_sum", "embed_sum"),
    ("encoder.model", "encoder.layers"), ("decoder.model", "decoder.layers"),
    ("encoder_transformer.transformer", "encoder_transformer"),
    ("decoder_transformer.transformer", "decoder_transformer"),
    ("linear1", "mlp.fc1"), ("linear2", "mlp.fc2"), ("self_attn.out_proj", "self_attn.o_proj"),
    ("norm1", "input_layernorm"), ("norm2", "post_attention_layernorm"),
    ("layer_scale_1", "self_attn_layer_scale"), ("layer_scale_2", "mlp_layer_scale"),
)  # fmt: skip
"""transformers' ``convert_mimi_checkpoint_to_pytorch.convert_list``, in its order."""


class PieceText:
    """Text pieces of token ids: ``piece(id) -> str``."""

    def __init__(self, path: Path | None) -> None:
        self._sp: Any = None
        if path is not None:
            import sentencepiece

            self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))  # type: ignore[call-arg]
            self.name = f"sentencepiece {path.name}"
            self.vocab_size = int(self._sp.vocab_size())
        else:
            self.name = "none (random init: token ids shown as <id>)"
            self.vocab_size = 0

    def piece(self, token: int) -> str:
        if self._sp is None:
            return f" <{token}>"
        return str(self._sp.id_to_piece(token)).replace("\u2581", " ")

    def encode(self, text: str, text_card: int) -> list[int]:
        """Token ids of ``text`` (SentencePiece's ``encode``, as the reference's ``text_tokenizer.encode``);
        without a vocabulary one id per UTF-8 byte, in ``[4, text_card)`` (clear of the special ids)."""
        if self._sp is None:
            return [4 + b % (text_card - 4) for b in text.encode()]
        return [int(t) for t in self._sp.encode(text)]


@dataclass
class MoshiCheckpoint:
    shape: MoshiShape
    weights: dict[str, torch.Tensor]
    mimi: Any
    """transformers ``MimiModel`` (eval, float32)."""
    text: PieceText
    description: str
    random_init: bool


def mimi_model(shape: MoshiShape, device: str | torch.device) -> Any:
    from transformers import MimiConfig, MimiModel

    return MimiModel(MimiConfig(**shape.mimi)).to(device).eval()


_NESTED = (
    ("encoder.layers.", "encoder.encoder_seanet.layers."), ("encoder_transformer.", "encoder.encoder_transformer."),
    ("downsample.", "encoder.downsample."), ("upsample.", "decoder.upsample."),
    ("decoder_transformer.", "decoder.decoder_transformer."), ("decoder.layers.", "decoder.decoder_seanet.layers."),
)  # fmt: skip
"""transformers >= 5.2x nests the codec's halves (``MimiEncoderModel``/``MimiDecoderModel``); 5.17 does not."""


def mimi_state_from_kyutai(state: dict[str, torch.Tensor], mimi: Any) -> dict[str, torch.Tensor]:
    """Kyutai's Mimi names -> transformers ``MimiModel`` ``mimi``'s (its conversion script's mapping)."""
    config = mimi.config
    heads, kv_heads, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    nested = hasattr(mimi.encoder, "encoder_seanet")

    def permute(w: torch.Tensor, n: int) -> torch.Tensor:
        return w.view(n, w.shape[0] // n // 2, 2, w.shape[1]).transpose(1, 2).reshape(w.shape)

    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        name = key.replace(".in_projs.0.weight", ".in_proj_weight").replace(".out_projs.0.", ".out_proj.")
        for old, new in _MIMI_RENAMES:
            if old in name:
                name = name.replace(old, new)
        for old, new in _NESTED if nested else ():
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        if name.endswith("in_proj_weight"):
            q, k, v = value[: heads * d], value[heads * d : (heads + kv_heads) * d], value[(heads + kv_heads) * d :]
            out[name.replace("in_proj_weight", "q_proj.weight")] = permute(q, heads)
            out[name.replace("in_proj_weight", "k_proj.weight")] = permute(k, kv_heads)
            out[name.replace("in_proj_weight", "v_proj.weight")] = v
        else:
            out[name] = value
    return out


def load_mimi(path: Path, shape: MoshiShape, device: str | torch.device) -> Any:
    from safetensors.torch import load_file

    mimi = mimi_model(shape, "cpu")
    state = mimi_state_from_kyutai(load_file(str(path), device="cpu"), mimi)
    want = mimi.state_dict()
    missing, extra = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or extra:
        raise ValueError(f"{path}: not Kyutai's Mimi layout: missing {missing[:6]}, unexpected {extra[:6]}")
    mimi.load_state_dict(state, strict=True)
    return mimi.to(device).eval()


def _one(root: Path, preferred: str, pattern: str, what: str) -> Path:
    if (root / preferred).exists():
        return root / preferred
    found = sorted(root.glob(pattern))
    if len(found) != 1:
        raise FileNotFoundError(f"{root}: expected {preferred} ({what}); found {[p.name for p in found]}")
    return found[0]


def load_checkpoint(
    path: str | Path, default: MoshiShape, device: str, dtype: torch.dtype, family: str = "moshi"
) -> MoshiCheckpoint:
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory (expected Kyutai's moshi checkpoint files)")
    shape = shape_from_dir(root, default)
    names = json.loads((root / "config.json").read_text()) if (root / "config.json").exists() else {}
    lm = root / names.get("moshi_name", LM_FILE)
    if not lm.exists():
        raise FileNotFoundError(f"{root}: no {lm.name} (the Moshi LM)")
    weights = load_weights(lm, shape, device, dtype)
    mimi = load_mimi(_one(root, names.get("mimi_name", MIMI_FILE), "tokenizer-*.safetensors", "Mimi"), shape, device)
    text = PieceText(_one(root, names.get("tokenizer_name", TEXT_TOKENIZER), "*.model", "SentencePiece text tokenizer"))
    if text.vocab_size < shape.text_card:
        raise ValueError(f"{root}: tokenizer has {text.vocab_size} pieces, the model {shape.text_card}")
    return MoshiCheckpoint(shape, weights, mimi, text, f"{family} from {root}", False)


def random_checkpoint(name: str, device: str, dtype: torch.dtype, family: str = "moshi") -> MoshiCheckpoint:
    from realtime_gw.models.speech.codec.engine import randomize_codebooks

    shape = named_shape(name, family)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        mimi = mimi_model(shape, "cpu")
        randomize_codebooks(mimi)
    desc = f"{family}-{name} (random init: real architecture and cost, its speech and text are noise)"
    return MoshiCheckpoint(shape, random_weights(shape, device, dtype), mimi.to(device), PieceText(None),
                           desc, True)  # fmt: skip


def load(
    config: str, path: str | None, device: str, dtype: torch.dtype, family: str = "moshi"
) -> MoshiCheckpoint:
    """Weights from ``path`` (Kyutai's layout; its config.json, else the family's 7b shape) or random init
    of the family's named shape (``tiny`` | ``7b``)."""
    if path:  # moshiko/moshika and personaplex-7b-v1 ship no config.json
        return load_checkpoint(path, named_shape("7b", family), device, dtype, family)
    return random_checkpoint(config, device, dtype, family)
