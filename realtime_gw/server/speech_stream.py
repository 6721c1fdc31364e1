"""``WS /v1/audio/speech/stream``: incremental text in, 80 ms PCM16 frames out.

An utterance grows while it is spoken, but a TTS slot is held only while text is being synthesized:
text waits here until a sentence is complete (or ``input.done``), then that segment gets its own TTS
stream, which ends when the segment is spoken. An idle socket, or one waiting for the rest of a
sentence, holds no slot. Segments' audio is reframed so every frame but an utterance's last is 80 ms.

Bounds: text waiting to be spoken (``speech_max_pending_chars``: the socket is not read while more
waits), text per utterance (``speech_max_utterance_chars``), the outbox (audio waits for room; the
reader stops while it is three-quarters full; a client that stops reading is closed 1008 after
``send_timeout_s``), idle timeout and maximum duration (``error`` ``session_expired``, close 1000).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from typing import Any

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect

from realtime_gw.models.registry import accepted_voices
from realtime_gw.models.runtime import NoFreeSlot, Stream, WorkerFault
from realtime_gw.protocols import speech as sp
from realtime_gw.protocols.audio import SPEED_ERROR, Reframer, speed_in_range
from realtime_gw.records.voice import OUTPUT_RATE, TtsFrame, TtsRequest
from realtime_gw.server.admission import Admission, admit_socket
from realtime_gw.server.auth import Refusal
from realtime_gw.server.gateway import Gateway
from realtime_gw.server.limits import Lifetime

log = logging.getLogger(__name__)

OFFLOAD_DECODE_BYTES = 256 * 1024
"""Client frames above this are decoded on a thread, off the event loop."""
WATCH_S = 0.5
"""How often the idle timeout and the maximum duration are checked."""
RUN_ON_CHARS = 400
"""Text without a sentence end is spoken up to its last space once it is this long."""

_SPACE = re.compile(r"\s+")
_CLOSERS = frozenset("\"')]\u201d\u2019")


def segment_end(text: str, start: int = 0, run_on: int = RUN_ON_CHARS) -> int:
    """Where the complete sentences in ``text`` end (0: none yet): after whitespace that follows .!?
    (and closing quotes or brackets), or after a newline. Text without one is cut at its last space
    once ``run_on`` long. Scans from ``start`` and looks back only over closers, so text that grows
    piece by piece costs linear time in all (a pattern like ``[.!?]+`` then whitespace backtracks quadratically on a
    long run of dots)."""
    end = 0
    for match in _SPACE.finditer(text, max(0, start)):
        i = match.start()
        while i > 0 and text[i - 1] in _CLOSERS:
            i -= 1
        if (i > 0 and text[i - 1] in ".!?") or "\n" in match.group():
            end = match.end()
    if end == 0 and len(text) >= run_on:
        end = text.rfind(" ") + 1 or len(text)
    return end


class _Closed(Exception):
    """The stream must end: a limit was hit (``close_reason`` says which)."""


async def speech_stream_endpoint(ws: WebSocket) -> None:
    gateway: Gateway = ws.app.state.gateway
    admission = Admission(gateway, "speech")

    def refused(r: Refusal) -> str:
        return msgspec.json.encode(sp.StreamError(message=r.message, code=r.code)).decode()

    if not await admit_socket(ws, admission, refused):
        return
    with admission:
        await SpeechStream(ws, gateway).run()


class SpeechStream:
    """One WebSocket. A reader handles client events, a speaker task per utterance turns its text into
    audio segment by segment, one writer task sends everything."""

    def __init__(self, ws: WebSocket, gateway: Gateway) -> None:
        config = gateway.config
        self.ws = ws
        self.gateway = gateway
        self.voices = accepted_voices(gateway.workers.tts.describe())
        self.session = sp.SessionConfig()
        self.max_pending = config.speech_max_pending_chars
        self.max_utterance = config.speech_max_utterance_chars
        self.send_timeout_s = config.send_timeout_s
        self.max_frame_bytes = config.max_frame_bytes
        # The outbox: replies never wait (a reader that stops at input_high leaves them room up to
        # `bound`); audio waits below audio_high.
        self.outbox: asyncio.Queue[str | bytes] = asyncio.Queue()
        self.bound = config.outbound_queue_frames
        self.audio_high = max(1, self.bound // 2)
        self.input_high = max(1, self.bound * 3 // 4)
        self.room = asyncio.Event()  # set by the writer as it takes an item, and when text is taken
        self.lifetime = Lifetime(config.speech_idle_timeout_s, config.speech_max_session_s, time.monotonic())
        self.close_reason: tuple[int, str] | None = None
        # The utterance in progress: its number, all its text, what is not yet handed to a TTS stream.
        self.utterance = 0
        self.text: list[str] = []  # pieces, joined once at audio.done (+= on an attribute copies)
        self.text_chars = 0
        self.pending = ""
        self.scanned = 0  # how far `pending` has been scanned for a sentence end
        self.done = False  # input.done came: speak the rest, then end the utterance
        self.text_ready = asyncio.Event()
        self.speaker: asyncio.Task[None] | None = None
        self.tts: Stream[Any] | None = None
        """The TTS stream of the segment being synthesized (None between segments: no slot held)."""

    # -- outbox ------------------------------------------------------------------------------------------
    @staticmethod
    def _wire(item: sp.StreamEvent | bytes) -> str | bytes:
        return item if isinstance(item, bytes) else msgspec.json.encode(item).decode()

    def send(self, item: sp.StreamEvent | bytes) -> None:
        """Queue a reply at once. The reader stops well before the bound, so only a bug reaches it."""
        if self.outbox.qsize() >= self.bound:
            self.close_reason = (1008, "outbound queue full: the client is not reading")
            raise _Closed
        self.outbox.put_nowait(self._wire(item))

    async def send_audio(self, item: sp.StreamEvent | bytes) -> None:
        """Queue synthesis output, waiting for room (the TTS stream pauses meanwhile)."""
        while self.outbox.qsize() >= self.audio_high:
            self.room.clear()
            await self.room.wait()
        self.outbox.put_nowait(self._wire(item))

    def error(self, message: str, code: str = "invalid_value", param: str | None = None) -> None:
        self.send(sp.StreamError(message=message, code=code, param=param))

    # -- tasks ---------------------------------------------------------------------------------------------
    async def run(self) -> None:
        writer = asyncio.create_task(self._writer())
        reader = asyncio.create_task(self._reader())
        try:
            # Either ends the stream: the client left (reader) or stopped reading (writer), or a limit.
            while not (reader.done() or writer.done()):
                await asyncio.wait({reader, writer}, timeout=WATCH_S, return_when=asyncio.FIRST_COMPLETED)
                if not (reader.done() or writer.done()) and await self._expired():
                    break
        finally:
            tasks = [t for t in (reader, writer, self.speaker) if t is not None]
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
        if self.tts is not None:
            self.lifetime.touch(now)  # being spoken is not idle
        why = self.lifetime.expired(now)
        if why is None:
            return False
        with contextlib.suppress(_Closed):
            self.error(f"Speech stream closed: {why}.", "session_expired")
        self.close_reason = self.close_reason or (1000, why[:120])
        with contextlib.suppress(TimeoutError):  # let the writer deliver the error first
            async with asyncio.timeout(2.0):
                while not self.outbox.empty():
                    self.room.clear()
                    await self.room.wait()
        return True

    async def _reader(self) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, _Closed):
            while True:
                while self._input_blocked():
                    self.room.clear()
                    await self.room.wait()
                msg = await self.ws.receive()
                self.lifetime.touch(time.monotonic())
                if msg["type"] == "websocket.disconnect":
                    return
                text = msg.get("text")
                if text is None:
                    self.error("Binary frames are not accepted; send JSON events", "invalid_frame")
                elif len(text) > self.max_frame_bytes:  # uvicorn's cap is the largest of all sockets'
                    self.error(
                        f"Message of {len(text)} bytes exceeds the limit of {self.max_frame_bytes}",
                        "message_too_large",
                    )
                elif len(text) > OFFLOAD_DECODE_BYTES:
                    self.handle(await asyncio.to_thread(sp.decode_stream_event, text))
                else:
                    self.handle(sp.decode_stream_event(text))

    def _input_blocked(self) -> bool:
        """Backpressure: replies have no room, too much text waits, or the last utterance is finishing."""
        finishing = self.done and self.speaker is not None and not self.speaker.done()
        return self.outbox.qsize() >= self.input_high or len(self.pending) >= self.max_pending or finishing

    def handle(self, ev: sp.StreamClientEvent | sp.StreamError) -> None:
        if isinstance(ev, sp.StreamError):
            self.send(ev)
        elif isinstance(ev, sp.SessionConfig):
            if self._in_utterance():
                self.error("session.config cannot change during an utterance", "utterance_in_progress")
            elif ev.voice not in self.voices:
                self.error(
                    f"Unknown voice '{ev.voice}'; available: {', '.join(sorted(self.voices))}", param="voice"
                )
            elif not speed_in_range(ev.speed):
                self.error(SPEED_ERROR, param="speed")
            elif (why := sp.instructions_error(ev.instructions)) is not None:
                self.error(why, param="instructions")
            else:
                self.session = ev
        elif isinstance(ev, sp.InputText):
            self._add_text(ev.text)
        elif not self._in_utterance() or self.done:
            self.error("input.done without an utterance in progress", "no_utterance")
        else:
            self.done = True
            self.text_ready.set()

    def _in_utterance(self) -> bool:
        return self.speaker is not None and not self.speaker.done()

    def _add_text(self, text: str) -> None:
        if not text:
            self.error("input.text needs non-empty text", param="text")
            return
        if len(text) > self.max_pending:
            self.error(
                f"input.text of {len(text)} characters is over the limit of {self.max_pending}; send it in pieces",
                "string_above_max_length",
                "text",
            )
            return
        if not self._in_utterance():
            self._start_utterance()
        if self.text_chars + len(text) > self.max_utterance:
            self.error(
                f"the utterance would exceed {self.max_utterance} characters; send input.done and start another",
                "string_above_max_length",
                "text",
            )
            return
        self.text.append(text)
        self.text_chars += len(text)
        self.pending += text
        self.text_ready.set()

    def _start_utterance(self) -> None:
        self.utterance += 1
        self.text, self.text_chars, self.pending = [], 0, ""
        self.scanned = 0
        self.done = False
        self.send(sp.AudioStart(utterance=self.utterance))
        self.speaker = asyncio.create_task(self._speak(self.utterance))

    def _next_segment(self) -> str | None:
        """The text to synthesize next ("" = wait for more), or None when the utterance is complete."""
        run_on = min(RUN_ON_CHARS, self.max_pending)  # so pending text at its bound always has a segment
        end = len(self.pending) if self.done else segment_end(self.pending, self.scanned - 8, run_on)
        self.scanned = len(self.pending)
        if end == 0:
            return None if self.done else ""
        segment, self.pending = self.pending[:end], self.pending[end:]
        self.scanned = len(self.pending)
        self.room.set()  # text was taken: a reader held back by pending text may go on
        return segment

    async def _speak(self, utterance: int) -> None:
        """One utterance: each segment through its own TTS stream (the slot held only meanwhile)."""
        reframer = Reframer()
        frames = samples = 0
        while True:
            segment = self._next_segment()
            if segment is None:
                break
            if not segment.strip():
                if segment == "":
                    self.text_ready.clear()
                    await self.text_ready.wait()
                continue
            async for pcm in self._synthesize(segment):
                for frame in reframer.push(pcm):
                    frames += 1
                    samples += len(frame) // 2
                    await self.send_audio(frame)
        tail = reframer.flush()
        if tail:
            frames += 1
            samples += len(tail) // 2
            await self.send_audio(tail)
        await self.send_audio(
            sp.AudioDone(
                utterance=utterance,
                frames=frames,
                audio_ms=samples / OUTPUT_RATE * 1000,
                text="".join(self.text),
            )
        )

    async def _synthesize(self, text: str) -> Any:
        """PCM of one segment (an async iterator); errors become error events, the utterance goes on."""
        try:
            self.tts = self.gateway.workers.tts.submit(
                TtsRequest(
                    voice=self.session.voice, speed=self.session.speed, instructions=self.session.instructions
                )
            )
        except NoFreeSlot as e:
            await self.send_audio(sp.StreamError(message=str(e), code="server_busy"))
            return
        try:
            self.tts.push(text)
            self.tts.close_input()
            async for frame in self.tts:
                assert isinstance(frame, TtsFrame)
                if frame.pcm:
                    yield frame.pcm
        except WorkerFault as e:
            await self.send_audio(sp.StreamError(message=f"synthesis failed: {e}", code="server_error"))
        finally:
            self.tts.cancel()  # a no-op when it finished; frees the slot at once otherwise
            self.tts = None

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
