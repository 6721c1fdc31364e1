"""Prometheus metrics of the transport (worker metrics live in models/runtime.py)."""

from __future__ import annotations

import asyncio

from prometheus_client import Gauge, Histogram

SESSIONS = Gauge("realtime_gw_sessions", "Open WebSocket sessions", ["kind"])
TTFA = Histogram(
    "realtime_gw_time_to_first_audio_seconds",
    "response.created to the first audio delta written to the socket",
    buckets=(0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0),
)
FRAME_LATENESS = Histogram(
    "realtime_gw_frame_lateness_seconds",
    "How late an audio frame left the server relative to its real-time playback slot",
    buckets=(0.0, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28),
)
EVENT_LOOP_LAG = Histogram(
    "realtime_gw_event_loop_lag_seconds",
    "How late the event loop woke a timer (its sleep's overshoot, every 50 ms): the gateway process's own "
    "load (sessions' JSON and audio, the GIL shared with the stage threads), apart from the device",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)


async def watch_event_loop(interval_s: float = 0.05) -> None:
    """Measure the event loop's lag until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(interval_s)
        EVENT_LOOP_LAG.observe(max(0.0, loop.time() - t - interval_s))
