"""What a stage actor is told of the config, and what front-ends sharing it must agree on.

An actor gets its creator's config without secrets (``actor_config``). A later front-end whose stage
settings (``stage_settings``: the fields that build that role's worker) differ from the running
actor's refuses to start (``client.RemoteStage.start``, by ``settings_mismatch``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from realtime_gw.config import ENV_PREFIX, GatewayConfig

SECRETS = ("api_key", "api_keys", "responder_api_key")
"""Config fields that never leave a front-end: the actors get their defaults."""
SECRET_ENV = tuple(ENV_PREFIX + name.upper() for name in SECRETS)
"""The environment variables that may carry them (``config.load_config``): a local Ray cluster's
processes, the actors among them, inherit the environment of the front-end that starts it."""
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


def stage_settings(role: str, config: GatewayConfig) -> dict[str, Any]:
    """The config fields ``role``'s worker is built from (no secrets), as plain values."""
    fields = msgspec.to_builtins(config)
    # Test faults name their role ("tts:raise@3"): another role's do not build this worker.
    fields["fault_injection"] = [f for f in fields["fault_injection"] if f.split(":", 1)[0] == role]
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
