"""Python clients for the gateway: ``RealtimeClient`` (asyncio), ``SyncRealtimeClient`` and ``OpenPIClient``
(blocking, for locust and threads); the pure pieces (``ClientState``, ``JitterBuffer``) they share."""

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
