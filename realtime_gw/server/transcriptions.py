"""``POST /v1/audio/transcriptions``: an uploaded file transcribed by the ASR stage worker, as JSON,
text, subtitles or server-sent events (``stream=true``).

The upload is read up to ``transcription_max_file_bytes`` (413 above it) and decoded on a thread
(``upload_audio.py``; longer than ``transcription_max_audio_s``: 400). The ASR stage hears it as it
hears a live turn: cut at pauses into pieces of at most 20 s (``protocols/transcriptions.pieces``),
each one ``AsrStreamRequest`` on the same worker as the realtime sessions, one piece at a time. The
backend advances a stream by a bounded amount per step (pocketsphinx 0.5 s of audio, Kyutai one 80 ms
frame), so a long file shares every step with the live calls' streams and never holds the worker; between
pieces its slot goes back, so a live turn can take it. At most ``transcription_max_concurrent`` files
are transcribed at once (429 above). Deltas are the words two consecutive partial hypotheses agree on
(``sessions.transcription.settled_words``, as in a realtime session).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.background import BackgroundTask
from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from realtime_gw.models.runtime import NoFreeSlot, StageWorker, WorkerFault
from realtime_gw.protocols import transcriptions as tp
from realtime_gw.records.voice import AsrResult, AsrStreamRequest
from realtime_gw.server import auth
from realtime_gw.server.gateway import Gateway
from realtime_gw.server.listen_effects import submit_with_retry
from realtime_gw.server.speech import bounded_body, openai_error
from realtime_gw.server.upload_audio import UploadError, decode
from realtime_gw.sessions.transcription import settled_words

log = logging.getLogger(__name__)

FORM_OVERHEAD_BYTES = 64 * 1024
"""The form's other fields and part headers, read beyond the file's own limit."""
PUSH_BYTES = 32000
"""A piece is pushed to its stream in 1 s chunks (at 16 kHz): the backend takes what a step allows."""
DISCONNECT_POLL_S = 1.0
"""How often a transcription answered in one piece checks that its client is still there."""
SLOT_PATIENCE_S = 30.0
"""How long a piece waits for a free decoder before the transcription fails with 503."""


async def transcriptions_endpoint(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    cfg = gateway.config
    if gateway.access.identify(auth.presented_key(request.headers)) is None:
        return openai_error(401, "Invalid or missing API key", code="invalid_api_key")
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        return openai_error(400, "Send the audio as multipart/form-data with a 'file' part", code="invalid_request")
    if gateway.transcriptions >= cfg.transcription_max_concurrent:  # before the body: at most N in memory
        return openai_error(
            429, f"{cfg.transcription_max_concurrent} files are being transcribed; try again shortly", code="rate_limit_exceeded"
        )
    gateway.transcriptions += 1
    handed_off = False
    try:
        limit = cfg.transcription_max_file_bytes
        body = await bounded_body(request, limit + FORM_OVERHEAD_BYTES)
        too_big = openai_error(413, f"The file is over the limit of {limit} bytes", "file", "file_too_large")
        if body is None:
            return too_big
        try:  # ~0.15 s for 25 MiB: on a thread (its own event loop: Starlette's parser is async)
            form, data = await asyncio.to_thread(asyncio.run, _parse(request.headers, body))
            if len(data) > limit:
                return too_big
            info = gateway.workers.asr.describe()
            fields = tp.check_form(form, cfg.asr, info.word_times)
        except tp.TranscriptionInputError as e:
            return openai_error(e.status, str(e), e.param, e.code)
        rate = info.native_rate or 16000
        try:
            pcm, duration, cuts = await asyncio.to_thread(_prepare, data, rate, cfg.transcription_max_audio_s)
        except UploadError as e:
            return openai_error(400, str(e), "file", "invalid_value")
        job = FileTranscription(gateway.workers.asr, pcm, rate, duration, cuts, "word" in fields.granularities)
        if fields.stream:
            handed_off = True
            done = _Release(gateway)  # by the stream's end, or after the response if it never started
            return StreamingResponse(_events(job, done), media_type="text/event-stream", background=BackgroundTask(done))
        try:
            transcript = await _while_connected(request, job.run())
            if transcript is None:
                return Response(status_code=499)  # nobody reads it; the stream was cancelled
        except NoFreeSlot as e:
            return openai_error(503, str(e), code="server_busy")
        except WorkerFault as e:
            log.warning("transcription failed: %s", e)
            return openai_error(500, f"Transcription failed: {e}", code="server_error")
        language = tp.STAGE_LANGUAGES[cfg.asr][fields.language]
        text, media_type = tp.render(transcript, fields, language)
        return Response(text, media_type=media_type)
    finally:
        if not handed_off:
            gateway.transcriptions -= 1


async def _while_connected(request: Request, work: Awaitable[tp.Transcript]) -> tp.Transcript | None:
    """``work``'s result, or None once the client has gone (the work cancelled: its ASR stream with it)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                return None
    finally:
        task.cancel()


def _prepare(data: bytes, rate: int, max_seconds: float) -> tuple[bytes, float, list[tuple[int, int]]]:
    """The file decoded and cut into pieces (blocking: on a thread)."""
    pcm, duration = decode(data, rate, max_seconds)
    return pcm, duration, tp.pieces(pcm, rate)


async def _parse(headers: Headers, body: bytes) -> tuple[dict[str, list[str]], bytes]:
    """The form's text fields and the file's bytes."""

    async def once() -> AsyncIterator[bytes]:
        yield body

    parser = MultiPartParser(headers, once(), max_files=1, max_fields=64)
    try:
        form = await parser.parse()
    except MultiPartException as e:
        raise tp.TranscriptionInputError(f"Malformed multipart form: {e.message}", None, "invalid_request") from None
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise tp.TranscriptionInputError("you must provide a 'file' part", "file", "missing_required_parameter")
    try:
        data = await upload.read()
    finally:
        await form.close()
    fields: dict[str, list[str]] = {}
    for key, value in form.multi_items():
        if isinstance(value, str):
            fields.setdefault(key, []).append(value)
    return fields, data


class _Release:
    """Gives a streamed transcription's place back once, whichever comes first: the stream's own end, or
    the response's background task (a client that leaves before the stream starts never runs its end)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway: Gateway | None = gateway

    def release(self) -> None:
        if self.gateway is not None:
            self.gateway.transcriptions -= 1
            self.gateway = None

    async def __call__(self) -> None:  # async: Starlette runs it on the event loop, not in a thread
        self.release()


async def _events(job: FileTranscription, done: _Release) -> AsyncIterator[str]:
    queue: asyncio.Queue[str | None] = asyncio.Queue()

    async def delta(text: str) -> None:
        await queue.put(tp.sse(tp.delta_event(text)))

    async def produce() -> None:
        try:
            transcript = await job.run(delta)
            await queue.put(tp.sse(tp.done_event(transcript)))
        except (NoFreeSlot, WorkerFault) as e:
            log.warning("streamed transcription failed: %s", e)
            kind = "server_busy" if isinstance(e, NoFreeSlot) else "server_error"
            await queue.put(tp.sse({"type": "error", "error": {"message": str(e), "type": "server_error", "code": kind}}))
        finally:
            await queue.put(None)

    task = asyncio.create_task(produce())
    try:
        while (item := await queue.get()) is not None:
            yield item
    finally:
        task.cancel()  # the client left: its stream is cancelled and the slot freed
        done.release()


class FileTranscription:
    """One file through the ASR worker, piece by piece."""

    def __init__(
        self, asr: StageWorker, pcm: bytes, rate: int, duration: float, cuts: list[tuple[int, int]], word_times: bool
    ) -> None:
        self.asr = asr
        self.pcm = pcm
        self.cuts = cuts
        self.rate = rate
        self.duration = duration
        self.word_times = word_times
        self.sent_any = False

    async def run(self, on_delta: Callable[[str], Awaitable[None]] | None = None) -> tp.Transcript:
        transcript = tp.Transcript(self.duration)
        for start, end in self.cuts:
            offset = start / 2 / self.rate
            segment = await self._piece(self.pcm[start:end], offset, on_delta)
            segment.end = offset + (end - start) / 2 / self.rate
            transcript.segments.append(segment)
        return transcript

    async def _piece(
        self, pcm: bytes, offset: float, on_delta: Callable[[str], Awaitable[None]] | None
    ) -> tp.Segment:
        stream = await submit_with_retry(self.asr, AsrStreamRequest(self.rate, self.word_times), SLOT_PATIENCE_S)
        try:
            for i in range(0, len(pcm), PUSH_BYTES):
                stream.push(pcm[i : i + PUSH_BYTES])
            stream.close_input()
            heard: list[str] = []
            sent: list[str] = []
            final: AsrResult | None = None
            async for result in stream:
                if result.final:
                    final = result
                    break
                heard, new = settled_words(heard, sent, result.text)
                if new and on_delta is not None:
                    sent += new
                    await self._emit(new, on_delta)
        finally:
            stream.cancel()
        text = final.text if final is not None else ""
        rest = text.split()[len(sent) :]
        if rest and on_delta is not None:
            await self._emit(rest, on_delta)
        words = [tp.Word(w.word, offset + w.start_s, offset + w.end_s) for w in (final.words or [])] if final else []
        return tp.Segment(offset, offset, text, words)

    async def _emit(self, words: list[str], on_delta: Callable[[str], Awaitable[None]]) -> None:
        await on_delta((" " if self.sent_any else "") + " ".join(words))
        self.sent_any = True
