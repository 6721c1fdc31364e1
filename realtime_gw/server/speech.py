"""Streaming TTS: ``POST /v1/audio/speech`` and ``WS /v1/audio/speech/stream``.

Both feed the same TTS stage worker as realtime sessions, so speech requests batch with them. Audio
is streamed as it is produced (80 ms frames); a client that goes away cancels its TTS stream. The
socket's outbox is bounded: audio waits for room (so the TTS stream pauses), and a client that does not
read is closed (1008) after ``send_timeout_s`` or once ``outbound_queue_frames`` events wait.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from realtime_gw.models.registry import accepted_voices
from realtime_gw.models.runtime import NoFreeSlot, Stream, WorkerFault
from realtime_gw.protocols import speech as sp
from realtime_gw.protocols.audio import SPEED_ERROR, speed_in_range
from realtime_gw.records.voice import OUTPUT_RATE, TtsFrame, TtsRequest
from realtime_gw.server import auth
from realtime_gw.server.admission import Admission
from realtime_gw.server.gateway import Gateway

log = logging.getLogger(__name__)

MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac"}
OFFLOAD_DECODE_BYTES = 256 * 1024
"""Client frames above this are decoded on a thread, off the event loop."""


class _Closed(Exception):
    """The stream must end: the client is not reading."""


def openai_error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)




async def speech_endpoint(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    if gateway.access.identify(auth.presented_key(request.headers)) is None:
        return openai_error(401, "Invalid or missing API key", code="invalid_api_key")
    try:
        req = msgspec.json.decode(await request.body(), type=sp.SpeechRequest)
        sp.check_speech_request(req, accepted_voices(gateway.workers.tts.backend))
    except msgspec.ValidationError as e:
        return openai_error(400, f"Invalid request: {e}", code="invalid_value")
    except msgspec.DecodeError as e:
        return openai_error(400, f"Malformed JSON: {e}", code="invalid_json")
    except sp.SpeechInputError as e:
        return openai_error(400, str(e), param=e.param, code=e.code)
    try:
        stream = gateway.workers.tts.submit(TtsRequest(voice=req.voice, speed=req.speed))
    except NoFreeSlot as e:
        return openai_error(503, str(e), code="server_busy")
    stream.push(req.input)
    stream.close_input()
    if req.stream_format == "sse":
        body = _sse(stream, req.response_format)
        media_type = "text/event-stream"
    else:
        body = _raw(stream, req.response_format)
        media_type = MEDIA_TYPES[req.response_format]
    return StreamingResponse(body, media_type=media_type)


async def _frames(stream: Stream[Any]) -> AsyncIterator[bytes]:
    try:
        async for frame in stream:
            assert isinstance(frame, TtsFrame)
            if frame.pcm:
                yield frame.pcm
    finally:
        stream.cancel()  # a no-op when finished; frees the slot when the client left early


async def _raw(stream: Stream[Any], fmt: str) -> AsyncIterator[bytes]:
    if fmt == "flac":
        # FLAC frames need the whole signal's framing; encode once synthesis is done.
        pcm = b"".join([chunk async for chunk in _frames(stream)])
        yield await asyncio.to_thread(sp.flac_bytes, pcm)  # tens of ms for a long clip: not on the loop
        return
    if fmt == "wav":
        yield sp.wav_header()
    try:
        async for chunk in _frames(stream):
            yield chunk
    except WorkerFault as e:
        log.warning("speech stream failed: %s", e)  # headers are sent; the body just ends early


async def _sse(stream: Stream[Any], fmt: str) -> AsyncIterator[str]:
    def event(payload: dict[str, Any]) -> str:
        return f"data: {json.dumps(payload)}\n\n"

    header = sp.wav_header() if fmt == "wav" else b""
    total = 0
    try:
        async for chunk in _frames(stream):
            total += len(chunk)
            yield event({"type": "speech.audio.delta", "audio": base64.b64encode(header + chunk).decode()})
            header = b""
    except WorkerFault as e:
        yield event({"type": "error", "error": {"message": str(e), "type": "server_error"}})
        return
    yield event(
        {"type": "speech.audio.done", "usage": {"audio_ms": round(total / 2 / OUTPUT_RATE * 1000)}}
    )


async def speech_stream_endpoint(ws: WebSocket) -> None:
    gateway: Gateway = ws.app.state.gateway
    admission = Admission(gateway, "speech")
    refusal = admission.check(ws.headers)
    if refusal is not None:
        await ws.close(code=1008, reason=refusal.message)
        return
    await ws.accept()
    refusal = admission.enter()
    if refusal is not None:
        await ws.send_text(msgspec.json.encode(sp.StreamError(message=refusal.message, code=refusal.code)).decode())
        await ws.close(code=1013, reason=refusal.code.replace("_", " "))
        return
    with admission:
        await SpeechStream(ws, gateway).run()


class SpeechStream:
    """One WebSocket: utterances that grow while they are spoken. One writer task sends everything."""

    def __init__(self, ws: WebSocket, gateway: Gateway) -> None:
        self.ws = ws
        self.gateway = gateway
        self.voices = accepted_voices(gateway.workers.tts.backend)
        self.config = sp.SessionConfig()
        self.outbox: asyncio.Queue[str | bytes] = asyncio.Queue(maxsize=gateway.config.outbound_queue_frames)
        self.send_timeout_s = gateway.config.send_timeout_s
        self.close_reason: tuple[int, str] | None = None
        self.stream: Stream[Any] | None = None
        self.text = ""
        self.utterance = 0
        self.pump: asyncio.Task[None] | None = None

    @staticmethod
    def _wire(item: sp.StreamEvent | bytes) -> str | bytes:
        return item if isinstance(item, bytes) else msgspec.json.encode(item).decode()

    def send(self, item: sp.StreamEvent | bytes) -> None:
        """Queue a reply to the client's own event; a full outbox means it is not reading: close."""
        try:
            self.outbox.put_nowait(self._wire(item))
        except asyncio.QueueFull:
            self.close_reason = (1008, "outbound queue full: the client is not reading")
            raise _Closed from None

    async def send_audio(self, item: sp.StreamEvent | bytes) -> None:
        """Queue synthesis output, waiting for room (the TTS stream pauses meanwhile)."""
        await self.outbox.put(self._wire(item))

    def error(self, message: str, code: str = "invalid_value", param: str | None = None) -> None:
        self.send(sp.StreamError(message=message, code=code, param=param))

    async def run(self) -> None:
        writer = asyncio.create_task(self._writer())
        reader = asyncio.create_task(self._reader())
        try:
            # Either ends the stream: the client left (reader) or stopped reading (writer).
            await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if self.stream is not None:
                self.stream.cancel()
            tasks = [t for t in (reader, writer, self.pump) if t is not None]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.close_reason is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.ws.close(code=self.close_reason[0], reason=self.close_reason[1]), 2.0)

    async def _reader(self) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, _Closed):
            while True:
                msg = await self.ws.receive()
                if msg["type"] == "websocket.disconnect":
                    return
                text = msg.get("text")
                if text is None:
                    self.error("Binary frames are not accepted; send JSON events", "invalid_frame")
                    continue
                if len(text) > OFFLOAD_DECODE_BYTES:
                    self.handle(await asyncio.to_thread(sp.decode_stream_event, text))
                else:
                    self.handle(sp.decode_stream_event(text))

    def handle(self, ev: sp.StreamClientEvent | sp.StreamError) -> None:
        if isinstance(ev, sp.StreamError):
            self.send(ev)
        elif isinstance(ev, sp.SessionConfig):
            if self.stream is not None:
                self.error("session.config cannot change during an utterance", "utterance_in_progress")
            elif ev.voice not in self.voices:
                self.error(f"Unknown voice '{ev.voice}'; available: {', '.join(sorted(self.voices))}", param="voice")
            elif not speed_in_range(ev.speed):
                self.error(SPEED_ERROR, param="speed")
            else:
                self.config = ev
        elif isinstance(ev, sp.InputText):
            if not ev.text:
                self.error("input.text needs non-empty text", param="text")
                return
            if self.stream is None and not self._start():
                return
            assert self.stream is not None
            self.text += ev.text
            self.stream.push(ev.text)  # the utterance grows while it is being spoken
        elif self.stream is None or self.stream.input_closed:
            self.error("input.done without an utterance in progress", "no_utterance")
        else:
            self.stream.close_input()

    def _start(self) -> bool:
        try:
            self.stream = self.gateway.workers.tts.submit(TtsRequest(voice=self.config.voice, speed=self.config.speed))
        except NoFreeSlot as e:
            self.error(str(e), "server_busy")
            return False
        self.utterance += 1
        self.text = ""
        self.send(sp.AudioStart(utterance=self.utterance))
        self.pump = asyncio.create_task(self._pump(self.stream, self.utterance))
        return True

    async def _pump(self, stream: Stream[Any], utterance: int) -> None:
        frames = 0
        samples = 0
        try:
            async for chunk in _frames(stream):
                frames += 1
                samples += len(chunk) // 2
                await self.send_audio(chunk)
        except WorkerFault as e:
            await self.send_audio(sp.StreamError(message=f"synthesis failed: {e}", code="server_error"))
        await self.send_audio(
            sp.AudioDone(utterance=utterance, frames=frames, audio_ms=samples / OUTPUT_RATE * 1000, text=self.text)
        )
        if self.stream is stream:
            self.stream = None

    async def _writer(self) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            while True:
                item = await self.outbox.get()
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
