"""An on-disk cache of the policy's ``torch.compile`` work, so that a warm start-up skips inductor.

Compiling the action expert's step (plain and guided, per batch bucket) is most of a cold start-up.
After warm-up the process's compile artifacts (inductor's FX-graph cache entries, AOTAutograd's, autotune
results) are written with ``torch.compiler.save_cache_artifacts`` to ``<dir>/<key>.bin``; the next start
loads them with ``load_cache_artifacts`` before compiling, so each compile is a cache hit (dynamo still
traces the Python; inductor's code generation and, on CUDA, the Triton builds bundled with its entries
are skipped). Inductor's own cache directory moves under ours too (``<dir>/inductor``, unless
``TORCHINDUCTOR_CACHE_DIR`` names another), so the kernels it builds outside those entries (the C++ of
a CPU compile) survive a restart as well; its default is under ``/tmp``, which a container restart
empties. Both are process-wide: other stages' compiles land there as well.

The key names everything the compiled code depends on: the model's config and dtype, the static shapes
(buckets, prompt and image layout), the torch and transformers versions, the device (name and compute
capability) and the source of the compiled modules. A changed model, GPU, torch, transformers or sampler
never reads another's file (and inductor's own entries are keyed by graph and inputs inside, so even a
wrong file could not be used).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

SOURCES = ("pi0_functional.py", "expert.py", "chunk_slots.py", "../kernels.py", "../fp8.py")
"""The modules whose code the compiled step and prefix run (relative to this package)."""


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/realtime-gw/policy-compile`` (``~/.cache/...`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "realtime-gw" / "policy-compile"


def device_signature(device: torch.device) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} sm{major}{minor} cuda {torch.version.cuda}"
    return f"{device.type} {platform.machine()} {platform.processor()}"


def cache_key(
    model_config: dict[str, Any], dtype: torch.dtype, device: torch.device, shapes: dict[str, Any]
) -> str:
    """A hex digest of everything a compiled step depends on (see the module doc)."""
    here = Path(__file__).resolve().parent
    sources = hashlib.sha256()
    for name in SOURCES:
        sources.update((here / name).read_bytes())
    doc = {
        "model": model_config,
        "dtype": str(dtype),
        "shapes": shapes,
        "torch": torch.__version__,
        # The prefix's compiled code traces transformers' SigLIP and rotary modules as well.
        "transformers": importlib.metadata.version("transformers"),
        "device": device_signature(device),
        "sources": sources.hexdigest(),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:32]


class CompileCache:
    """One key's artifact file in ``directory``; ``load`` before compiling, ``save`` after."""

    def __init__(self, directory: str | Path, key: str) -> None:
        self.directory = Path(directory).expanduser()
        self.key = key
        self.path = self.directory / f"{key}.bin"
        self.loaded = False
        self.saved_bytes = 0

    def load(self) -> bool:
        """Feed a previous start's artifacts to torch's caches; False when there are none (a cold start)
        or they cannot be read (then the compile simply runs)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            _move_inductor_cache(self.directory / "inductor")
        except OSError as e:  # e.g. a read-only home in a container: compile without the cache
            log.warning(
                "policy: compile cache directory %s unusable (%s); compiling afresh", self.directory, e
            )
            return False
        if not self.path.is_file():
            return False
        try:  # torch answers None (and logs why) for a file it cannot read
            info = torch.compiler.load_cache_artifacts(self.path.read_bytes())
        except Exception as e:  # a corrupt or foreign file costs a cold compile, never the start-up
            info, why = None, str(e)
        else:
            why = "see torch's warning"
        if info is None:
            log.warning("policy: compile cache %s unreadable (%s); compiling afresh", self.path, why)
            return False
        self.loaded = True
        return True

    def save(self) -> int:
        """Write the process's compile artifacts (atomically); the bytes written, 0 when none."""
        try:
            artifacts = torch.compiler.save_cache_artifacts()
        except Exception as e:
            log.warning("policy: compile artifacts not saved: %s", e)
            return 0
        if artifacts is None:
            return 0
        data = artifacts[0]
        tmp = self.path.with_suffix(f".{os.getpid()}.{time.monotonic_ns()}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            tmp.replace(self.path)
        except OSError as e:  # a full or read-only disk costs the next start a compile, not this one
            log.warning("policy: compile artifacts not saved to %s: %s", self.path, e)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return 0
        self.saved_bytes = len(data)
        return len(data)

    def describe(self) -> dict[str, Any]:
        """For ``/readyz``, which answers without a key: the entry's name (its key), not the directory."""
        return {"entry": self.path.name, "loaded": self.loaded, "saved_bytes": self.saved_bytes}


def _move_inductor_cache(directory: Path) -> None:
    """Point inductor's cache at ``directory`` unless the user named one (torch writes its default
    into the variable once it has used it, so that value counts as unset)."""
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    try:
        from torch._inductor.runtime import cache_dir_utils

        default: str | None = os.path.abspath(cache_dir_utils.default_cache_dir())
    except ImportError:  # a torch without that module: only an unset variable counts as unset
        default = None
    if current is None or os.path.abspath(current) == default:
        directory.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
