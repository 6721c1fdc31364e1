"""Moshi's LM weights under the names of Kyutai's published checkpoints (``model.safetensors`` of
kyutai/moshiko-pytorch-bf16: ``moshi.models.lm.LMModel``'s state dict as it was saved, before the
package split the attention projections per sub-step), as one flat table of tensors.

Names (``T`` = ``transformer``, ``D`` = ``depformer``; ``s`` a depformer sub-step)::

    emb.{k}.weight                (card + 1, dim)            k < n_q: audio stream k's input embedding
    text_emb.weight               (text_card + 1, dim)
    text_linear.weight            (text_card, dim)
    T.layers.{i}.self_attn.in_proj_weight    (3 dim, dim)     q, k, v rows; RoPE pairs interleaved
    T.layers.{i}.self_attn.out_proj.weight   (dim, dim)
    T.layers.{i}.norm1.alpha / norm2.alpha   (1, 1, dim)     RMS norms (float32 inside)
    T.layers.{i}.gating.linear_in.weight     (2 hidden, dim)  SiLU(first half) * second half
    T.layers.{i}.gating.linear_out.weight    (dim, hidden)
    out_norm.alpha                (1, 1, dim)
    depformer_in.{s}.weight       (depformer_dim, dim)
    depformer_emb.{s}.weight      (card + 1, depformer_dim)   s < dep_q - 1: input of sub-step s + 1
    depformer_text_emb.weight     (text_card + 1, depformer_dim)
    D.layers.{i}.self_attn.in_proj_weight    (dep_q 3 ddim, ddim)   every sub-step's q, k, v stacked
    D.layers.{i}.self_attn.out_proj.weight   (dep_q ddim, ddim)
    D.layers.{i}.norm1.alpha / norm2.alpha
    D.layers.{i}.gating.{s}.linear_in.weight / linear_out.weight
    linears.{s}.weight            (card, depformer_dim)      sub-step s's audio head

The package's own ``state_dict()`` of today splits the attention projections (``in_projs.{s}.weight``,
``out_projs.{s}.weight``); those are accepted too and stacked back (what its load hook undoes). Loading
is strict: a missing, extra or misshapen tensor is an error naming it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from realtime_gw.models.s2s.config import MoshiShape

INIT_SEED = 0
"""Random-init weights are seeded, so every process builds the same model."""


def expected_shapes(shape: MoshiShape) -> dict[str, tuple[int, ...]]:
    """Every tensor of the published layout and its shape."""
    d, dd, h, dh = shape.dim, shape.depformer_dim, shape.gating_hidden, shape.depformer_gating_hidden
    out: dict[str, tuple[int, ...]] = {}
    for k in range(shape.n_q):
        out[f"emb.{k}.weight"] = (shape.card + 1, d)
    out["text_emb.weight"] = (shape.text_card + 1, d)
    out["text_linear.weight"] = (shape.text_card, d)
    for i in range(shape.num_layers):
        p = f"transformer.layers.{i}."
        out[p + "self_attn.in_proj_weight"] = (3 * d, d)
        out[p + "self_attn.out_proj.weight"] = (d, d)
        out[p + "norm1.alpha"] = (1, 1, d)
        out[p + "norm2.alpha"] = (1, 1, d)
        out[p + "gating.linear_in.weight"] = (2 * h, d)
        out[p + "gating.linear_out.weight"] = (d, h)
    out["out_norm.alpha"] = (1, 1, d)
    for s in range(shape.dep_q):
        out[f"depformer_in.{s}.weight"] = (dd, d)
        out[f"linears.{s}.weight"] = (shape.card, dd)
    for s in range(shape.dep_q - 1):
        out[f"depformer_emb.{s}.weight"] = (shape.card + 1, dd)
    out["depformer_text_emb.weight"] = (shape.text_card + 1, dd)
    for i in range(shape.depformer_num_layers):
        p = f"depformer.layers.{i}."
        out[p + "self_attn.in_proj_weight"] = (shape.dep_q * 3 * dd, dd)
        out[p + "self_attn.out_proj.weight"] = (shape.dep_q * dd, dd)
        out[p + "norm1.alpha"] = (1, 1, dd)
        out[p + "norm2.alpha"] = (1, 1, dd)
        for s in range(shape.dep_q):
            out[p + f"gating.{s}.linear_in.weight"] = (2 * dh, dd)
            out[p + f"gating.{s}.linear_out.weight"] = (dd, dh)
    return out


def random_weights(shape: MoshiShape, device: str | torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Seeded random weights at ``shape``: truncated normal with std ``1/sqrt(fan_in)`` (embeddings:
    ``1/sqrt(dim)``), norms at 1, as ``LMModel._init_weights`` starts them. Real cost, no speech."""
    out: dict[str, torch.Tensor] = {}
    gen = torch.Generator(device=device).manual_seed(INIT_SEED)  # drawn where they live: 7B in seconds
    for name, shp in expected_shapes(shape).items():
        if name.endswith("alpha"):
            out[name] = torch.ones(shp, dtype=dtype, device=device)
            continue
        std = 1.0 / math.sqrt(shp[-1])
        t = torch.empty(shp, dtype=dtype, device=device)
        out[name] = t.normal_(0.0, std, generator=gen).clamp_(-3 * std, 3 * std)
    return out


_SPLIT = re.compile(r"^(.*\.self_attn\.)(in_projs|out_projs)\.(\d+)\.weight$")


def to_published(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Accept the package's split attention projections (``in_projs.{s}``/``out_projs.{s}``) and the
    older ``in_proj.weight`` name: stacked into the published ``in_proj_weight``/``out_proj.weight``."""
    out: dict[str, torch.Tensor] = {}
    split: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    for name, t in state.items():
        m = _SPLIT.match(name)
        if m:
            split.setdefault((m.group(1), m.group(2)), {})[int(m.group(3))] = t
        elif name.endswith(".self_attn.in_proj.weight"):
            out[name.removesuffix("in_proj.weight") + "in_proj_weight"] = t
        else:
            out[name] = t
    for (prefix, kind), parts in split.items():
        if sorted(parts) != list(range(len(parts))):
            raise ValueError(f"{prefix}{kind}: sub-steps {sorted(parts)} are not 0..{len(parts) - 1}")
        name = prefix + ("in_proj_weight" if kind == "in_projs" else "out_proj.weight")
        out[name] = torch.cat([parts[i] for i in range(len(parts))])
    return out


def check_weights(state: dict[str, torch.Tensor], shape: MoshiShape, source: str) -> None:
    """Strict: the exact names and shapes of ``expected_shapes``; a clear error otherwise."""
    want = expected_shapes(shape)
    missing = sorted(set(want) - set(state))
    extra = sorted(set(state) - set(want))
    if missing or extra:
        raise ValueError(
            f"{source}: not Moshi's published layout at shape {shape.name}: "
            f"missing {missing[:6]}{' ...' if len(missing) > 6 else ''}, "
            f"unexpected {extra[:6]}{' ...' if len(extra) > 6 else ''}"
        )
    bad = [f"{k} {tuple(state[k].shape)} != {v}" for k, v in want.items() if tuple(state[k].shape) != v]
    if bad:
        raise ValueError(f"{source}: tensors of the wrong shape: {bad[:6]}")


def load_weights(
    path: Path, shape: MoshiShape, device: str | torch.device, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = to_published(load_file(str(path), device="cpu"))
    check_weights(state, shape, str(path))
    return {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
