"""Prometheus metrics of the transport (worker metrics live in models/runtime.py)."""

from __future__ import annotations

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
