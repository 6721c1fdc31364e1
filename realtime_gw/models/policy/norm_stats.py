"""Normalization statistics of a policy checkpoint: read, checked against the robot, applied as openpi does.

Formats read (the statistics of one dataset: per feature ``mean``, ``std``, ``q01``, ``q99``):

- openpi's ``norm_stats.json``: ``{"norm_stats": {"state": {...}, "actions": {...}}}`` (the wrapper optional);
- LeRobot's dataset stats (``meta/stats.json``): ``{"observation.state": {...}, "action": {...}}``, and the
  same as a LeRobot policy's normalizer saves them (``*normalizer_processor.safetensors``, flat keys
  ``observation.state.mean`` ...);
- transformers' ``PI0Processor`` / ``PI05Processor`` config (``processor_config.json``: ``state_mean``,
  ``state_std``, ``actions_mean``, ``actions_std``, and π0.5's ``state_q01`` ... ``actions_q99``).

Modes, with openpi's formulas (``Normalize`` / ``Unnormalize`` in ``src/openpi/transforms.py``): ``zscore``
``(x - mean) / (std + 1e-6)`` (PI0) and ``quantile`` ``(x - q01) / (q99 - q01 + 1e-6) * 2 - 1`` (PI0-FAST,
PI0.5). The state is normalized on the way in, actions un-normalized on the way out; statistics longer
than the robot's vectors are cut to them (as openpi's ``Normalize``), shorter ones are refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MODES = ("zscore", "quantile")
EPS = 1e-6
STATE_KEYS = ("state", "observation.state", "observation/state")
ACTION_KEYS = ("actions", "action")
_FIELDS = {"zscore": ("mean", "std"), "quantile": ("q01", "q99")}
PROCESSOR_FIELDS = ("mean", "std", "q01", "q99")


@dataclass(frozen=True)
class NormStats:
    """One checkpoint's statistics, cut to the robot's state and action sizes."""

    state_mean: np.ndarray | None = None
    state_std: np.ndarray | None = None
    actions_mean: np.ndarray | None = None
    actions_std: np.ndarray | None = None
    mode: str = "zscore"
    state_q01: np.ndarray | None = None
    state_q99: np.ndarray | None = None
    actions_q01: np.ndarray | None = None
    actions_q99: np.ndarray | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"normalization mode {self.mode!r}; expected one of {MODES}")
        names = [f"{feature}_{field}" for feature in ("state", "actions") for field in _FIELDS[self.mode]]
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise ValueError(f"{self.mode} normalization needs {', '.join(missing)}")

    def state(self, x: np.ndarray) -> np.ndarray:
        """Normalize a state (any leading dims)."""
        return self._normalize(x, "state")

    def actions(self, x: np.ndarray) -> np.ndarray:
        """Un-normalize model actions."""
        if self.mode == "quantile":
            q01, q99 = self.actions_q01, self.actions_q99
            return (x + 1.0) / 2.0 * (q99 - q01 + EPS) + q01  # type: ignore[operator]
        return x * (self.actions_std + EPS) + self.actions_mean  # type: ignore[operator]

    def normalize_actions(self, x: np.ndarray) -> np.ndarray:
        """Robot actions -> model space (the inverse of ``actions``; real-time chunking's target)."""
        return self._normalize(x, "actions")

    def describe(self) -> str:
        what = "mean/std" if self.mode == "zscore" else "quantiles q01/q99"
        return f"{what} from {self.source}" if self.source else what

    def _normalize(self, x: np.ndarray, feature: str) -> np.ndarray:
        if self.mode == "quantile":
            q01, q99 = getattr(self, f"{feature}_q01"), getattr(self, f"{feature}_q99")
            return (x - q01) / (q99 - q01 + EPS) * 2.0 - 1.0
        return (x - getattr(self, f"{feature}_mean")) / (getattr(self, f"{feature}_std") + EPS)


# -- reading ----------------------------------------------------------------------------------------------
def read_stats(path: str | Path) -> dict[str, Any]:
    """The file as ``{feature: {field: values}}``, whatever of the supported formats it is in."""
    p = Path(path)
    if p.suffix == ".safetensors":
        from safetensors.numpy import load_file

        try:
            flat = load_file(str(p))
        except Exception as e:
            raise ValueError(f"{p}: not a readable safetensors file ({e})") from None
        grouped: dict[str, Any] = {}
        for key, value in flat.items():
            feature, _, field = key.rpartition(".")
            grouped.setdefault(feature, {})[field] = value
        return grouped
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{p}: not a readable JSON statistics file ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{p}: expected a JSON object of statistics, got {type(doc).__name__}")
    if isinstance(doc.get("norm_stats"), dict):
        return doc["norm_stats"]
    if any(f"{feature}_{field}" in doc for feature in ("state", "actions") for field in PROCESSOR_FIELDS):
        # transformers' PI0Processor / PI05Processor config
        return {
            feature: {field: doc.get(f"{feature}_{field}") for field in PROCESSOR_FIELDS}
            for feature in ("state", "actions")
        }
    return doc


def load_norm_stats(path: str | Path, state_dim: int, action_dim: int, mode: str = "zscore") -> NormStats:
    """Read ``path`` and check it against the robot: every vector the ``mode`` uses must be 1-D, finite and at
    least as long as the state (``state_dim``) or actions (``action_dim``); longer ones are cut."""
    if mode not in MODES:
        raise ValueError(f"normalization mode {mode!r}; expected one of {MODES}")
    stats = read_stats(path)
    fields: dict[str, np.ndarray] = {}
    for feature, keys, dim in (("state", STATE_KEYS, state_dim), ("actions", ACTION_KEYS, action_dim)):
        entry = next((stats[k] for k in keys if isinstance(stats.get(k), dict)), None)
        if entry is None:
            raise ValueError(
                f"{path}: no {feature} statistics (looked for {', '.join(repr(k) for k in keys)}); "
                f"the file has {sorted(stats)[:12]}"
            )
        for field in _FIELDS[mode]:
            fields[f"{feature}_{field}"] = _vector(path, entry, feature, field, dim, mode)
        lo, hi = _FIELDS[mode]
        if mode == "zscore" and (fields[f"{feature}_std"] < 0).any():
            raise ValueError(f"{path}: {feature}.std has negative values")
        if mode == "quantile" and (fields[f"{feature}_{hi}"] < fields[f"{feature}_{lo}"]).any():
            raise ValueError(f"{path}: {feature}.q99 is below {feature}.q01 somewhere")
    return NormStats(mode=mode, source=str(path), **fields)  # type: ignore[arg-type]


def _vector(
    path: str | Path, entry: dict[str, Any], feature: str, field: str, dim: int, mode: str
) -> np.ndarray:
    value = entry.get(field)
    if value is None:
        present = ", ".join(sorted(k for k, v in entry.items() if v is not None)) or "nothing"
        other = "quantile" if mode == "zscore" else "zscore"
        raise ValueError(
            f"{path}: missing {feature}.{field} ({mode} normalization needs {' and '.join(_FIELDS[mode])}; "
            f"this file has {present}: choose policy_norm_mode {other!r} or another file)"
        )
    try:
        v = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {feature}.{field} is not a list of numbers ({e})") from None
    if v.ndim != 1 or v.shape[0] < dim:
        raise ValueError(
            f"{path}: {feature}.{field} has shape {v.shape}, need at least ({dim},): the robot's {feature} "
            f"has {dim} dims, so these statistics belong to another robot or dataset"
        )
    v = v[:dim]
    if not np.isfinite(v).all():
        raise ValueError(f"{path}: {feature}.{field} contains NaN or infinity")
    return v


def find_norm_stats(root: str | Path) -> Path | None:
    """The statistics shipped inside a checkpoint directory, if any (openpi's, LeRobot's or transformers')."""
    root = Path(root)
    openpi = [root / "norm_stats.json", *sorted(root.glob("assets/*/norm_stats.json"))]
    found = [p for p in openpi if p.is_file()]
    if len(found) > 1 and found[0] != root / "norm_stats.json":
        raise ValueError(
            f"{root} holds several openpi statistics files ({', '.join(str(p) for p in found)}); "
            "name one with policy_norm_stats"
        )
    if found:
        return found[0]
    lerobot = [root / "stats.json", root / "meta" / "stats.json"]
    lerobot += sorted(root.glob("*normalizer_processor.safetensors"))
    for p in lerobot:
        if p.is_file():
            return p
    processor = root / "processor_config.json"
    if processor.is_file():
        try:
            doc = json.loads(processor.read_text())
        except (OSError, ValueError):
            return None
        if isinstance(doc, dict) and any(doc.get(f"state_{f}") is not None for f in PROCESSOR_FIELDS):
            return processor
    return None


def mode_hint(checkpoint_config: dict[str, Any]) -> str | None:
    """The normalization a checkpoint's ``config.json`` names, if it names one: openpi's
    ``use_quantile_norm``, or a LeRobot policy config's ``normalization_mapping`` (``ACTION``)."""
    quantile = checkpoint_config.get("use_quantile_norm")
    if isinstance(quantile, bool):
        return "quantile" if quantile else "zscore"
    mapping = checkpoint_config.get("normalization_mapping")
    if isinstance(mapping, dict):
        action = str(mapping.get("ACTION", "")).upper()
        return {"QUANTILES": "quantile", "MEAN_STD": "zscore"}.get(action)
    return None
