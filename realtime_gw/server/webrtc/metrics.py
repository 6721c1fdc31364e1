"""Prometheus metrics of WebRTC calls (with the transport's in ``server/metrics.py``)."""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

log = logging.getLogger(__name__)

CALLS = Gauge("realtime_gw_calls", "Live WebRTC calls (each also counts as a realtime session)")
CALL_FRAME_LATENESS = Histogram(
    "realtime_gw_call_frame_lateness_seconds",
    "How late a call track's 20 ms frame left relative to its slot (the event loop was busy)",
    buckets=(0.0, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32),
)
CALL_INPUT_PACKETS = Counter("realtime_gw_call_input_packets", "RTP audio packets received from callers")
CALL_INPUT_PACKETS_LOST = Counter(
    "realtime_gw_call_input_packets_lost", "RTP audio packets of callers lost on the way"
)
CALL_INPUT_JITTER = Histogram(
    "realtime_gw_call_input_jitter_seconds",
    "Interarrival jitter of a caller's audio (RFC 3550), at the end of its call",
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16),
)
CALL_OUTPUT_PACKETS_LOST = Counter(
    "realtime_gw_call_output_packets_lost",
    "Reply audio packets the callers reported lost (RTCP receiver reports)",
)


def record_call_stats(stats: dict[str, Any], clock_rate: int) -> None:
    """A finished call's RTP statistics (``RTCPeerConnection.getStats()``) into the counters."""
    for s in stats.values():
        if s.type == "inbound-rtp" and s.kind == "audio":
            CALL_INPUT_PACKETS.inc(s.packetsReceived)
            CALL_INPUT_PACKETS_LOST.inc(max(0, s.packetsLost))
            CALL_INPUT_JITTER.observe(s.jitter / clock_rate)
        elif s.type == "remote-inbound-rtp" and s.kind == "audio":
            CALL_OUTPUT_PACKETS_LOST.inc(max(0, s.packetsLost))
