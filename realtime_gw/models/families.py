"""The model families the gateway serves: one row per (role, name), each naming the ``from_config``
builder of its folder. The config's choices (``--tts``, ``--asr``, ``--vad``, ``--policy``, ``--s2s``) are the names
here; ``registry`` builds every stage through this table.

A builder takes the ``GatewayConfig`` and returns a ``StagePlan``: the backend (or, for one that holds
the GIL, a picklable factory the registry runs in a child process) and how its worker serves it. A
config the family cannot serve is a ``ConfigError`` naming the flag. Builders are imported only when
their family is built, so this table loads no model library (no torch).

Adding a family: its folder under ``models/speech``, ``models/policy`` or ``models/s2s`` with a ``from_config``, one row
below, and the contract kit (``tests/models/contract_kit.py``) green for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Literal

from realtime_gw.config import ConfigError, GatewayConfig
from realtime_gw.models.contract import Backend

Role = Literal["tts", "asr", "vad", "turn", "policy", "s2s"]

TURN_FAMILY = "smart"
"""The end-of-turn model (semantic VAD); the config has no choice for it."""


@dataclass(slots=True)
class StagePlan:
    """How a family's backend is served by its stage worker."""

    backend: Backend[Any] | None = None
    """Built here: it runs on the worker's thread (a torch or onnxruntime backend)."""
    factory: Callable[[], Backend[Any]] | None = None
    """Instead of ``backend``: a picklable factory for a backend that holds the GIL for long (Piper,
    pocketsphinx); the registry runs it in a child process (``process_backend``) unless the config
    keeps CPU backends in process."""
    name: str = ""
    """The worker's name for a backend built by ``factory`` (known before its child runs)."""
    device: str = "cpu"
    max_batch: int = 8
    max_active: int = 64
    max_wait_ms: float = 0.0
    max_backlog: int = 64
    admit: Callable[[Any], str | None] | None = None
    """The worker's per-request check at submit (``runtime.StageWorker``'s ``admit``)."""
    lockstep_ms: float | None = None
    """Step every live request once per this many ms, all in one batched step (``models/lockstep.py``);
    None: a step whenever inputs are ready."""
    lockstep_stop_when_idle: bool = False
    """The lockstep steps only requests with input and stops while none has any (``Lockstep.stop_when_idle``)."""

    def build_backend(self) -> Backend[Any]:
        """The backend itself, here (tests, tools): ``backend``, or ``factory`` run in this process."""
        if self.backend is not None:
            return self.backend
        assert self.factory is not None, "a StagePlan has a backend or a factory"
        return self.factory()


OUT_OF_MEMORY_HINT = (
    "out of device memory while building it, beside the stages built before it (what a stage preallocates "
    "grows with its slots, `*_max_batch` / `*_slots`, and for Qwen3-TTS with `tts_max_frames`: lower them, "
    "or give a stage another device): "
)
"""Said before a CUDA out-of-memory at start-up, which names only the stage that asked last."""


@dataclass(frozen=True, slots=True)
class Family:
    role: Role
    name: str
    builder: str
    """``module:function``, the family's ``from_config(config) -> StagePlan``."""

    def from_config(self, config: GatewayConfig) -> StagePlan:
        module, _, function = self.builder.partition(":")
        build: Callable[[GatewayConfig], StagePlan] = getattr(import_module(module), function)
        try:
            return build(config)
        except ConfigError:
            raise
        except (ValueError, KeyError, OSError, RuntimeError) as e:  # a setting the family cannot serve
            hint = OUT_OF_MEMORY_HINT if type(e).__name__ == "OutOfMemoryError" else ""
            raise ConfigError(f"--{self.role} {self.name}: {hint}{e}") from e


FAMILIES: tuple[Family, ...] = (
    Family("tts", "piper", "realtime_gw.models.speech.tts_piper:from_config"),
    Family("tts", "tone", "realtime_gw.models.speech.tts_tone:from_config"),
    Family("tts", "codec", "realtime_gw.models.speech.tts_codec:from_config"),
    Family("tts", "qwen3", "realtime_gw.models.speech.tts_qwen3:from_config"),
    Family("asr", "pocketsphinx", "realtime_gw.models.speech.asr_pocketsphinx:from_config"),
    Family("asr", "kyutai", "realtime_gw.models.speech.asr_kyutai:from_config"),
    Family("vad", "silero", "realtime_gw.models.speech.vad:from_config"),
    Family("turn", TURN_FAMILY, "realtime_gw.models.speech.turn_smart:from_config"),
    Family("policy", "pi0", "realtime_gw.models.policy.factory:pi0_from_config"),
    Family("policy", "pi05", "realtime_gw.models.policy.factory:pi05_from_config"),
    Family("policy", "noop", "realtime_gw.models.policy.factory:noop_from_config"),
    Family("s2s", "moshi", "realtime_gw.models.s2s.backend:from_config"),
    Family("s2s", "personaplex", "realtime_gw.models.s2s.personaplex:from_config"),
)


def names(role: Role) -> tuple[str, ...]:
    """The family names of ``role``: the config's choices for it."""
    return tuple(f.name for f in FAMILIES if f.role == role)


def family(role: Role, name: str) -> Family:
    for f in FAMILIES:
        if f.role == role and f.name == name:
            return f
    raise ConfigError(f"--{role} {name}: no such {role} family; choose one of {', '.join(names(role))}")


def chosen(role: Role, config: GatewayConfig) -> Family:
    """The family the config names for ``role``."""
    name = TURN_FAMILY if role == "turn" else str(getattr(config, role))
    return family(role, name)
