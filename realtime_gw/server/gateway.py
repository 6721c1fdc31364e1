"""The ``Gateway``: what every handler shares: the config, the workers, the responder, access control
and live session counts. Built once by ``app.create_app``; handlers reach it as
``ws.app.state.gateway``."""

from __future__ import annotations

from dataclasses import dataclass, field

from realtime_gw.config import GatewayConfig
from realtime_gw.models.registry import Workers
from realtime_gw.server.auth import Access
from realtime_gw.server.responder import Responder


@dataclass
class Gateway:
    """What every handler shares: the config, the workers, and live session bookkeeping."""

    config: GatewayConfig
    workers: Workers
    responder: Responder
    access: Access
    sessions: dict[str, int] = field(default_factory=lambda: {"realtime": 0, "live": 0, "openpi": 0, "speech": 0})
