"""Media worker processes as the gateway's pool sees them."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import pytest

from realtime_gw.server.webrtc import media_pool
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
from tests.server.webrtc.caller import Caller


async def test_an_offer_a_media_worker_refuses_leaves_nothing_behind() -> None:
    """The worker answers an offer it cannot take with an error and drops the call: the gateway's side
    ends it too (no wait for a close that never comes, no entry left to count as load)."""
    pool = MediaPool(1)
    try:
        for i in range(2):
            with pytest.raises(RuntimeError):
                offer = pool.open(
                    f"rtc_bad{i}", "v=0\r\nnot an offer\r\n", True, HostCandidates("127.0.0.1", None), 1
                )
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
        track.push(rid, bytes(FRAME_BYTES * 3))
        remote.reply.push(rid, bytes(FRAME_BYTES * 3 // 2), "audio/pcm")
        for frame in range(3):
            track._next_frame_bytes()
            if frame == 1 and i % 2:  # barge-in mid-reply: both sides purge; reports already sent trail
                track.purge(rid)
                assert remote.reply.purge(rid)  # it was playing: its start was reported
                break
            for report in reports:
                remote.reply.report(report, heard)
            reports.clear()
        else:
            for side in (track, remote.reply):
                side.complete(rid)
            track._next_frame_bytes()
        for late in reports:  # a purged reply's reports, arriving after the purge: dropped
            remote.reply.report(late, heard)
        reports.clear()
        assert len(remote.reply.purged) <= PURGED_REMEMBERED and len(remote.reply.playing) <= 1
        assert len(track._replies) <= 1 and len(track._queue) <= 1
    assert len(heard.started) == replies
    assert len(heard.stopped) == replies // 2  # the purged ones never stop
    assert f"resp_{replies - 1}" in remote.reply.purged and "resp_1" not in remote.reply.purged


async def test_a_session_that_takes_no_audio_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    """Its call ends; the frames the worker sent meanwhile are dropped without a warning each."""
    peer = RemotePeer(MediaWorker(0), "rtc_stuck", True)
    with caplog.at_level(logging.WARNING, logger="realtime_gw.server.webrtc.media_pool"):
        for _ in range(MAX_INPUT_FRAMES * 3):
            peer.handle(wire.Input("rtc_stuck", bytes(960), 48000))
    warnings = [r for r in caplog.records if "took no audio" in r.getMessage()]
    assert len(warnings) == 1 and peer.channel.gone and peer.input.qsize() == MAX_INPUT_FRAMES


async def _connected_call(pool: MediaPool, call_id: str) -> tuple[Caller, RemotePeer]:
    """A real aiortc caller whose call runs in the pool's worker, connected (data channel open)."""
    caller = Caller()
    peer = await pool.open(call_id, await caller.offer(), True, HostCandidates("127.0.0.1", None), 4)
    await caller.connect(peer.answer)
    return caller, peer


async def _caller_sees_the_end(caller: Caller, within_s: float) -> None:
    """The caller's peer connection learns of the close (DTLS close, SCTP abort): no ICE timeout wait."""
    for _ in range(int(within_s / 0.05)):
        if caller.pc.connectionState in ("closed", "failed") or caller.channel.readyState == "closed":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the caller still sees {caller.pc.connectionState} after {within_s} s")


async def test_a_stopping_worker_hangs_up_its_calls_before_it_exits() -> None:
    """Asked to end, the worker closes each call's peer connection (the caller sees it at once),
    reports the call closed with its statistics, and exits on its own (no signal)."""
    pool = MediaPool(1)
    caller, peer = await _connected_call(pool, "rtc_stop")
    try:
        await pool.stop()
        assert pool.workers[0].proc is not None and pool.workers[0].proc.returncode == 0
        assert peer.closed.done() and peer.closed.result() is not None  # its Closed came, with RTP figures
        await _caller_sees_the_end(caller, 2.0)
    finally:
        await caller.close()


async def test_a_terminated_worker_hangs_up_its_calls_too() -> None:
    """A SIGTERM sent to the worker itself (a service manager ending the whole group) hangs up as well."""
    pool = MediaPool(1)
    caller, peer = await _connected_call(pool, "rtc_term")
    try:
        proc = pool.workers[0].proc
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 5) == 0
        assert (await asyncio.wait_for(peer.closed, 5)) is not None
        await _caller_sees_the_end(caller, 2.0)
    finally:
        await pool.stop()
        await caller.close()


async def test_a_worker_that_does_not_end_is_terminated_then_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stuck worker (here: stopped, so it neither reads nor handles signals) costs the stop a bounded wait."""
    monkeypatch.setattr(media_pool, "STOP_TIMEOUT_S", 0.3)
    monkeypatch.setattr(media_pool, "TERMINATE_TIMEOUT_S", 0.3)
    pool = MediaPool(1)
    await pool.start()
    proc = pool.workers[0].proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGSTOP)
    started = time.monotonic()
    await pool.stop()
    assert proc.returncode == -signal.SIGKILL and time.monotonic() - started < 3
