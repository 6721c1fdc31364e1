"""Prometheus metrics of WebRTC calls (with the transport's in ``server/metrics.py``).

Counters move while calls run; each call's own figures (``MediaLedger``, and aiortc's RTP statistics)
are observed into histograms when it ends, so a dashboard sees the spread over calls without a label
per call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

log = logging.getLogger(__name__)

RATIO_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
SECONDS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)

CALLS = Gauge("realtime_gw_calls", "Live WebRTC calls (each also counts as a realtime session)")
CALL_FRAME_LATENESS = Histogram(
    "realtime_gw_call_frame_lateness_seconds",
    "How late a call track's 20 ms frame left relative to its slot (the event loop was busy)",
    buckets=(0.0, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32),
)
CALL_REPLY_FRAMES = Counter("realtime_gw_call_reply_frames", "20 ms frames of reply audio calls sent")
CALL_REPLY_UNDERRUNS = Counter(
    "realtime_gw_call_reply_underrun_frames",
    "Reply frames the gateway filled (partly) with silence mid-reply: the reply's audio was not there in time",
)
CALL_INPUT_CONCEALED = Counter(
    "realtime_gw_call_input_concealed_seconds",
    "Callers' audio that never arrived (gaps in the decoded stream), filled with silence for the session",
)
CALL_INPUT_PACKETS = Counter("realtime_gw_call_input_packets", "RTP audio packets received from callers")
CALL_INPUT_PACKETS_LOST = Counter(
    "realtime_gw_call_input_packets_lost", "RTP audio packets of callers lost on the way"
)
CALL_INPUT_JITTER = Histogram(
    "realtime_gw_call_input_jitter_seconds",
    "Interarrival jitter of a caller's audio (RFC 3550), at the end of its call",
    buckets=SECONDS_BUCKETS[:-1],
)
CALL_OUTPUT_PACKETS_LOST = Counter(
    "realtime_gw_call_output_packets_lost",
    "Reply audio packets the callers reported lost (RTCP receiver reports)",
)
CALL_OUTPUT_JITTER = Histogram(
    "realtime_gw_call_output_jitter_seconds",
    "Interarrival jitter of the reply audio as the caller reported it (RTCP), at the end of its call",
    buckets=SECONDS_BUCKETS[:-1],
)
CALL_ROUND_TRIP = Histogram(
    "realtime_gw_call_round_trip_seconds",
    "Network round trip to the caller (RTCP sender/receiver reports), at the end of its call",
    buckets=SECONDS_BUCKETS,
)
CALL_CONCEALED_RATIO = Histogram(
    "realtime_gw_call_concealed_ratio",
    "Per call: share of its audio made up by the gateway (input: gaps filled; output: reply frames "
    "underrun)",
    ["direction"],
    buckets=RATIO_BUCKETS,
)
CALL_LATE_FRAMES_RATIO = Histogram(
    "realtime_gw_call_late_frames_ratio",
    "Per call: share of its track's frames that left over 20 ms (a frame) after their slot",
    buckets=RATIO_BUCKETS,
)
LATE_FRAME_S = 0.02


@dataclass(slots=True)
class MediaLedger:
    """What one call's media path sent, received and had to make up; feeds the counters as it goes
    and the per-call histograms at the end (``close``)."""

    frames: int = 0
    late_frames: int = 0
    reply_frames: int = 0
    reply_underruns: int = 0
    input_s: float = 0.0
    input_concealed_s: float = 0.0

    def frame_late(self, lateness_s: float) -> None:
        self.frames += 1
        self.late_frames += lateness_s > LATE_FRAME_S

    def reply_frame(self, underrun: bool) -> None:
        self.reply_frames += 1
        CALL_REPLY_FRAMES.inc()
        if underrun:
            self.reply_underruns += 1
            CALL_REPLY_UNDERRUNS.inc()

    def input_received(self, seconds: float) -> None:
        self.input_s += seconds

    def input_concealed(self, seconds: float) -> None:
        self.input_s += seconds
        self.input_concealed_s += seconds
        CALL_INPUT_CONCEALED.inc(seconds)

    def close(self) -> None:
        if self.input_s:
            CALL_CONCEALED_RATIO.labels("input").observe(self.input_concealed_s / self.input_s)
        if self.reply_frames:
            CALL_CONCEALED_RATIO.labels("output").observe(self.reply_underruns / self.reply_frames)
        if self.frames:
            CALL_LATE_FRAMES_RATIO.observe(self.late_frames / self.frames)


def record_call_stats(stats: dict[str, Any], clock_rate: int) -> None:
    """A finished call's RTP statistics (``RTCPeerConnection.getStats()``) into the counters."""
    for s in stats.values():
        if s.type == "inbound-rtp" and s.kind == "audio":
            CALL_INPUT_PACKETS.inc(s.packetsReceived)
            CALL_INPUT_PACKETS_LOST.inc(max(0, s.packetsLost))
            CALL_INPUT_JITTER.observe(s.jitter / clock_rate)
        elif s.type == "remote-inbound-rtp" and s.kind == "audio":
            CALL_OUTPUT_PACKETS_LOST.inc(max(0, s.packetsLost))
            # in RTP clock units as RTCP carries it; one codec is negotiated for both directions
            CALL_OUTPUT_JITTER.observe(s.jitter / clock_rate)
            if s.roundTripTime is not None:
                CALL_ROUND_TRIP.observe(s.roundTripTime)
