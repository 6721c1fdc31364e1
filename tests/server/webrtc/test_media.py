"""The call media path's own accounting: gaps in the caller's audio filled (and counted), reply frames
that ran dry mid-reply counted, and each call's figures on /metrics when it ends."""

from __future__ import annotations

import asyncio
import fractions

import numpy as np
from av import AudioFrame
from prometheus_client import REGISTRY

from realtime_gw.server.webrtc.media import FRAME_SAMPLES, CallerAudio, InputConverter, ReplyFeed, ReplyTrack
from realtime_gw.server.webrtc.metrics import MediaLedger


def opus_frame(pts: int, samples: int = 960, value: int = 1000) -> AudioFrame:
    """A decoded Opus frame as aiortc hands it over: 48 kHz stereo, pts in RTP clock units."""
    frame = AudioFrame.from_ndarray(np.full((1, samples * 2), value, dtype=np.int16), format="s16", layout="stereo")
    frame.sample_rate = 48000
    frame.pts = pts
    frame.time_base = fractions.Fraction(1, 48000)
    return frame


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_a_gap_in_the_callers_audio_is_filled_with_silence_and_counted() -> None:
    ledger = MediaLedger()
    caller, converter = CallerAudio(ledger), InputConverter()

    def session_input(pts: int) -> bytes:
        mono = caller.mono(opus_frame(pts))
        converted.append(converter.convert(mono, 48000, "audio/pcm", 24000))
        return mono

    converted: list[bytes] = []
    concealed_before = sample("realtime_gw_call_input_concealed_seconds_total")
    out = b"".join(session_input(pts) for pts in (0, 960, 1920))
    assert ledger.total.input_concealed_s == 0.0
    # Two packets (40 ms) lost: the next frame starts 40 ms late; the session still gets every sample.
    out += session_input(2880 + 1920) + session_input(2880 + 2880)
    assert abs(ledger.total.input_concealed_s - 0.04) < 1e-9
    assert abs(ledger.total.input_s - 0.14) < 1e-9
    pcm = np.frombuffer(out, dtype="<i2")
    assert len(pcm) == 14 * 480
    assert not pcm[3 * 960 : 5 * 960].any() and (pcm[5 * 960 :] == 1000).all(), "the gap is silence"
    assert 0 < len(b"".join(converted)) <= 0.14 * 24000 * 2  # at the session's rate (less the filter's delay)
    assert sample("realtime_gw_call_input_concealed_seconds_total") - concealed_before > 0.039

    # A stream restarted far ahead (over a second) is passed over, not made up.
    session_input(10 * 48000)
    assert abs(ledger.total.input_concealed_s - 0.04) < 1e-9


def test_reply_frames_that_run_dry_mid_reply_are_underruns() -> None:
    async def run() -> MediaLedger:
        ledger = MediaLedger()
        track = ReplyTrack(lambda rid: None, lambda rid, ms: None, lambda rid: None, ledger)
        two_frames = b"\x01\x00" * (2 * FRAME_SAMPLES)
        track.push("resp_1", two_frames)
        for _ in range(4):  # two frames of reply, then two with nothing (the reply is not complete)
            await track.recv()
        track.push("resp_1", two_frames[: FRAME_SAMPLES])  # a half frame, the rest never came in time
        await track.recv()
        track.complete("resp_1")
        track.push("resp_2", two_frames[: FRAME_SAMPLES])  # a last half frame ends a reply: no underrun
        track.complete("resp_2")
        await track.recv()
        await track.recv()  # idle silence: no reply frame at all
        track.stop()
        return ledger

    ledger = asyncio.run(run())
    assert ledger.total.reply_frames == 6
    assert ledger.total.reply_underruns == 3
    assert ledger.total.frames == 6  # the first frame has no slot before it

    before = sample("realtime_gw_call_concealed_ratio_count", {"direction": "output"})
    ledger.close()
    assert sample("realtime_gw_call_concealed_ratio_count", {"direction": "output"}) == before + 1


def test_a_media_workers_report_counts_here_as_if_counted_here() -> None:
    """A worker's ledger keeps what it counts and reports what is new; the gateway's absorbs it."""
    worker, gateway = MediaLedger(publish=False), MediaLedger()
    lateness_before = sample("realtime_gw_call_frame_lateness_seconds_count")
    underruns_before = sample("realtime_gw_call_reply_underrun_frames_total")
    for lateness in (0.001, 0.03):
        worker.frame_late(lateness)
    worker.reply_frame(underrun=True)
    gateway.absorb(worker.report())
    worker.reply_frame(underrun=False)
    gateway.absorb(worker.report())
    gateway.absorb(worker.report())  # nothing new
    assert gateway.total.frames == 2 and gateway.total.late_frames == 1
    assert gateway.total.reply_frames == 2 and gateway.total.reply_underruns == 1
    assert sample("realtime_gw_call_frame_lateness_seconds_count") == lateness_before + 2
    assert sample("realtime_gw_call_reply_underrun_frames_total") == underruns_before + 1


def test_the_media_side_resamples_both_ways_and_the_session_takes_its_rate_unchanged() -> None:
    """Where the call's media runs (a media worker), the caller's 48 kHz audio becomes the session's rate
    and reply audio in the session's format becomes the track's 48 kHz: the sessions' loop does no soxr
    work for a call."""
    from aiortc.mediastreams import MediaStreamError

    from realtime_gw.server.webrtc.peer import Peer

    class CallerTrack:
        frames = [opus_frame(960 * i) for i in range(10)]  # 200 ms

        async def recv(self) -> AudioFrame:
            if not self.frames:
                raise MediaStreamError
            return self.frames.pop(0)

    async def run() -> tuple[list[tuple[bytes, int]], int]:
        peer = Peer(True, MediaLedger(publish=False))
        peer.want_input_rate(24000)
        peer._caller_track.set_result(CallerTrack())  # type: ignore[arg-type]
        heard = [chunk async for chunk in peer.caller_audio()]
        assert isinstance(peer.reply, ReplyFeed)
        peer.reply.push("resp_1", b"\x01\x00" * 2400, "audio/pcm")  # 100 ms at 24 kHz
        queued = peer.track._replies["resp_1"].queued
        await peer.close()
        return heard, queued

    heard, queued = asyncio.run(run())
    assert {rate for _, rate in heard} == {24000}
    pcm = b"".join(mono for mono, _ in heard)
    assert 0.17 * 24000 * 2 <= len(pcm) <= 0.2 * 24000 * 2  # 200 ms at 24 kHz, less the filter's delay
    assert InputConverter().convert(pcm, 24000, "audio/pcm", 24000) == pcm  # the session's side: as is
    assert 0.05 * 48000 * 2 <= queued <= 0.1 * 48000 * 2  # 100 ms at 48 kHz, less the filter's delay (~30 ms)


def test_the_session_rate_switched_away_and_back_brings_back_no_audio_from_before() -> None:
    """A PCMU caller (8 kHz) whose session goes from 24 kHz PCM to G.711 (8 kHz: passed through) and back:
    what the first resampler held is dropped at the switch, not heard after the return."""
    from aiortc.mediastreams import MediaStreamError

    from realtime_gw.server.webrtc.peer import Peer

    def g711_frame(index: int, value: int) -> AudioFrame:
        frame = AudioFrame.from_ndarray(np.full((1, 160), value, dtype=np.int16), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = 8000, 160 * index, fractions.Fraction(1, 8000)
        return frame

    plan = [(24000, 1000)] * 5 + [(8000, 0)] * 5 + [(24000, 0)] * 10  # (the session's rate, the caller's level)

    async def run() -> list[tuple[bytes, int]]:
        peer = Peer(True, MediaLedger(publish=False))

        class CallerTrack:
            index = 0

            async def recv(self) -> AudioFrame:
                if self.index == len(plan):
                    raise MediaStreamError
                rate, value = plan[self.index]
                peer.want_input_rate(rate)
                self.index += 1
                return g711_frame(self.index - 1, value)

        peer._caller_track.set_result(CallerTrack())  # type: ignore[arg-type]
        heard = [chunk async for chunk in peer.caller_audio()]
        await peer.close()
        return heard

    heard = asyncio.run(run())
    assert [rate for _, rate in heard] == [rate for rate, _ in plan]
    after_return = np.frombuffer(b"".join(mono for mono, _ in heard[10:]), dtype="<i2")
    assert len(after_return) > 0 and np.abs(after_return).max() < 50  # silence: nothing of the 1000s


def test_a_replys_end_leaves_with_it_none_held_back_for_the_next() -> None:
    async def run() -> tuple[int, int]:
        track = ReplyTrack(lambda rid: None, lambda rid, ms: None, lambda rid: None, MediaLedger(publish=False))
        feed = ReplyFeed(track)
        feed.push("resp_1", b"\x01\x00" * 2400, "audio/pcm")  # 100 ms at 24 kHz
        feed.complete("resp_1")
        feed.push("resp_2", b"\x01\x00" * 2400, "audio/pcm")
        first, second = track._replies["resp_1"].queued, track._replies["resp_2"].queued
        track.stop()
        return first, second

    first, second = asyncio.run(run())
    assert abs(first - 9600) <= 8  # all 100 ms at 48 kHz, the filter's tail included
    assert second < first  # the next reply starts afresh: its own tail is still held


def test_another_responses_end_or_purge_leaves_a_playing_replys_audio_alone() -> None:
    """An out-of-band response (text only) ends, or another is purged, while a reply plays: the reply's
    held audio stays its own (no ``started``/``stopped`` for the other, no lost samples)."""

    async def run() -> tuple[list[str], int]:
        events: list[str] = []
        track = ReplyTrack(
            lambda rid: events.append(f"started {rid}"), lambda rid, ms: None,
            lambda rid: events.append(f"stopped {rid}"), MediaLedger(publish=False),
        )  # fmt: skip
        feed = ReplyFeed(track)
        feed.push("resp_main", b"\x01\x00" * 2400, "audio/pcm")
        feed.complete("resp_side")  # text only: no audio of its own
        feed.purge("resp_other")
        feed.push("resp_main", b"\x01\x00" * 2400, "audio/pcm")
        feed.complete("resp_main")
        queued = track._replies["resp_main"].queued
        for _ in range(12):  # 240 ms: all of it sent
            await track.recv()
        track.stop()
        return events, queued

    events, queued = asyncio.run(run())
    assert abs(queued - 2 * 9600) <= 8  # 200 ms at 48 kHz, none of it given to another response
    assert events == ["started resp_main", "stopped resp_main"]


def test_caller_frames_that_queued_up_go_to_the_session_as_one_append() -> None:
    from realtime_gw.server.webrtc.media_pool import RemotePeer

    async def run() -> list[tuple[bytes, int]]:
        peer = RemotePeer(None, "rtc_x", True)  # type: ignore[arg-type]  # no worker: nothing is sent
        for item in [(b"a", 48000), (b"b", 48000), (b"c", 8000), (b"d", 8000), None]:
            peer.input.put_nowait(item)
        return [chunk async for chunk in peer.caller_audio()]

    assert asyncio.run(run()) == [(b"ab", 48000), (b"cd", 8000)]


def test_the_callers_jitter_buffer_holds_what_the_setting_says() -> None:
    from aiortc import RTCPeerConnection

    from realtime_gw.server.webrtc.peer import _JITTER_BUFFER, set_prefetch

    async def run() -> tuple[int, int]:
        pc = RTCPeerConnection()
        receiver = pc.addTransceiver("audio").receiver
        before = getattr(receiver, _JITTER_BUFFER)._prefetch  # aiortc's own
        set_prefetch(receiver, 1)
        after = getattr(receiver, _JITTER_BUFFER)._prefetch
        await pc.close()
        return before, after

    assert asyncio.run(run()) == (4, 1)

