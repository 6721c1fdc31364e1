"""Streaming TTS over HTTP: ``POST /v1/audio/speech`` (the WebSocket stream is ``speech_stream.py``).

It feeds the same TTS stage worker as realtime sessions, so speech requests batch with them. Audio is
streamed as it is produced (80 ms frames); a client that goes away cancels its TTS stream. The request
body is read up to ``max_request_body_bytes`` (HTTP 413 above it).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from realtime_gw.models.runtime import NoFreeSlot, RequestRefused, Stream, WorkerFault
from realtime_gw.protocols import speech as sp
from realtime_gw.records.voice import OUTPUT_RATE, TtsFrame, TtsRequest
from realtime_gw.server import auth
from realtime_gw.server.gateway import Gateway

log = logging.getLogger(__name__)

MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac"}
OFFLOAD_DECODE_BYTES = 256 * 1024
"""Client frames above this are decoded on a thread, off the event loop."""


class _Closed(Exception):
    """The stream must end: the client is not reading."""


def openai_error(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)


async def speech_endpoint(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    key = gateway.access.identify(auth.presented_key(request.headers))
    if key is None:
        return openai_error(401, "Invalid or missing API key", code="invalid_api_key")
    body = await bounded_body(request, gateway.config.max_request_body_bytes)
    if body is None:
        limit = gateway.config.max_request_body_bytes
        return openai_error(413, f"Request body is over the limit of {limit} bytes", code="request_too_large")
    try:
        req = msgspec.json.decode(body, type=sp.SpeechRequest)
        sp.check_speech_request(req, gateway.voices_for(key))
    except msgspec.ValidationError as e:
        return openai_error(400, f"Invalid request: {e}", code="invalid_value")
    except msgspec.DecodeError as e:
        return openai_error(400, f"Malformed JSON: {e}", code="invalid_json")
    except sp.SpeechInputError as e:
        return openai_error(400, str(e), param=e.param, code=e.code)
    try:
        stream = gateway.workers.tts.submit(
            TtsRequest(voice=req.voice, speed=req.speed, instructions=req.instructions)
        )
    except NoFreeSlot as e:
        return openai_error(503, str(e), code="server_busy")
    stream.push(req.input)
    stream.close_input()
    # The status goes out with the first audio: a request the worker refuses (its model's limits) or
    # that fails before any audio gets an error response, not a 200 with an empty body.
    frames = _frames(stream)
    try:
        first = await anext(frames, None)
    except RequestRefused as e:
        return openai_error(400, str(e), code="invalid_value")
    except WorkerFault as e:
        log.warning("speech stream failed before any audio: %s", e)
        return openai_error(500, f"Speech synthesis failed: {e}", code="server_error")
    if req.stream_format == "sse":
        body = _sse(_prepend(first, frames), req.response_format)
        media_type = "text/event-stream"
    else:
        body = _raw(_prepend(first, frames), req.response_format)
        media_type = MEDIA_TYPES[req.response_format]
    return StreamingResponse(body, media_type=media_type)


async def _prepend(first: bytes | None, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``first`` (already taken from ``rest``; None: there was none), then the rest."""
    try:
        if first is not None:
            yield first
        async for chunk in rest:
            yield chunk
    finally:
        await rest.aclose()  # runs _frames' cancel when the client left early


async def bounded_body(request: Request, limit: int) -> bytes | None:
    """The body, or None once it passes ``limit`` bytes (read no further)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


async def _frames(stream: Stream[Any]) -> AsyncIterator[bytes]:
    try:
        async for frame in stream:
            assert isinstance(frame, TtsFrame)
            if frame.pcm:
                yield frame.pcm
    finally:
        stream.cancel()  # a no-op when finished; frees the slot when the client left early


async def _raw(frames: AsyncIterator[bytes], fmt: str) -> AsyncIterator[bytes]:
    if fmt == "flac":
        # FLAC frames need the whole signal's framing; encode once synthesis is done.
        pcm = b"".join([chunk async for chunk in frames])
        yield await asyncio.to_thread(sp.flac_bytes, pcm)  # tens of ms for a long clip: not on the loop
        return
    if fmt == "wav":
        yield sp.wav_header()
    try:
        async for chunk in frames:
            yield chunk
    except WorkerFault as e:
        log.warning("speech stream failed: %s", e)  # headers are sent; the body just ends early


async def _sse(frames: AsyncIterator[bytes], fmt: str) -> AsyncIterator[str]:
    def event(payload: dict[str, Any]) -> str:
        return f"data: {json.dumps(payload)}\n\n"

    header = sp.wav_header() if fmt == "wav" else b""
    total = 0
    try:
        async for chunk in frames:
            total += len(chunk)
            yield event({"type": "speech.audio.delta", "audio": base64.b64encode(header + chunk).decode()})
            header = b""
    except WorkerFault as e:
        yield event({"type": "error", "error": {"message": str(e), "type": "server_error"}})
        return
    yield event({"type": "speech.audio.done", "usage": {"audio_ms": round(total / 2 / OUTPUT_RATE * 1000)}})
