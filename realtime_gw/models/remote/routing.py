"""Where remote stages live: joining the cluster, finding (or creating) the named stage actors, and
which replica a new stream goes to.

Actors are named ``<role>-<replica>`` in ``ray_namespace`` and detached: the first front-end that
asks creates them, every later one (on any node) finds the same ones, and they outlive front-ends.
Ray restarts a dead one (``ray_max_restarts``); its handle stays valid across restarts. An actor gets
its creator's config without secrets (``actor_config``); a later front-end whose stage settings
(``stage_settings``) differ from the running actor's refuses to start (``client.RemoteStage.start``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from realtime_gw.config import ConfigError, GatewayConfig

ROLES = ("tts", "asr", "vad", "turn", "policy")

SECRETS = ("api_key", "api_keys", "responder_api_key")
"""Config fields that never leave a front-end: the actors get their defaults."""
STAGE_FIELDS_COMMON = (
    "warmup", "worker_max_active", "worker_step_timeout_s", "cpu_backends_in_process", "cpu_backend_spare",
    "fault_injection",
)  # fmt: skip
STAGE_FIELD_PREFIXES = {
    "tts": ("tts",),
    "asr": ("asr",),
    "vad": ("vad",),
    "turn": ("turn",),
    "policy": ("policy", "robot", "openpi_image_history", "openpi_state_history", "openpi_max_sessions"),
}
"""Which config fields build each role's worker (``registry.build_stage`` and its factories read no
others): the settings every front-end sharing that role's actors must agree on."""
INLINE_BYTES = 8 * 1024 * 1024
"""Ray passes objects up to this size inside the call's gRPC message (its default: 100 KiB) instead of
through the object store: one step's frames for 64 codec-TTS streams are ~250 KB, and the object store
path (put, fetch, free: the raylet in the loop) cost ~1 ms more per message here."""
_INLINE_ENV = {"RAY_max_direct_call_object_size": str(INLINE_BYTES)}


def stage_settings(role: str, config: GatewayConfig) -> dict[str, Any]:
    """The config fields ``role``'s worker is built from (no secrets), as plain values."""
    fields = msgspec.to_builtins(config)
    prefixes = STAGE_FIELD_PREFIXES[role]
    return {
        k: v
        for k, v in sorted(fields.items())
        if k in STAGE_FIELDS_COMMON or (k.startswith(prefixes) and k not in SECRETS)
    }


def settings_digest(settings: dict[str, Any]) -> str:
    return hashlib.sha256(msgspec.json.encode(settings, order="sorted")).hexdigest()[:16]


def settings_mismatch(role: str, mine: dict[str, Any], actors: dict[str, Any], namespace: str) -> str | None:
    """Why this front-end cannot share ``role``'s running actors (None: their settings agree)."""
    if settings_digest(mine) == settings_digest(actors):
        return None
    diff = ", ".join(
        f"{k}={mine.get(k)!r} here, {actors.get(k)!r} on the actor"
        for k in sorted(set(mine) | set(actors))
        if mine.get(k) != actors.get(k)
    )
    return (
        f"remote stage {role}: this front-end's config differs from the running {role} actors' "
        f"(namespace {namespace!r}): {diff}. Start every front-end with the same {role} settings, "
        "or give this one another ray_namespace."
    )


def actor_config(config: GatewayConfig) -> GatewayConfig:
    """What an actor receives: the creator's config with every secret at its default."""
    return msgspec.structs.replace(config, **{k: getattr(GatewayConfig(), k) for k in SECRETS})


def remote_roles(config: GatewayConfig) -> list[str]:
    """The stages ``remote_stages`` names, checked."""
    roles = [r.strip() for r in config.remote_stages.split(",") if r.strip()]
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise ConfigError(f"remote_stages: unknown stage(s) {unknown}; choose from {list(ROLES)}")
    if "policy" in roles and config.policy == "none":
        raise ConfigError("remote_stages names policy but policy=none")
    return roles


def stage_device(role: str, config: GatewayConfig) -> str:
    return {"tts": config.tts_device, "policy": config.policy_device}.get(role, "cpu")


@dataclass(frozen=True, slots=True)
class ActorOptions:
    name: str
    namespace: str
    num_cpus: float
    num_gpus: float
    max_restarts: int


def actor_options(role: str, replica: int, config: GatewayConfig) -> ActorOptions:
    gpus = config.ray_num_gpus
    if gpus is None:
        gpus = 1.0 if stage_device(role, config).startswith("cuda") else 0.0
    return ActorOptions(
        name=f"{role}-{replica}",
        namespace=config.ray_namespace,
        num_cpus=config.ray_num_cpus,
        num_gpus=gpus,
        max_restarts=config.ray_max_restarts,
    )


def connect(config: GatewayConfig) -> None:
    """Join the cluster once per process (``ray_address`` empty: a local one, for a single machine)."""
    import ray

    if not ray.is_initialized():
        for key, value in _INLINE_ENV.items():  # read by Ray's core worker at init: this process's calls
            os.environ.setdefault(key, value)
        ray.init(
            address=config.ray_address or None,
            namespace=config.ray_namespace,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )


def stage_actors(role: str, config: GatewayConfig, build: Callable[[str, GatewayConfig], Any]) -> list[Any]:
    """Handles on the role's replicas, created where missing (``get_if_exists``: two front-ends that
    start together end up with the same actors)."""
    import ray

    from realtime_gw.models.remote.actor import StageActor

    remote_class = ray.remote(StageActor)
    handles = []
    for replica in range(config.ray_replicas):
        o = actor_options(role, replica, config)
        handles.append(
            remote_class.options(
                name=o.name,
                namespace=o.namespace,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=o.num_cpus,
                num_gpus=o.num_gpus,
                max_restarts=o.max_restarts,
                max_concurrency=1000,  # async actor: every front-end's long poll waits at once
                runtime_env={"env_vars": _INLINE_ENV},  # the actor's answers inline
            ).remote(build, role, actor_config(config))
        )
    return handles


def replica_order(free_slots: Sequence[int | None]) -> list[int]:
    """Replicas a new stream may try, most free slots first (None: not ready, never tried). A replica
    that answers "no free slot" anyway (another front-end took it meanwhile) passes to the next."""
    ready = [i for i, free in enumerate(free_slots) if free is not None and free > 0]
    return sorted(ready, key=lambda i: -(free_slots[i] or 0))
