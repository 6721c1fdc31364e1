"""Python clients for the gateway: ``RealtimeClient`` (asyncio), ``SyncRealtimeClient`` and ``OpenPIClient``
(blocking, for locust and threads); the pure pieces (``ClientState``, ``JitterBuffer``) they share.

The names are imported on first use, so importing a submodule (``realtime_gw.client.commands``, which
the ``realtime-gw`` parser needs) does not pull in numpy, websockets and soxr.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from realtime_gw.client.jitter import JitterBuffer
    from realtime_gw.client.openpi import OpenPIClient, PolicyServerError, sample_observation
    from realtime_gw.client.protocol import (
        ClientState,
        PlaybackAckEvent,
        Reply,
        ServerError,
        input_session,
        ws_url,
    )
    from realtime_gw.client.realtime import RealtimeClient
    from realtime_gw.client.sync import SyncRealtimeClient

_HOMES = {
    "JitterBuffer": "jitter",
    "OpenPIClient": "openpi",
    "PolicyServerError": "openpi",
    "sample_observation": "openpi",
    "ClientState": "protocol",
    "PlaybackAckEvent": "protocol",
    "Reply": "protocol",
    "ServerError": "protocol",
    "input_session": "protocol",
    "ws_url": "protocol",
    "RealtimeClient": "realtime",
    "SyncRealtimeClient": "sync",
}
__all__ = [
    "ClientState",
    "JitterBuffer",
    "OpenPIClient",
    "PlaybackAckEvent",
    "PolicyServerError",
    "RealtimeClient",
    "Reply",
    "ServerError",
    "SyncRealtimeClient",
    "input_session",
    "sample_observation",
    "ws_url",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
