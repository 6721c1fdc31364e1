"""Where remote stages live: joining the cluster, finding (or creating) the named stage actors, and
which replica a new stream goes to.

Actors are named ``<role>-<replica>`` in ``ray_namespace`` and detached: the first front-end that
asks creates them, every later one (on any node) finds the same ones, and they outlive front-ends.
Ray restarts a dead one (``ray_max_restarts``); its handle stays valid across restarts. An actor gets
its creator's config without secrets (``settings.actor_config``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from realtime_gw.config import ConfigError, GatewayConfig
from realtime_gw.models.remote.settings import SECRET_ENV, actor_config

ROLES = ("tts", "asr", "vad", "turn", "policy", "s2s")

INLINE_BYTES = 8 * 1024 * 1024
"""Ray passes objects up to this size inside the call's gRPC reply (its default: 100 KiB) instead of
through the object store: one step's frames for 64 codec-TTS streams are ~250 KB. On one machine
either way costs the same (docs/benchmarks-log.md); across machines the object store would add a pull
between raylets after every reply."""
_INLINE_ENV = {"RAY_max_direct_call_object_size": str(INLINE_BYTES)}


def remote_roles(config: GatewayConfig) -> list[str]:
    """The stages ``remote_stages`` names, checked."""
    roles = [r.strip() for r in config.remote_stages.split(",") if r.strip()]
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise ConfigError(f"remote_stages: unknown stage(s) {unknown}; choose from {list(ROLES)}")
    if "policy" in roles and config.policy == "none":
        raise ConfigError("remote_stages names policy but policy=none")
    if "s2s" in roles and config.s2s == "none":
        raise ConfigError("remote_stages names s2s but s2s=none")
    return roles


def stage_device(role: str, config: GatewayConfig) -> str:
    devices = {"tts": config.tts_device, "policy": config.policy_device, "s2s": config.s2s_device}
    return devices.get(role, "cpu")


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
        # A local cluster started here inherits this environment, and its actors with it: not the secrets.
        hidden = {key: os.environ.pop(key) for key in SECRET_ENV if key in os.environ}
        try:
            ray.init(
                address=config.ray_address or None,
                namespace=config.ray_namespace,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        finally:
            os.environ.update(hidden)


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
