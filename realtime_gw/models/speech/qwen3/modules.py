"""Weight holders of Qwen3-TTS-12Hz under the published parameter names (strict loading checks every name).

``Talker`` is ``talker.*`` of ``model.safetensors``; ``CodecDecoder`` is ``decoder.*`` of
``speech_tokenizer/model.safetensors``. They hold weights only: ``talker.py`` and ``decoder.py`` compute.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


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


# -- the 12 Hz codec decoder ----------------------------------------------------------------------------------
class CausalConv(nn.Module):
    def __init__(self, c_in: int, c_out: int, k: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, k, dilation=dilation, groups=groups)


class CausalConvT(nn.Module):
    def __init__(self, c_in: int, c_out: int, k: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, k, stride=stride)


class SnakeBeta(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)


class DecoderBlock(nn.Module):
    def __init__(self, d_in: int, d_out: int, rate: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(d_in), CausalConvT(d_in, d_out, 2 * rate, rate), *(ResidualUnit(d_out, d) for d in (1, 3, 9))]
        )


class ConvNeXt(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _RVQ(nn.Module):
    def __init__(self, n: int, size: int, dim: int, io_dim: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = nn.Module()
        self.vq.layers = nn.ModuleList(_VQ(size, dim) for _ in range(n))


class _Quantizer(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        dim, size, n = c["codebook_dim"], c["codebook_size"], c["num_quantizers"]
        self.rvq_first = _RVQ(1, size, dim // 2, dim)
        self.rvq_rest = _RVQ(n - 1, size, dim // 2, dim)


class CodecDecoder(nn.Module):
    """``decoder.*`` of the 12 Hz speech tokenizer (weights only; ``StreamingQwen3Decoder`` runs it)."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.config = c
        latent, dec = c["latent_dim"], c["decoder_dim"]
        self.quantizer = _Quantizer(c)
        self.pre_conv = CausalConv(c["codebook_dim"], latent, 3)
        self.pre_transformer = Stack({**c, "rms_norm_eps": c.get("rms_norm_eps", 1e-5)}, codec=True)
        self.pre_transformer.input_proj = nn.Linear(latent, c["hidden_size"])
        self.pre_transformer.output_proj = nn.Linear(c["hidden_size"], latent)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvT(latent, latent, f, f), ConvNeXt(latent)]) for f in c["upsampling_ratios"]
        )
        rates = c["upsample_rates"]
        blocks: list[nn.Module] = [CausalConv(latent, dec, 7)]
        blocks += [DecoderBlock(dec // 2**i, dec // 2 ** (i + 1), r) for i, r in enumerate(rates)]
        out = dec // 2 ** len(rates)
        blocks += [SnakeBeta(out), CausalConv(out, 1, 7)]
        self.decoder = nn.ModuleList(blocks)


def randomize_decoder(decoder: CodecDecoder) -> None:
    """Random init that decodes to varied, speaking-level noise (codebooks spread, unit-gain convs)."""
    with torch.no_grad():
        for name, p in decoder.named_parameters():
            if name.endswith("embedding_sum"):
                p.normal_()
            elif p.dim() >= 2:
                p.normal_(std=1.0 / p[0].numel() ** 0.5)
            elif name.endswith(("alpha", "beta", "scale", "gamma")):
                p.normal_(std=0.3)
        decoder.decoder[-1].conv.weight.mul_(0.01)


