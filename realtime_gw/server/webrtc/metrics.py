"""Prometheus metrics of WebRTC calls (with the transport's in ``server/metrics.py``).

Counters move while calls run; each call's own figures (``MediaLedger``, and aiortc's RTP statistics)
are observed into histograms when it ends, so a dashboard sees the spread over calls without a label
per call.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
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


class MediaFigures(msgspec.Struct, array_like=True):
    """What a call's media path counted (all of it, or what is new since the last report)."""

    frames: int = 0
    late_frames: int = 0
    reply_frames: int = 0
    reply_underruns: int = 0
    input_s: float = 0.0
    input_concealed_s: float = 0.0
    lateness: list[float] = msgspec.field(default_factory=list)
    """Each frame's lateness, while it waits to be reported (a media worker's ledger)."""


class MediaLedger:
    """What one call's media path sent, received and had to make up. ``publish``: into this process's
    counters as it goes (the gateway's process); else kept for ``report`` (a media worker, whose
    reports the gateway's ledger of the call ``absorb``s). ``close`` observes the per-call histograms."""

    def __init__(self, publish: bool = True) -> None:
        self.publish = publish
        self.total = MediaFigures()
        self._reported = MediaFigures()

    def frame_late(self, lateness_s: float) -> None:
        self.total.frames += 1
        self.total.late_frames += lateness_s > LATE_FRAME_S
        if self.publish:
            CALL_FRAME_LATENESS.observe(lateness_s)
        else:
            self.total.lateness.append(lateness_s)

    def reply_frame(self, underrun: bool) -> None:
        self.total.reply_frames += 1
        self.total.reply_underruns += underrun
        if self.publish:
            CALL_REPLY_FRAMES.inc()
            if underrun:
                CALL_REPLY_UNDERRUNS.inc()

    def input_received(self, seconds: float) -> None:
        self.total.input_s += seconds

    def input_concealed(self, seconds: float) -> None:
        self.total.input_s += seconds
        self.total.input_concealed_s += seconds
        if self.publish:
            CALL_INPUT_CONCEALED.inc(seconds)

    def report(self) -> MediaFigures:
        """What is new since the last report (a worker sends it to the gateway)."""
        t, r = self.total, self._reported
        delta = MediaFigures(
            t.frames - r.frames, t.late_frames - r.late_frames, t.reply_frames - r.reply_frames,
            t.reply_underruns - r.reply_underruns, t.input_s - r.input_s,
            t.input_concealed_s - r.input_concealed_s, t.lateness,
        )  # fmt: skip
        t.lateness = []
        self._reported = msgspec.structs.replace(t, lateness=[])
        return delta

    def absorb(self, d: MediaFigures) -> None:
        """A worker's report of this call, as if it had been counted here."""
        t = self.total
        t.frames += d.frames
        t.late_frames += d.late_frames
        t.reply_frames += d.reply_frames
        t.reply_underruns += d.reply_underruns
        t.input_s += d.input_s
        t.input_concealed_s += d.input_concealed_s
        for lateness in d.lateness:
            CALL_FRAME_LATENESS.observe(lateness)
        CALL_REPLY_FRAMES.inc(d.reply_frames)
        CALL_REPLY_UNDERRUNS.inc(d.reply_underruns)
        CALL_INPUT_CONCEALED.inc(d.input_concealed_s)

    def close(self) -> None:
        t = self.total
        if t.input_s:
            CALL_CONCEALED_RATIO.labels("input").observe(t.input_concealed_s / t.input_s)
        if t.reply_frames:
            CALL_CONCEALED_RATIO.labels("output").observe(t.reply_underruns / t.reply_frames)
        if t.frames:
            CALL_LATE_FRAMES_RATIO.observe(t.late_frames / t.frames)


class RtpFigures(msgspec.Struct, array_like=True):
    """A call's RTP statistics at its end (from aiortc's ``getStats()``), in seconds."""

    input_packets: int = 0
    input_lost: int = 0
    input_jitter_s: float | None = None
    output_lost: int = 0
    output_jitter_s: float | None = None
    round_trip_s: float | None = None


def rtp_figures(stats: dict[str, Any], clock_rate: int) -> RtpFigures:
    """``RTCPeerConnection.getStats()`` of a call; jitter comes in RTP clock units (one codec is
    negotiated for both directions)."""
    f = RtpFigures()
    for s in stats.values():
        if s.type == "inbound-rtp" and s.kind == "audio":
            f.input_packets, f.input_lost = s.packetsReceived, max(0, s.packetsLost)
            f.input_jitter_s = s.jitter / clock_rate
        elif s.type == "remote-inbound-rtp" and s.kind == "audio":
            f.output_lost, f.output_jitter_s = max(0, s.packetsLost), s.jitter / clock_rate
            f.round_trip_s = s.roundTripTime
    return f


def record_rtp(f: RtpFigures) -> None:
    CALL_INPUT_PACKETS.inc(f.input_packets)
    CALL_INPUT_PACKETS_LOST.inc(f.input_lost)
    CALL_OUTPUT_PACKETS_LOST.inc(f.output_lost)
    if f.input_jitter_s is not None:
        CALL_INPUT_JITTER.observe(f.input_jitter_s)
    if f.output_jitter_s is not None:
        CALL_OUTPUT_JITTER.observe(f.output_jitter_s)
    if f.round_trip_s is not None:
        CALL_ROUND_TRIP.observe(f.round_trip_s)
