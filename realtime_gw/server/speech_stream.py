"""``WS /v1/audio/speech/stream``: incremental text in, 80 ms PCM16 frames out; a thin loop around
``SpeechSession`` (``sessions/speech.py``), which decides what is spoken when and what is answered.

Here: a reader (client frames, decoded, handed in), a speaker task per segment (the session's
``Speak``: a TTS stream whose audio and end are handed in), one writer, and the effects' runner. The
session is only ever called synchronously (``_handle``), so the tasks never interleave inside it.

Bounds: text waiting to be spoken (``speech_max_pending_chars``: the socket is not read while more
waits, see ``SpeechSession.takes_text``), text per utterance (``speech_max_utterance_chars``), the
outbox (a segment's audio waits for room; the reader stops while it is three-quarters full; a client
that stops reading is closed 1008 after ``send_timeout_s``), idle timeout and maximum duration
(``error`` ``session_expired``, close 1000).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect

from realtime_gw.models.runtime import NoFreeSlot, Stream, WorkerFault
from realtime_gw.protocols import speech as sp
from realtime_gw.records.voice import TtsFrame
from realtime_gw.server.admission import Admission, admit_socket
from realtime_gw.server.auth import Refusal
from realtime_gw.server.gateway import Gateway
from realtime_gw.server.limits import Lifetime
from realtime_gw.sessions.events import unhandled
from realtime_gw.sessions.speech import (
    Close,
    Expired,
    SegmentAudio,
    SegmentEnded,
    SegmentFailed,
    SegmentRefused,
    Send,
    Speak,
    SpeechEffect,
    SpeechEvent,
    SpeechLimits,
    SpeechSession,
)

log = logging.getLogger(__name__)

OFFLOAD_DECODE_BYTES = 256 * 1024
"""Client frames above this are decoded on a thread, off the event loop."""
WATCH_S = 0.5
"""How often the idle timeout and the maximum duration are checked."""


class _Closed(Exception):
    """The stream must end: the outbox is full (``close_reason`` says so)."""


async def speech_stream_endpoint(ws: WebSocket) -> None:
    gateway: Gateway = ws.app.state.gateway
    admission = Admission(gateway, "speech")

    def refused(r: Refusal) -> str:
        return msgspec.json.encode(sp.StreamError(message=r.message, code=r.code)).decode()

    if not await admit_socket(ws, admission, refused):
        return
    with admission:
        await SpeechStream(ws, gateway, admission.key).run()


class SpeechStream:
    """One WebSocket: moves bytes and runs the session's effects."""

    def __init__(self, ws: WebSocket, gateway: Gateway, key: str | None = None) -> None:
        config = gateway.config
        self.ws = ws
        self.gateway = gateway
        self.session = SpeechSession(
            SpeechLimits(
                voices=gateway.voices_for(key),
                max_pending_chars=config.speech_max_pending_chars,
                max_utterance_chars=config.speech_max_utterance_chars,
            )
        )
        self.send_timeout_s = config.send_timeout_s
        self.max_frame_bytes = config.max_frame_bytes
        # The outbox: replies never wait (a reader that stops at input_high leaves them room up to
        # `bound`); a segment's audio waits below audio_high.
        self.outbox: asyncio.Queue[str | bytes] = asyncio.Queue()
        self.bound = config.outbound_queue_frames
        self.audio_high = max(1, self.bound // 2)
        self.input_high = max(1, self.bound * 3 // 4)
        self.room = asyncio.Event()  # set as the writer takes an item, and after every session event
        self.ended = asyncio.Event()  # an effect or a full outbox ends the stream
        self.lifetime = Lifetime(config.speech_idle_timeout_s, config.speech_max_session_s, time.monotonic())
        self.close_reason: tuple[int, str] | None = None
        self.speaker: asyncio.Task[None] | None = None
        self.tts: Stream[Any] | None = None
        """The TTS stream of the segment being spoken (None between segments: no slot held)."""

    # -- the session and its effects ----------------------------------------------------------------------
    def _handle(self, event: SpeechEvent) -> None:
        try:
            self._run_effects(self.session.handle(event))
        except _Closed:
            self.ended.set()
        self.room.set()  # the session may take text again (its pending text was taken)

    def _run_effects(self, effects: list[SpeechEffect]) -> None:
        """The one interpreter of the session's effects: every ``SpeechEffect`` type has its case."""
        for effect in effects:
            match effect:
                case Send():
                    self._send(effect)
                case Speak():
                    self.speaker = asyncio.create_task(self._speak(effect))
                case Close():
                    self.close_reason = self.close_reason or (effect.code, effect.reason)
                    self.ended.set()
                case _:
                    unhandled(effect)

    def _send(self, effect: Send) -> None:
        """Queue at once. A reply past the bound is a bug: the reader stops well before it."""
        if not effect.audio and self.outbox.qsize() >= self.bound:
            self.close_reason = (1008, "outbound queue full: the client is not reading")
            raise _Closed
        item = effect.item
        self.outbox.put_nowait(item if isinstance(item, bytes) else msgspec.json.encode(item).decode())

    # -- tasks ---------------------------------------------------------------------------------------------
    async def run(self) -> None:
        writer = asyncio.create_task(self._writer())
        reader = asyncio.create_task(self._reader())
        ended = asyncio.create_task(self.ended.wait())
        try:
            # Any ends the stream: the client left (reader), stopped reading (writer), or an effect.
            while not (reader.done() or writer.done() or ended.done()):
                await asyncio.wait(
                    {reader, writer, ended}, timeout=WATCH_S, return_when=asyncio.FIRST_COMPLETED
                )
                if not (reader.done() or writer.done() or ended.done()) and await self._expired():
                    break
        finally:
            tasks = [t for t in (reader, writer, ended, self.speaker) if t is not None]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.tts is not None:
                self.tts.cancel()
            if self.close_reason is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(
                        self.ws.close(code=self.close_reason[0], reason=self.close_reason[1]), 2.0
                    )

    async def _expired(self) -> bool:
        now = time.monotonic()
        if self.session.speaking:
            self.lifetime.touch(now)  # being spoken is not idle
        why = self.lifetime.expired(now)
        if why is None:
            return False
        self._handle(Expired(why))
        with contextlib.suppress(TimeoutError):  # let the writer deliver the error first
            async with asyncio.timeout(2.0):
                while not self.outbox.empty():
                    self.room.clear()
                    await self.room.wait()
        return True

    async def _reader(self) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            while not self.ended.is_set():
                while self.outbox.qsize() >= self.input_high or not self.session.takes_text:
                    self.room.clear()
                    await self.room.wait()
                msg = await self.ws.receive()
                self.lifetime.touch(time.monotonic())
                if msg["type"] == "websocket.disconnect":
                    return
                self._handle(await self._decode(msg))

    async def _decode(self, msg: dict[str, Any]) -> sp.StreamClientEvent | sp.StreamError:
        text = msg.get("text")
        if text is None:
            return sp.StreamError(
                message="Binary frames are not accepted; send JSON events", code="invalid_frame"
            )
        if len(text) > self.max_frame_bytes:  # uvicorn's cap is the largest of all sockets'
            return sp.StreamError(
                message=f"Message of {len(text)} bytes exceeds the limit of {self.max_frame_bytes}",
                code="message_too_large",
            )
        if len(text) > OFFLOAD_DECODE_BYTES:
            return await asyncio.to_thread(sp.decode_stream_event, text)
        return sp.decode_stream_event(text)

    async def _speak(self, speak: Speak) -> None:
        """One segment through its own TTS stream (the slot held only meanwhile); its audio waits for
        room in the outbox, and the TTS stream pauses meanwhile."""
        try:
            tts = self.gateway.workers.tts.submit(speak.request)
        except NoFreeSlot as e:
            self._handle(SegmentRefused(speak.segment, str(e)))
            return
        self.tts = tts
        outcome: SpeechEvent = SegmentEnded(speak.segment)
        try:
            tts.push(speak.text)
            tts.close_input()
            async for frame in tts:
                assert isinstance(frame, TtsFrame)
                if frame.pcm:
                    self._handle(SegmentAudio(speak.segment, frame.pcm))
                    while self.outbox.qsize() >= self.audio_high:
                        self.room.clear()
                        await self.room.wait()
        except WorkerFault as e:
            outcome = SegmentFailed(speak.segment, str(e))
        finally:
            tts.cancel()  # a no-op when it finished; frees the slot at once otherwise
            self.tts = None
        self._handle(outcome)

    async def _writer(self) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            while True:
                item = await self.outbox.get()
                self.room.set()
                try:
                    async with asyncio.timeout(self.send_timeout_s):  # not wait_for: it can swallow a cancel
                        if isinstance(item, bytes):
                            await self.ws.send_bytes(item)
                        else:
                            await self.ws.send_text(item)
                except TimeoutError:
                    # The socket buffers are full and the client does not drain them: bound what we hold.
                    self.close_reason = (1008, "client is not reading")
                    return
