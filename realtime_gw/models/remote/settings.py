"""What a stage actor is told of the config, and what front-ends sharing it must agree on.

An actor gets its creator's config without secrets (``actor_config``). A later front-end whose stage
settings (``stage_settings``: the fields that build that role's worker) differ from the running
actor's refuses to start (``client.RemoteStage.start``, by ``settings_mismatch``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from realtime_gw.config import ENV_PREFIX, SECRETS, GatewayConfig
from realtime_gw.config.sections import fields_under

SECRET_ENV = tuple(ENV_PREFIX + name.upper() for name in SECRETS)
"""The environment variables that may carry the secrets (``config.load_config``): a local Ray cluster's
processes, the actors among them, inherit the environment of the front-end that starts it. The actors
get the secrets' defaults (``actor_config``)."""
STAGE_SETTINGS = {
    "tts": ("workers", "tts"),
    "asr": ("workers", "asr"),
    "vad": ("workers", "vad"),
    "turn": ("workers",),
    "policy": ("workers", "policy", "robot", "openpi.max_sessions"),
    "s2s": ("workers", "s2s", "realtime.s2s_input_slack_ms"),
}
"""Which config sections (with their subsections) or single settings build each role's worker
(``registry.build_stage`` and its factories read no others): the settings every front-end sharing that
role's actors must agree on. ``workers`` holds what every stage worker is built with."""


def stage_settings(role: str, config: GatewayConfig) -> dict[str, Any]:
    """The config fields ``role``'s worker is built from (no secrets), as plain values."""
    names = {f for path in STAGE_SETTINGS[role] for f in fields_under(path)} - set(SECRETS)
    fields = msgspec.to_builtins(config)
    # Test faults name their role ("tts:raise@3"): another role's do not build this worker.
    fields["fault_injection"] = [f for f in fields["fault_injection"] if f.split(":", 1)[0] == role]
    return {k: v for k, v in sorted(fields.items()) if k in names}


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
