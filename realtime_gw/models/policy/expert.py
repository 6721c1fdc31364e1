"""The fused decoder-layer weights of PI0's towers, and the one place where PI0 and π0.5 differ in the
action expert (``pi0_functional`` runs both through the same code).

The two models share the vision tower, the VLM prefix, the static KV cache, the attention and the
flow-matching loop. What differs is the action expert's suffix, here in one object each:

- **PI0** (``PI0ForConditionalGeneration``): the suffix is ``[state token, H action tokens]``; the
  denoising time is mixed into the action tokens by an MLP (``embed_action_time(state, x, t)``); the
  expert's norms are Gemma's RMSNorm with learned weights; a residual add is plain.
- **π0.5** (``PI05ForConditionalGeneration``): the suffix is the H action tokens alone (the state is in
  the prompt as discrete tokens, ``preprocess.tokenize_prompt``); the time embedding conditions every
  norm of the expert (adaptive RMSNorm: a scale, a shift and a residual gate predicted from it), and
  each residual add is gated. All of a step's modulations come from one GEMM (``Pi05Expert.modulate``):
  they depend on the time only, so 2 x layers + 1 small projections become one kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from realtime_gw.models.fp8 import Weight, fp8_weight, linear
from realtime_gw.models.kernels import fuse_linears, linear_add


@dataclass(frozen=True, slots=True)
class StaticNorm:
    """Gemma's RMSNorm: float32 x * rsqrt(mean(x^2) + eps) * (1 + w), cast back."""

    weight: torch.Tensor  # (1 + w) in float32
    eps: float

    @classmethod
    def of(cls, module: Any) -> StaticNorm:
        return cls(1.0 + module.weight.float(), float(module.eps))


@dataclass(frozen=True, slots=True)
class AdaptiveNorm:
    """π0.5's adaptive RMSNorm: its (scale, shift, gate) are row ``index`` of the step's modulations."""

    index: int
    eps: float


Norm = StaticNorm | AdaptiveNorm


def normalize(
    x: torch.Tensor, norm: Norm, mod: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(normalized x in x's dtype, the residual gate or None). ``mod``: the step's modulations
    ``(B, norms, 3, 1, hidden)`` (``Pi05Expert.modulate``), for an adaptive norm."""
    if isinstance(norm, StaticNorm):
        return F.rms_norm(x.float(), (x.shape[-1],), norm.weight, norm.eps).to(x.dtype), None
    assert mod is not None, "an adaptive norm needs the step's modulations"
    scale, shift, gate = mod[:, norm.index].unbind(1)
    h = F.rms_norm(x.float(), (x.shape[-1],), None, norm.eps)
    # transformers: h * (1 + scale) + shift in float32, then the model dtype; the gate in the model dtype.
    return (h * (1.0 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)


def residual(
    x: torch.Tensor, o: torch.Tensor, w: Weight, b: torch.Tensor | None, gate: torch.Tensor | None
) -> torch.Tensor:
    """x + o @ w.T (+ b), the sum gated (``x + gate * (...)``) after an adaptive norm."""
    if gate is None:
        return linear_add(x, o, w, b)
    return x + gate * linear(o, w, b)


def _same(w: torch.Tensor) -> Weight:
    return w


class Block:
    """One decoder layer's weights, fused for few kernels: QKV in one matrix, gate|up in one matrix,
    norms as ``StaticNorm`` (or the expert's ``norms``). Copies of the layer's weights (about 2.8 GB extra
    at the full PI0 size), made once; the model's own modules stay as they are. ``fp8``: the projections
    are kept in e4m3 with row-wise scales instead (``realtime_gw.models.fp8``)."""

    def __init__(
        self, layer: Any, gemma: bool, fp8: bool = False, norms: tuple[Norm, Norm] | None = None
    ) -> None:
        attn = layer.self_attn
        out = attn.o_proj if gemma else attn.out_proj
        quant = fp8_weight if fp8 else _same
        qkv, self.qkv_bias = fuse_linears(attn.q_proj, attn.k_proj, attn.v_proj)
        self.qkv, self.o, self.o_bias = quant(qkv), quant(out.weight), out.bias
        self.scale = float(attn.scaling if gemma else attn.scale)
        if gemma:
            if norms is None:
                norms = (StaticNorm.of(layer.input_layernorm), StaticNorm.of(layer.post_attention_layernorm))
            self.norm1, self.norm2 = norms
            mlp = layer.mlp
            gate_up, self.gate_up_bias = fuse_linears(mlp.gate_proj, mlp.up_proj)
            self.gate_up = quant(gate_up)
            self.inter = mlp.gate_proj.weight.shape[0]
            self.down, self.down_bias = quant(mlp.down_proj.weight), mlp.down_proj.bias
            self.act = mlp.act_fn
        else:
            self.ln1, self.ln2 = layer.layer_norm1, layer.layer_norm2
            mlp = layer.mlp
            self.fc1, self.fc1_bias = quant(mlp.fc1.weight), mlp.fc1.bias
            self.fc2, self.fc2_bias = quant(mlp.fc2.weight), mlp.fc2.bias
            self.act = mlp.activation_fn


# -- the action expert: what differs between PI0 and π0.5 ----------------------------------------------------
class Pi0Expert:
    """PI0: a state token before the action tokens, time mixed in by an MLP, plain Gemma norms."""

    kind = "pi0"
    state_tokens = 1
    """Tokens before the H action tokens in the expert's suffix."""

    def __init__(self, model: Any) -> None:
        self.model = model
        dit = model.model.dit
        self.blocks = [Block(layer, gemma=True) for layer in dit.layers]
        self.final_norm: Norm = StaticNorm.of(dit.norm)

    def embed(self, x: torch.Tensor, time: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, None]:
        """(suffix embeddings (B, 1 + H, hidden), no modulations)."""
        return self.model.embed_action_time(state, x, time), None


class Pi05Expert:
    """π0.5: the action tokens alone; the time embedding modulates every norm and gates every residual."""

    kind = "pi05"
    state_tokens = 0

    def __init__(self, model: Any) -> None:
        self.model = model
        dit = model.model.dit
        adaptive = [
            n for layer in dit.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)
        ]
        adaptive.append(dit.norm)
        self.blocks = [
            Block(
                layer,
                gemma=True,
                norms=(
                    AdaptiveNorm(2 * i, float(layer.input_layernorm.eps)),
                    AdaptiveNorm(2 * i + 1, float(layer.post_attention_layernorm.eps)),
                ),
            )
            for i, layer in enumerate(dit.layers)
        ]
        self.final_norm = AdaptiveNorm(len(adaptive) - 1, float(dit.norm.eps))
        self.norms = len(adaptive)
        self.hidden = int(dit.norm.dense.weight.shape[1])
        # Every norm's dense (hidden -> 3 x hidden) as one matrix: one GEMM per step for all of them.
        self.dense, self.dense_bias = fuse_linears(*(n.dense for n in adaptive))

    def embed(
        self, x: torch.Tensor, time: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(suffix embeddings (B, H, hidden), the step's modulations (B, norms, 3, 1, hidden))."""
        actions, cond = self.model.embed_action_time(x, time)
        mod = linear(cond, self.dense, self.dense_bias)
        return actions, mod.view(cond.shape[0], self.norms, 3, 1, self.hidden)


Expert = Pi0Expert | Pi05Expert


def expert_of(model: Any) -> Expert:
    """The expert object of a loaded PI0 or π0.5 model (by its config's ``model_type``)."""
    kind = getattr(model.config, "model_type", "pi0")
    if kind == "pi05":
        return Pi05Expert(model)
    if kind == "pi0":
        return Pi0Expert(model)
    raise ValueError(f"model_type {kind!r} is neither PI0 ('pi0') nor π0.5 ('pi05')")
