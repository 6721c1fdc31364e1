"""Streaming TTS: ``POST /v1/audio/speech`` and ``WS /v1/audio/speech/stream``.

Both feed the same TTS stage worker as realtime sessions, so speech requests batch with them. Audio
is streamed as it is produced (80 ms frames); a client that goes away cancels its TTS stream.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import numpy as np
import soundfile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from realtime_gw.models.registry import accepted_voices
from realtime_gw.models.runtime import NoFreeSlot, Stream, WorkerFault
from realtime_gw.protocols import speech as sp
from realtime_gw.protocols.audio import SPEED_ERROR, speed_in_range
from realtime_gw.records.voice import OUTPUT_RATE, TtsFrame, TtsRequest
from realtime_gw.server import auth
from realtime_gw.server.gateway import Gateway

log = logging.getLogger(__name__)

MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac"}


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
        buf = io.BytesIO()
        soundfile.write(buf, np.frombuffer(pcm, dtype="<i2"), OUTPUT_RATE, format="FLAC", subtype="PCM_16")
        yield buf.getvalue()
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
    access = gateway.access
    if not access.origin_allowed(ws.headers.get("origin"), ws.headers.get("host")):
        await ws.close(code=1008, reason="origin not allowed")
        return
    key = access.identify(auth.presented_key(ws.headers))
    if key is None:
        await ws.close(code=1008, reason="invalid or missing API key")
        return
    await ws.accept()
    refusal = access.acquire(key)
    if refusal is not None:
        await ws.send_text(msgspec.json.encode(sp.StreamError(message=refusal.message, code=refusal.code)).decode())
        await ws.close(code=1013, reason=refusal.code.replace("_", " "))
        return
    try:
        await SpeechStream(ws, gateway).run()
    finally:
        access.release(key)


class SpeechStream:
    """One WebSocket: utterances that grow while they are spoken. One writer task sends everything."""

    def __init__(self, ws: WebSocket, gateway: Gateway) -> None:
        self.ws = ws
        self.gateway = gateway
        self.voices = accepted_voices(gateway.workers.tts.backend)
        self.config = sp.SessionConfig()
        self.outbox: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self.stream: Stream[Any] | None = None
        self.text = ""
        self.utterance = 0
        self.pump: asyncio.Task[None] | None = None

    def send(self, item: sp.StreamEvent | bytes) -> None:
        self.outbox.put_nowait(item if isinstance(item, bytes) else msgspec.json.encode(item).decode())

    def error(self, message: str, code: str = "invalid_value", param: str | None = None) -> None:
        self.send(sp.StreamError(message=message, code=code, param=param))

    async def run(self) -> None:
        writer = asyncio.create_task(self._writer())
        try:
            while True:
                msg = await self.ws.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                if msg.get("text") is None:
                    self.error("Binary frames are not accepted; send JSON events", "invalid_frame")
                    continue
                self.handle(sp.decode_stream_event(msg["text"]))
        except WebSocketDisconnect:
            pass
        finally:
            if self.stream is not None:
                self.stream.cancel()
            if self.pump is not None:
                self.pump.cancel()
            writer.cancel()
            await asyncio.gather(writer, *(t for t in [self.pump] if t), return_exceptions=True)

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
                self.send(chunk)
        except WorkerFault as e:
            self.error(f"synthesis failed: {e}", "server_error")
        self.send(
            sp.AudioDone(utterance=utterance, frames=frames, audio_ms=samples / OUTPUT_RATE * 1000, text=self.text)
        )
        if self.stream is stream:
            self.stream = None

    async def _writer(self) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            while True:
                item = await self.outbox.get()
                if isinstance(item, bytes):
                    await self.ws.send_bytes(item)
                elif item is not None:
                    await self.ws.send_text(item)
