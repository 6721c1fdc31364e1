"""Python clients for the gateway: ``RealtimeClient`` (asyncio), ``SyncRealtimeClient`` and ``OpenPIClient``
(blocking, for locust and threads); the pure pieces (``ClientState``, ``JitterBuffer``) they share."""

from realtime_gw.client.jitter import JitterBuffer
from realtime_gw.client.protocol import ClientState, PlaybackAckEvent, Reply, input_session
from realtime_gw.client.realtime import RealtimeClient, ServerError, ws_url
from realtime_gw.client.sync import OpenPIClient, PolicyServerError, SyncRealtimeClient, sample_observation

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
