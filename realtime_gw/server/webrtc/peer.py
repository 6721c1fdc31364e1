"""One call's media side: the aiortc peer connection (ICE, DTLS, SRTP, SCTP, Opus/G.711), its
``oai-events`` data channel, the paced reply track and the caller's decoded audio.

It runs where the call's media runs: in the gateway's process, or in a media worker process
(``media_worker.py``), which drives the same ``Peer`` from messages. Either way its owner learns of
the track's playback through ``PlaybackListener`` and takes the caller's audio from ``caller_audio()``,
resampled here to the rate it asks for (``want_input_rate``); it pushes reply audio in the session's
format into ``reply``, converted here for the track: the soxr work stays off the sessions' loop when the
media runs in a worker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamError

from realtime_gw.server.webrtc.channel import LABEL, EventChannel
from realtime_gw.server.webrtc.ice import HostCandidates
from realtime_gw.server.webrtc.inline_codecs import decode_on_loop, encode_on_loop
from realtime_gw.server.webrtc.media import CallerAudio, InputConverter, ReplyFeed, ReplyTrack
from realtime_gw.server.webrtc.metrics import MediaLedger, RtpFigures, rtp_figures


class PlaybackListener(Protocol):
    """Who hears what the reply track put on the wire (each call is a put, never a wait)."""

    def playback_started(self, response_id: str) -> None: ...

    def playback_sent(self, response_id: str, sent_ms: float) -> None: ...

    def playback_stopped(self, response_id: str) -> None: ...


class Peer:
    def __init__(self, expect_channel: bool, ledger: MediaLedger) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.channel = EventChannel(expect_channel)
        self.ledger = ledger
        self.listener: PlaybackListener | None = None
        self.on_connection_state: Callable[[str], None] | None = None
        """Told every change of the peer connection's state (a media worker reports them)."""
        self.track = ReplyTrack(self._started, self._sent, self._stopped, ledger)
        self.reply = ReplyFeed(self.track)
        self.caller = CallerAudio(ledger)
        self.input_rate: int | None = None
        """The rate the caller's audio is resampled to (the session's); None: as decoded."""
        self._to_session = InputConverter()
        self._caller_track: asyncio.Future[MediaStreamTrack] = asyncio.get_running_loop().create_future()
        self._closing: asyncio.Future[RtpFigures | None] | None = None

    async def answer(self, sdp: str, hosts: HostCandidates, input_prefetch_frames: int = 4) -> str:
        """The SDP answer to ``sdp``, every local candidate gathered (closes the connection on failure).
        ``input_prefetch_frames``: the caller's audio's receive jitter buffer (``webrtc_input_prefetch_frames``)."""
        pc = self.pc
        try:

            @pc.on("datachannel")
            def on_datachannel(dc: Any) -> None:
                if dc.label == LABEL and self.channel.channel is None:
                    sctp = pc.sctp
                    self.channel.attach(dc, getattr(sctp, "_remote_max_message_size", None) if sctp else None)

            @pc.on("track")
            def on_track(track: MediaStreamTrack) -> None:
                if track.kind == "audio" and not self._caller_track.done():
                    self._caller_track.set_result(track)

            @pc.on("connectionstatechange")
            def on_state() -> None:
                if self.on_connection_state is not None:
                    self.on_connection_state(pc.connectionState)
                if pc.connectionState in ("failed", "closed"):
                    self.channel.disconnected()
                    if not self._caller_track.done():
                        self._caller_track.cancel()

            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            for transceiver in pc.getTransceivers():
                if transceiver.kind == "audio":
                    set_prefetch(transceiver.receiver, input_prefetch_frames)
                    decode_on_loop(transceiver.receiver)
            encode_on_loop(pc.addTrack(self.track), self.track)
            hosts.apply(pc)
            await pc.setLocalDescription(await pc.createAnswer())
            return str(pc.localDescription.sdp)
        except BaseException:
            await pc.close()
            raise

    @property
    def connected(self) -> bool:
        return self.pc.connectionState == "connected"

    def want_input_rate(self, rate: int) -> None:
        self.input_rate = rate

    async def caller_audio(self) -> AsyncIterator[tuple[bytes, int]]:
        """The caller's audio as (mono PCM16, its rate: ``input_rate`` once set), gaps filled; ends with
        the call."""
        try:
            track = await self._caller_track
        except asyncio.CancelledError:
            if not self._caller_track.cancelled():
                raise
            return
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            mono, rate = self.caller.mono(frame), frame.sample_rate
            if (target := self.input_rate) is not None:  # at an equal rate: passed through, nothing held
                mono, rate = self._to_session.convert(mono, rate, "audio/pcm", target), target
            yield mono, rate

    async def close(self) -> RtpFigures | None:
        """Stops the track and the connection; the call's RTP statistics (None if unavailable). Every
        call after the first waits for the first and answers the same."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        return await asyncio.shield(self._closing)

    async def _close(self) -> RtpFigures | None:
        self.track.stop()
        figures = None
        with contextlib.suppress(Exception):
            figures = rtp_figures(await self.pc.getStats(), self.caller.clock_rate)
        with contextlib.suppress(Exception):
            await self.pc.close()
        return figures

    def _started(self, response_id: str) -> None:
        if self.listener is not None:
            self.listener.playback_started(response_id)

    def _sent(self, response_id: str, sent_ms: float) -> None:
        if self.listener is not None:
            self.listener.playback_sent(response_id, sent_ms)

    def _stopped(self, response_id: str) -> None:
        if self.listener is not None:
            self.listener.playback_stopped(response_id)


_JITTER_BUFFER = "_RTCRtpReceiver__jitter_buffer"
"""aiortc (1.14-1.16) keeps the receiver's jitter buffer private and fixes its prefetch at 4 for audio."""


def set_prefetch(receiver: Any, frames: int) -> None:
    """Replaces the (still empty) audio jitter buffer of ``receiver`` with one that holds ``frames``."""
    if frames == 4 or not hasattr(receiver, _JITTER_BUFFER):
        return
    current: JitterBuffer = getattr(receiver, _JITTER_BUFFER)
    setattr(receiver, _JITTER_BUFFER, JitterBuffer(capacity=current.capacity, prefetch=max(1, frames)))
