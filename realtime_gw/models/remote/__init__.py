"""Stage workers as Ray actors shared by several gateway front-ends (docs/architecture.md,
"Deployment on Ray").

- ``actor.StageActor``: the actor; hosts the ordinary ``StageWorker`` for one role.
- ``client.RemoteStage``: the front-end's proxy, with ``StageWorker``'s ``submit(request) -> Stream``
  (and ``open_stream``, answered once a replica holds the stream: duplex conversations); ``replica``: its
  view of each replica; ``metrics``: what it exports of them.
- ``wire``: the two messages per front-end and step; ``routing``: actor names, placement, replica choice;
  ``settings``: the config an actor gets (no secrets) and the stage settings front-ends must share.

Ray is imported only when a remote stage is built: the single-process gateway never needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from realtime_gw.config import GatewayConfig
from realtime_gw.models.remote.client import RemoteStage
from realtime_gw.models.remote.routing import connect, remote_roles, stage_actors
from realtime_gw.models.remote.settings import stage_settings

__all__ = ["RemoteStage", "remote_roles", "remote_stage"]


def remote_stage(role: str, config: GatewayConfig, build: Callable[[str, GatewayConfig], Any]) -> RemoteStage:
    """The front-end's handle on ``role``'s actors, created in the cluster if this is the first
    front-end to ask (they warm up while the front-end starts; ``RemoteStage.start`` waits for them,
    and refuses actors built from other stage settings). ``build`` (``registry.build_stage``) is what
    each actor calls to build its worker."""
    try:
        import ray  # noqa: F401
    except ImportError:
        from realtime_gw.config import ConfigError

        raise ConfigError("remote_stages needs Ray: pip install 'realtime-gw[ray]'") from None
    connect(config)
    settings = stage_settings(role, config)
    return RemoteStage(role, stage_actors(role, config, build), settings, config.ray_namespace)
