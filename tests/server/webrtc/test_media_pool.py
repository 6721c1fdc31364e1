"""Media worker processes as the gateway's pool sees them."""

from __future__ import annotations

import asyncio
import logging

import pytest

from realtime_gw.server.webrtc import media_wire as wire
from realtime_gw.server.webrtc.ice import HostCandidates
from realtime_gw.server.webrtc.media import FRAME_BYTES, ReplyTrack
from realtime_gw.server.webrtc.media_pool import (
    MAX_INPUT_FRAMES,
    PURGED_REMEMBERED,
    MediaPool,
    MediaWorker,
    RemotePeer,
)
from realtime_gw.server.webrtc.metrics import MediaLedger


async def test_an_offer_a_media_worker_refuses_leaves_nothing_behind() -> None:
    """The worker answers an offer it cannot take with an error and drops the call: the gateway's side
    ends it too (no wait for a close that never comes, no entry left to count as load)."""
    pool = MediaPool(1)
    try:
        for i in range(2):
            with pytest.raises(RuntimeError):
                offer = pool.open(f"rtc_bad{i}", "v=0\r\nnot an offer\r\n", True, HostCandidates("127.0.0.1", None), 1)
                await asyncio.wait_for(offer, 4.0)
        assert pool.workers[0].alive and pool.workers[0].calls == {}
    finally:
        await pool.stop()


class _Heard:
    """The gateway's side of the track's reports (``PlaybackListener``)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.stopped: list[str] = []

    def playback_started(self, response_id: str) -> None:
        self.started.append(response_id)

    def playback_sent(self, response_id: str, sent_ms: float) -> None:
        pass

    def playback_stopped(self, response_id: str) -> None:
        self.stopped.append(response_id)


async def test_a_long_call_with_many_barge_ins_keeps_constant_state() -> None:
    """Hours of replies, every other one cut by a barge-in, through a worker's ``ReplyTrack`` and the
    gateway's ``RemoteTrack``: what either keeps stays bounded; late reports of a purge are dropped."""
    heard = _Heard()
    remote = RemotePeer(MediaWorker(0), "rtc_long", True)  # an unstarted worker: sends go nowhere
    reports: list[wire.Playback] = []
    track = ReplyTrack(
        lambda rid: reports.append(wire.Playback("rtc_long", "started", rid)),
        lambda rid, ms: reports.append(wire.Playback("rtc_long", "sent", rid, ms)),
        lambda rid: reports.append(wire.Playback("rtc_long", "stopped", rid)),
        MediaLedger(publish=False),
    )
    replies = 20000  # 3 frames each: 20 minutes of reply audio, and as many purges as hours of talk
    for i in range(replies):
        rid = f"resp_{i}"
        for side in (track, remote.track):
            side.push(rid, bytes(FRAME_BYTES * 3))
        for frame in range(3):
            track._next_frame_bytes()
            if frame == 1 and i % 2:  # barge-in mid-reply: both sides purge; reports already sent trail
                track.purge(rid)
                assert remote.track.purge(rid)  # it was playing: its start was reported
                break
            for report in reports:
                remote.track.report(report, heard)
            reports.clear()
        else:
            for side in (track, remote.track):
                side.complete(rid)
            track._next_frame_bytes()
        for late in reports:  # a purged reply's reports, arriving after the purge: dropped
            remote.track.report(late, heard)
        reports.clear()
        assert len(remote.track.purged) <= PURGED_REMEMBERED and len(remote.track.playing) <= 1
        assert len(track._replies) <= 1 and len(track._queue) <= 1
    assert len(heard.started) == replies
    assert len(heard.stopped) == replies // 2  # the purged ones never stop
    assert f"resp_{replies - 1}" in remote.track.purged and "resp_1" not in remote.track.purged


async def test_a_session_that_takes_no_audio_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    """Its call ends; the frames the worker sent meanwhile are dropped without a warning each."""
    peer = RemotePeer(MediaWorker(0), "rtc_stuck", True)
    with caplog.at_level(logging.WARNING, logger="realtime_gw.server.webrtc.media_pool"):
        for _ in range(MAX_INPUT_FRAMES * 3):
            peer.handle(wire.Input("rtc_stuck", bytes(960), 48000))
    warnings = [r for r in caplog.records if "took no audio" in r.getMessage()]
    assert len(warnings) == 1 and peer.channel.gone and peer.input.qsize() == MAX_INPUT_FRAMES
