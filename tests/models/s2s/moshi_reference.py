"""Kyutai's own ``moshi`` package (``moshi==0.2.13``, installed without its dependencies: it pins an
older torch) built at our tiny shape, with the same random weights copied into our stage's model.

The LM's state dict goes through our published-layout loader (``weights.to_published`` +
``check_weights``); the Mimi's through our Kyutai -> transformers name map (``mimi_state_from_kyutai``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

os.environ.setdefault("NO_TORCH_COMPILE", "1")  # before moshi is imported: its decorators read it

from moshi.models.compression import MimiModel  # noqa: E402
from moshi.models.lm import LMGen, LMModel  # noqa: E402
from moshi.modules import SEANetDecoder, SEANetEncoder, transformer  # noqa: E402
from moshi.quantization import SplitResidualVectorQuantizer  # noqa: E402

from realtime_gw.models.s2s.checkpoint import MoshiCheckpoint, PieceText, mimi_model, mimi_state_from_kyutai  # noqa: E402
from realtime_gw.models.s2s.config import MoshiShape, moshi_tiny  # noqa: E402
from realtime_gw.models.s2s.weights import check_weights, to_published  # noqa: E402

__all__ = ["LMGen", "Reference", "reference"]


def reference_lm(shape: MoshiShape) -> LMModel:
    """``LMModel`` with the kwargs of ``moshi.models.loaders._lm_kwargs`` at ``shape``."""
    torch.manual_seed(0)
    lm = LMModel(
        delays=list(shape.delays), n_q=shape.n_q, dep_q=shape.dep_q, card=shape.card, text_card=shape.text_card,
        dim=shape.dim, num_heads=shape.num_heads, num_layers=shape.num_layers, hidden_scale=shape.hidden_scale,
        causal=True, layer_scale=None, context=shape.context, max_period=shape.max_period, gating="silu",
        norm="rms_norm_f32", positional_embedding="rope", depformer_dim=shape.depformer_dim,
        depformer_dim_feedforward=shape.depformer_dim_feedforward,
        depformer_num_heads=shape.depformer_num_heads, depformer_num_layers=shape.depformer_num_layers,
        depformer_layer_scale=None, depformer_multi_linear=True, depformer_context=shape.dep_q,
        depformer_max_period=shape.max_period, depformer_gating="silu", depformer_pos_emb="none",
        depformer_weights_per_step=True, existing_text_padding_id=shape.text_padding_id,
    )  # fmt: skip
    with torch.no_grad():  # norms start at 1: give them values so a misplaced norm shows
        for name, p in lm.named_parameters():
            if name.endswith("alpha"):
                p.uniform_(0.5, 1.5)
    return lm.eval()


def reference_mimi(config: Any) -> MimiModel:
    """Kyutai's ``MimiModel`` built as ``loaders.get_mimi`` builds it, at a transformers ``MimiConfig``'s
    shape, with random codebooks (its init leaves them at zero)."""
    seanet = {
        "channels": 1, "dimension": config.hidden_size, "causal": True, "n_filters": config.num_filters,
        "n_residual_layers": config.num_residual_layers, "activation": "ELU", "compress": config.compress,
        "dilation_base": config.dilation_growth_rate, "disable_norm_outer_blocks": 0,
        "kernel_size": config.kernel_size, "residual_kernel_size": config.residual_kernel_size,
        "last_kernel_size": config.last_kernel_size, "norm": "none", "pad_mode": "constant",
        "ratios": list(config.upsampling_ratios), "true_skip": True,
    }  # fmt: skip
    tr = {
        "d_model": config.hidden_size, "num_heads": config.num_attention_heads,
        "num_layers": config.num_hidden_layers, "causal": True, "layer_scale": 0.01,
        "context": config.sliding_window, "conv_layout": True, "max_period": 10000, "gating": "none",
        "norm": "layer_norm", "positional_embedding": "rope", "dim_feedforward": config.intermediate_size,
        "input_dimension": config.hidden_size, "output_dimensions": [config.hidden_size],
        "kv_repeat": config.num_attention_heads // config.num_key_value_heads,
    }  # fmt: skip
    torch.manual_seed(1)
    encoder, decoder = SEANetEncoder(**seanet), SEANetDecoder(**seanet)
    quantizer = SplitResidualVectorQuantizer(
        dimension=config.codebook_dim, n_q=config.num_quantizers, bins=config.codebook_size,
        input_dimension=config.hidden_size, output_dimension=config.hidden_size,
    )  # fmt: skip
    mimi = MimiModel(
        encoder, decoder, quantizer, channels=1, sample_rate=24000, frame_rate=12.5,
        encoder_frame_rate=24000 / encoder.hop_length, causal=True, resample_method="conv",
        encoder_transformer=transformer.ProjectedTransformer(**tr),
        decoder_transformer=transformer.ProjectedTransformer(**tr),
    ).eval()  # fmt: skip
    with torch.no_grad():
        for name, buf in mimi.named_buffers():
            if name.endswith("embedding_sum"):
                buf.normal_()
            elif name.endswith("cluster_usage"):
                buf.fill_(1.0)
    return mimi


@dataclass
class Reference:
    lm: LMModel
    mimi: MimiModel
    checkpoint: MoshiCheckpoint
    """Ours, with the reference's very weights."""


def reference(shape: MoshiShape | None = None) -> Reference:
    shape = shape or moshi_tiny()
    lm = reference_lm(shape)
    weights = to_published({k: v.detach().clone() for k, v in lm.state_dict().items()})
    check_weights(weights, shape, "moshi.models.lm.LMModel")
    ours = mimi_model(shape, "cpu")
    mimi = reference_mimi(ours.config)
    mimi.set_num_codebooks(shape.own_q)
    ours.load_state_dict(mimi_state_from_kyutai(mimi.state_dict(), ours), strict=True)
    ck = MoshiCheckpoint(shape, weights, ours, PieceText(None), "moshi-tiny (the reference's weights)", True)
    return Reference(lm, mimi, ck)


def save_published(ref: Reference, root: Any) -> None:
    """A checkpoint directory in Kyutai's layout from the reference's weights: the LM in the published
    names, the Mimi as the package saves it, a SentencePiece model, and a config.json of the tiny shape."""
    import io
    import json
    from pathlib import Path

    import sentencepiece
    from safetensors.torch import save_file

    from realtime_gw.models.s2s.checkpoint import LM_FILE, MIMI_FILE, TEXT_TOKENIZER

    out = Path(root)
    out.mkdir(parents=True, exist_ok=True)
    shape = ref.checkpoint.shape
    save_file({k: v.contiguous() for k, v in to_published(ref.lm.state_dict()).items()}, str(out / LM_FILE))
    save_file({k: v.contiguous() for k, v in ref.mimi.state_dict().items()}, str(out / MIMI_FILE))
    words = [f"w{i}x" for i in range(200)]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(" ".join(words[i : i + 10]) for i in range(0, 200, 3)), model_writer=model,
        vocab_size=shape.text_card + 4, model_type="word", minloglevel=2,
    )  # fmt: skip
    (out / TEXT_TOKENIZER).write_bytes(model.getvalue())
    lm = {k: getattr(shape, k) for k in ("dim", "num_heads", "num_layers", "hidden_scale", "context", "text_card",
                                         "card", "n_q", "dep_q", "depformer_dim", "depformer_num_heads",
                                         "depformer_num_layers", "depformer_dim_feedforward")}  # fmt: skip
    config = {**lm, "delays": list(shape.delays), "existing_text_padding_id": shape.text_padding_id,
              "mimi_config": shape.mimi}  # fmt: skip
    (out / "config.json").write_text(json.dumps(config))
