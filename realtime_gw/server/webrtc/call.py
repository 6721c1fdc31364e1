"""One WebRTC call: an aiortc peer connection around the same session task as a WebSocket.

``CallConnection`` is ``RealtimeConnection`` with the data channel as its ``Channel`` and the call's
tracks as the audio path: the caller's decoded audio enters the session as ``input_audio_buffer.append``
events would (so VAD, ASR and barge-in are the WebSocket's), and reply audio leaves on ``ReplyTrack``
instead of as ``response.output_audio.delta`` events. The track, which knows exactly what it has sent,
tells the session when a reply's playback started and how far it got (the session's playback ledger,
as ``playback.ack``s would: barge-in and ``output_audio_buffer.clear`` truncate to it), and the client
``output_audio_buffer.started`` / ``.stopped``.

The call's media side (``CallMedia``) is a ``Peer`` on the gateway's event loop, or, with
``webrtc_media_workers``, a ``RemotePeer``: the same ``Peer`` in a media worker process, where
DTLS/SRTP, the codecs and the track's pacing cannot stall sessions (``media_pool.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from realtime_gw.protocols import realtime as rt
from realtime_gw.server.admission import Admission
from realtime_gw.server.gateway import Gateway
from realtime_gw.server.outbox import Notice, Outbox
from realtime_gw.server.realtime_ws import RealtimeConnection
from realtime_gw.server.webrtc.channel import EventChannel
from realtime_gw.server.webrtc.media import InputConverter
from realtime_gw.server.webrtc.metrics import CALLS, MediaLedger, RtpFigures, record_rtp
from realtime_gw.server.webrtc.peer import PlaybackListener
from realtime_gw.sessions.events import Close, Effect, PlaybackStarted, PurgeAudio, Send
from realtime_gw.sessions.realtime import RealtimeSession

log = logging.getLogger(__name__)

CALL_AUDIO_LEAD_MS = 200
"""Reply audio handed to the track ahead of its playback: enough to ride out a busy loop, little
enough that a purge (barge-in) drops it at once."""
CONNECT_TIMEOUT_S = 30.0
"""A call whose peer has not connected (ICE and DTLS) by then is ended, its session given back."""
SIDEBAND_SEND_TIMEOUT_S = 2.0
"""A sideband that does not take an event within this is dropped (the call's writer never waits long)."""
ACK_EVENT_PREFIX = "rtc_sent_"
"""Event ids of the playback reports the track makes; the session's answers to them stay internal."""


class ReplyOut(Protocol):
    """The reply track as its owner drives it, with audio in the session's output format
    (``media.ReplyFeed``, or a worker's through a pipe: ``media_pool.RemoteTrack``)."""

    def push(self, response_id: str, audio: bytes, output_format: str) -> None: ...

    def complete(self, response_id: str) -> None: ...

    def purge(self, response_id: str | None) -> bool: ...


class CallMedia(Protocol):
    """A call's media side: ``peer.Peer`` in this process, or ``media_pool.RemotePeer``."""

    channel: EventChannel
    reply: ReplyOut
    ledger: MediaLedger
    listener: PlaybackListener | None

    @property
    def connected(self) -> bool: ...

    def caller_audio(self) -> AsyncIterator[tuple[bytes, int]]: ...

    def want_input_rate(self, rate: int) -> None: ...

    async def close(self) -> RtpFigures | None: ...


class CallConnection(RealtimeConnection):
    def __init__(self, media: CallMedia, gateway: Gateway, session: RealtimeSession) -> None:
        super().__init__(media.channel, gateway, session)
        self.outbox = Outbox(self.config.outbound_queue_frames, CALL_AUDIO_LEAD_MS)
        self.media = media
        self.channel = media.channel
        self.reply = media.reply
        media.listener = self
        self.caller_audio = InputConverter()
        self.reply_formats: dict[str, str] = {}
        """Each live response's output format, as the session had it when it opened the response (its
        encoder's): a ``session.update`` mid-reply does not relabel audio already encoded."""
        self._reports = 0
        self.sidebands: set[Any] = set()
        """WebSockets watching the call (``sideband.py``): they get a copy of every event sent."""

    # -- the caller's audio in -------------------------------------------------------------------------
    async def pump_input(self) -> None:
        """The caller's decoded audio into the session, as appends (in its input format). The media side
        resamples it to the session's rate (in a media worker: off this loop); what arrives at another
        rate (frames on their way when the rate changed) is resampled here."""
        self.media.want_input_rate(self.session.settings.input_rate)
        async for mono, rate in self.media.caller_audio():
            settings = self.session.settings
            self.media.want_input_rate(settings.input_rate)
            pcm = self.caller_audio.convert(mono, rate, settings.input_format, settings.input_rate)
            self.input.lifetime.touch(time.monotonic())
            if pcm:
                await self.mailbox.put(rt.InputAudioBufferAppendEvent(audio=pcm))

    # -- reply audio out -----------------------------------------------------------------------------------
    def _post(self, notices: list[Notice]) -> None:
        # The track, not the outbox, knows when a reply's playback starts.
        super()._post([n for n in notices if not isinstance(n, PlaybackStarted)])

    def _run_effects(self, effects: list[Effect], closing: bool = False) -> None:
        super()._run_effects(effects, closing)
        for e in effects:
            if isinstance(e, Send) and isinstance(e.event, rt.ResponseCreatedEvent):
                self.reply_formats[e.event.response.id] = self.session.settings.output_format
            elif isinstance(e, PurgeAudio):
                if (
                    self.reply.purge(e.response_id)
                    and not closing
                    and not _says_cleared(effects, e.response_id)
                ):
                    # Cancelling a response (barge-in) purges without a word: a call says it.
                    self._to_client(rt.OutputAudioBufferClearedEvent(response_id=e.response_id))
            elif isinstance(e, Close):
                self.reply.purge(None)

    async def _write(self, event: rt.ServerEvent) -> None:
        match event:
            case rt.ResponseAudioDeltaEvent():
                fmt = self.reply_formats.get(event.response_id, self.session.settings.output_format)
                self.reply.push(event.response_id, event.delta, fmt)
                return
            case rt.PlaybackAcknowledgedEvent():
                return
            case rt.ErrorEvent() if (event.error.event_id or "").startswith(ACK_EVENT_PREFIX):
                return  # a report about a reply the session no longer tracks
            case rt.ResponseDoneEvent():
                self.reply_formats.pop(event.response.id, None)
                self.reply.complete(event.response.id)
        size = len(rt.encode_server_event(event))
        if size > self.channel.max_message_bytes:
            kind = type(event).__struct_config__.tag
            event = self.session.error(
                f"The {kind} event {event.event_id} ({size} bytes) exceeds the data channel's maximum "
                f"message size ({self.channel.max_message_bytes} bytes) and was not sent; use a WebSocket "
                "for events this large",
                "message_too_large",
            ).event
        await super()._write(event)
        if self.sidebands:
            await copy_to_sidebands(self.sidebands, rt.encode_server_event(event).decode())

    # The track's reports (from aiortc's sender task, or a worker's message; each is a put, never a wait).
    def playback_started(self, response_id: str) -> None:
        self._to_session(PlaybackStarted(response_id, time.monotonic()), must_arrive=True)
        self._to_client(rt.OutputAudioBufferStartedEvent(response_id=response_id))

    def playback_sent(self, response_id: str, sent_ms: float) -> None:
        self._reports += 1
        ack_id = f"{ACK_EVENT_PREFIX}{self._reports}"
        self._to_session(
            rt.PlaybackAckEvent(response_id=response_id, played_ms=int(sent_ms), event_id=ack_id)
        )

    def playback_stopped(self, response_id: str) -> None:
        self._to_client(rt.OutputAudioBufferStoppedEvent(response_id=response_id))

    def _to_session(self, item: Any, must_arrive: bool = False) -> None:
        """An ack may be dropped on a full mailbox (the next one supersedes it); a playback start may not:
        it then waits for room in a task, as the outbox's notices do."""
        try:
            self.mailbox.put_nowait(item)
        except asyncio.QueueFull:
            if must_arrive:
                self.spawn(self.mailbox.put(item), "playback-started")

    def _to_client(self, event: rt.ServerEvent) -> None:
        try:
            # ids only numbers events; no session state is touched outside the session task.
            self._enqueue(self.session.ids.send(event))
        except Exception:  # the outbox is full: the client is not reading; end the call
            self._signal_disconnect()


def _says_cleared(effects: list[Effect], response_id: str) -> bool:
    return any(
        isinstance(e, Send)
        and isinstance(e.event, rt.OutputAudioBufferClearedEvent)
        and e.event.response_id == response_id
        for e in effects
    )


async def copy_to_sidebands(sidebands: set[Any], data: str) -> None:
    for ws in list(sidebands):
        try:
            await asyncio.wait_for(ws.send_text(data), SIDEBAND_SEND_TIMEOUT_S)
        except Exception:
            sidebands.discard(ws)
            with contextlib.suppress(Exception):
                await ws.close(code=1008, reason="sideband is not reading")


async def close_sidebands(sidebands: set[Any]) -> None:
    for ws in list(sidebands):
        with contextlib.suppress(Exception):
            await ws.close(code=1000, reason="call ended")
    sidebands.clear()


class Call:
    """A live call: its id, peer connection and session task. ``hangup`` ends it (idempotent)."""

    def __init__(
        self,
        call_id: str,
        owner: str,
        connection: CallConnection,
    ) -> None:
        self.id = call_id
        self.owner = owner
        """The deployment key it was started with (or whose secret started it): only it may hang up or watch."""
        self.media = connection.media
        self.channel = connection.channel
        self.connection = connection
        self.answer = ""
        """The SDP answer sent to the caller."""
        self.task: asyncio.Task[None] | None = None

    def start(self, admission: Admission, calls: dict[str, Call]) -> None:
        calls[self.id] = self
        self.task = asyncio.create_task(self._run(admission, calls), name=f"call-{self.id}")

    async def _run(self, admission: Admission, calls: dict[str, Call]) -> None:
        deadline = asyncio.get_running_loop().call_later(CONNECT_TIMEOUT_S, self._unconnected)
        CALLS.inc()
        self.connection.spawn(self.connection.pump_input(), f"{self.id}-input")
        try:
            await self.connection.run()
        except Exception:
            log.exception("call %s failed", self.id)
        finally:
            deadline.cancel()
            CALLS.dec()
            admission.leave()
            calls.pop(self.id, None)
            await close_sidebands(self.connection.sidebands)
            with contextlib.suppress(Exception):
                rtp = await self.media.close()
                if rtp is not None:
                    record_rtp(rtp)
            self.media.ledger.close()

    def _unconnected(self) -> None:
        if not self.media.connected:
            log.info("call %s: no connection within %.0f s; ended", self.id, CONNECT_TIMEOUT_S)
            self.channel.disconnected()

    async def hangup(self) -> None:
        self.channel.disconnected()
        with contextlib.suppress(Exception):
            await self.media.close()
