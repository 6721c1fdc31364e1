"""Named shapes of Moshi (Kyutai's full-duplex speech-to-speech model) for random init, and a published
checkpoint's own ``config.json``.

``7b`` is moshiko/moshika as Kyutai's ``moshi`` package builds them (``moshi.models.loaders._lm_kwargs``,
``moshi==0.2.13``): a 32-layer temporal transformer (dim 4096, 32 heads of 128, RMS norm eps 1e-8 in
float32, gated SiLU MLP from ``hidden_scale`` 4.125, interleaved RoPE with ``max_period`` 10000, a
3000-frame causal context), text vocab 32000 (+1 start id; padding id 3, end-of-padding id 0), 16 audio
streams of 2048 codes (+1 start id: 8 the model speaks, 8 it hears), and a depformer (6 layers, dim 1024,
16 heads, feed-forward 4224, one set of weights per sub-step, no positional embedding) that emits the
model's 8 codebooks of a frame one after another from the text token. The delays (steps each stream lags
the text) are ``[0, 0, 1x7, 0, 1x7]``. The codec is Mimi as published (kyutai/mimi, 8 of its 32
codebooks). Sampling as ``moshi.models.lm.LMGen``: temperature 0.8 / top-k 250 for audio, 0.7 / 25 for text.

``tiny`` keeps every structural feature (the delays, per-step depformer weights, the gated MLP, a context
that wraps within a test, the Mimi of ``codec.spec.TINY_MIMI``) at toy widths so CPU tests run in seconds.

PersonaPlex (NVIDIA's nvidia/personaplex-7b-v1, a fork of this package: ``moshi.models.loaders`` of
github.com/NVIDIA/personaplex) is the 7b shape with ``dep_q = 16``: its depformer has 16 sub-steps with
their own weights, the model's 8 codebooks and then the user's 8 (trained to predict both sides; at
inference the user's 8 are always teacher-forced with what the user said, so they never feed back).
Everything else is Moshi 7B's: card 2048, ``n_q`` 16, 3000-frame context, the same delays, no
``depformer_weights_per_step_schedule``. ``personaplex_tiny`` is ``tiny`` with 16 sub-steps and a context
long enough for a short prompt plus a few frames (the prompt must fit the context).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from realtime_gw.models.speech.codec.spec import TINY_MIMI

SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920
FRAME_MS = 80
PUBLISHED_DELAYS = (0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1)


@dataclass(frozen=True)
class MoshiShape:
    """The LM's shape (``moshi.models.lm.LMModel`` keyword names) and its codec's (``MimiConfig`` kwargs)."""

    name: str
    dim: int
    num_heads: int
    num_layers: int
    hidden_scale: float
    context: int
    """Temporal-transformer positions a step sees (its own included): the ring KV per slot."""
    max_period: float
    text_card: int
    card: int
    n_q: int
    """Audio streams the temporal transformer reads: the model's ``dep_q``, then the user's."""
    dep_q: int
    depformer_dim: int
    depformer_num_heads: int
    depformer_num_layers: int
    depformer_dim_feedforward: int
    delays: tuple[int, ...] = PUBLISHED_DELAYS
    text_padding_id: int = 3
    text_end_padding_id: int = 0
    mimi: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.delays) != self.n_q + 1:
            raise ValueError(f"{len(self.delays)} delays for {self.n_q + 1} streams")
        if self.n_q % 2 or self.dep_q not in (self.n_q // 2, self.n_q):
            raise ValueError(
                "the model speaks as many codebooks as it hears (n_q even) and its depformer emits its own "
                f"(dep_q = n_q / 2, Moshi) or both sides' (dep_q = n_q, PersonaPlex); got n_q={self.n_q}, "
                f"dep_q={self.dep_q}"
            )

    @property
    def own_q(self) -> int:
        """The model's own audio codebooks (it hears as many of the user's): what it says each frame."""
        return self.n_q // 2

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def depformer_head_dim(self) -> int:
        return self.depformer_dim // self.depformer_num_heads

    @property
    def gating_hidden(self) -> int:
        """The temporal MLP's hidden width, as ``moshi.modules.gating.ActivationGating`` derives it."""
        return gating_hidden(self.dim, int(self.hidden_scale * self.dim))

    @property
    def depformer_gating_hidden(self) -> int:
        return gating_hidden(self.depformer_dim, self.depformer_dim_feedforward)

    @property
    def max_delay(self) -> int:
        return max(self.delays)

    @property
    def padding_ids(self) -> tuple[int, ...]:
        return (self.text_padding_id, self.text_end_padding_id)


def gating_hidden(dim: int, dim_feedforward: int) -> int:
    return (21 * dim) // 8 if dim_feedforward == 4 * dim else (2 * dim_feedforward) // 3


def moshi_7b() -> MoshiShape:
    return MoshiShape(
        name="7b", dim=4096, num_heads=32, num_layers=32, hidden_scale=4.125, context=3000,
        max_period=10000.0, text_card=32000, card=2048, n_q=16, dep_q=8, depformer_dim=1024,
        depformer_num_heads=16, depformer_num_layers=6, depformer_dim_feedforward=int(4.125 * 1024),
        mimi={"num_quantizers": 32},
    )  # fmt: skip


def moshi_tiny() -> MoshiShape:
    return MoshiShape(
        name="tiny", dim=64, num_heads=4, num_layers=2, hidden_scale=4.125, context=6, max_period=10000.0,
        text_card=96, card=TINY_MIMI["codebook_size"], n_q=16, dep_q=8, depformer_dim=32,
        depformer_num_heads=4, depformer_num_layers=2, depformer_dim_feedforward=int(4.125 * 32),
        mimi={**TINY_MIMI, "num_quantizers": 8},
    )  # fmt: skip


def personaplex_7b() -> MoshiShape:
    """``moshi.models.loaders.get_moshi_lm`` of NVIDIA/personaplex: ``_lm_kwargs`` with ``dep_q = 16``."""
    return replace(moshi_7b(), name="personaplex-7b", dep_q=16)


def personaplex_tiny() -> MoshiShape:
    return replace(moshi_tiny(), name="personaplex-tiny", dep_q=16, context=96)


FAMILY_SHAPES = {
    "moshi": {"tiny": moshi_tiny, "7b": moshi_7b},
    "personaplex": {"tiny": personaplex_tiny, "7b": personaplex_7b},
}


def named_shape(name: str, family: str = "moshi") -> MoshiShape:
    shapes = FAMILY_SHAPES.get(family)
    if shapes is None:
        raise ValueError(f"unknown speech-to-speech family {family!r}; expected one of {sorted(FAMILY_SHAPES)}")
    if name not in shapes:
        raise ValueError(f"unknown s2s_config {name!r}; expected one of {sorted(shapes)}")
    return shapes[name]()


_LM_KEYS = (
    "dim", "num_heads", "num_layers", "hidden_scale", "context", "max_period", "text_card", "card", "n_q",
    "dep_q", "depformer_dim", "depformer_num_heads", "depformer_num_layers", "depformer_dim_feedforward",
)  # fmt: skip


def shape_from_dir(root: Path, default: MoshiShape) -> MoshiShape:
    """A checkpoint directory's ``config.json`` (Kyutai's layout: the LM kwargs at top level, or under
    ``lm_config``) over ``default``; without one, ``default`` (moshiko/moshika ship none: they are the 7b
    shape). A ``mimi_config`` key (not in Kyutai's files: the published Mimi) gives the codec's shape."""
    f = root / "config.json"
    if not f.exists():
        return default
    data = json.loads(f.read_text())
    lm = data.get("lm_config", data)
    unsupported = {
        k: lm[k]
        for k in ("depformer_weights_per_step_schedule", "depformer_low_rank_embeddings", "conditioners")
        if lm.get(k)
    }
    if unsupported:
        raise ValueError(f"{f}: features this stage does not build: {sorted(unsupported)}")
    over: dict[str, Any] = {k: lm[k] for k in _LM_KEYS if k in lm}
    if "mimi_config" in data:  # this gateway's addition (tests, other shapes): MimiConfig kwargs
        over["mimi"] = dict(data["mimi_config"])
    if "delays" in lm:
        over["delays"] = tuple(int(d) for d in lm["delays"])
    if "existing_text_padding_id" in lm:
        over["text_padding_id"] = int(lm["existing_text_padding_id"])
    return replace(default, name=f"{default.name} ({f})", **over)


def describe_shape(shape: MoshiShape) -> dict[str, Any]:
    """The shape as plain JSON data (a warm-up report crosses processes as msgpack)."""
    d = asdict(shape)
    d.pop("mimi")
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
