"""asyncio client for ``/v1/realtime`` (built on ``websockets``): the one the CLI and examples use.

    async with RealtimeClient("http://127.0.0.1:8000", api_key="k") as c:
        await c.update_session(input_session(rate=16000))
        await c.stream_pcm(pcm, 16000)              # paced like a microphone
        reply = await c.wait_reply()                # audio, transcript, timings

A reader task feeds every server event into ``ClientState`` (pure) and the ``JitterBuffer``; a player
task pulls 20 ms of audio at a time in real time (into ``on_audio`` if given), so ``played_ms`` is
what a listener has actually heard: the number barge-in truncation and ``playback.ack`` report.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import websockets
from websockets.asyncio.client import ClientConnection

from realtime_gw.client.jitter import JitterBuffer
from realtime_gw.client.protocol import (
    DEFAULT_URL,
    OUTPUT_RATE,
    ClientState,
    Event,
    PlaybackAckEvent,
    Reply,
    ServerError,
    append_audio,
    decode_server_event,
    encode_client_event,
    pace_delay,
    pcm_chunks,
    realtime_connect_options,
    realtime_url,
    session_update,
    text_turn,
)
from realtime_gw.protocols import realtime as rt

log = logging.getLogger(__name__)
PLAYER_TICK_S = 0.02


class RealtimeClient:
    def __init__(
        self,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        model: str | None = None,
        duplex: bool = False,
        play: bool = True,
        prebuffer_ms: float = 120.0,
        keep_audio: bool = True,
        auto_barge_in: bool = True,
        ack_interval_ms: float = 200.0,
        on_event: Callable[[Event, Reply | None], None] | None = None,
        on_audio: Callable[[bytes], None | Awaitable[None]] | None = None,
        open_timeout: float = 10.0,
    ) -> None:
        self.url = realtime_url(url, model, duplex)
        self.api_key = api_key
        self.play = play
        self.auto_barge_in = auto_barge_in
        self.ack_interval_s = ack_interval_ms / 1000.0
        self.on_event = on_event
        self.on_audio = on_audio
        self.open_timeout = open_timeout
        self.state = ClientState(keep_audio=keep_audio)
        self.jitter = JitterBuffer(OUTPUT_RATE, prebuffer_ms)
        self.ws: ClientConnection | None = None
        self.connect_s: float | None = None
        """Seconds from opening the socket to session.created."""
        self._waiters: list[tuple[Callable[[Event], bool], asyncio.Future[Event], bool]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._acked: dict[str, int] = {}
        self._closed: BaseException | None = None
        self._racy_cancels: set[str] = set()

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def __aenter__(self) -> RealtimeClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> rt.SessionOut | rt.TranscriptionSessionOut:
        t0 = time.perf_counter()
        self.ws = await websockets.connect(
            self.url, **realtime_connect_options(self.api_key, self.open_timeout)
        )
        created = self.expect(lambda ev: isinstance(ev, rt.SessionCreatedEvent))
        self._tasks.append(asyncio.create_task(self._reader(), name="realtime-reader"))
        try:
            await asyncio.wait_for(created, self.open_timeout)
        except BaseException:
            await self.close()  # __aexit__ does not run when __aenter__ fails
            raise
        self.connect_s = time.perf_counter() - t0
        if self.play:
            self._tasks.append(asyncio.create_task(self._player(), name="realtime-player"))
        assert self.state.session is not None
        return self.state.session

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.ws is not None:
            await self.ws.close()

    @property
    def session_id(self) -> str:
        return self.state.session.id if self.state.session else ""

    # -- sending -----------------------------------------------------------------------------------------
    async def send(self, event: rt.ClientEvent | PlaybackAckEvent) -> None:
        if self.ws is None:
            raise RuntimeError("not connected")
        await self.ws.send(encode_client_event(event))

    async def update_session(self, session: dict[str, Any], timeout: float = 10.0) -> rt.SessionOut | rt.TranscriptionSessionOut:
        fut = self.expect(lambda ev: isinstance(ev, rt.SessionUpdatedEvent), fail_on_error=True)
        await self.send(session_update(session))
        await asyncio.wait_for(fut, timeout)
        assert self.state.session is not None
        return self.state.session

    async def append(self, pcm: bytes) -> None:
        await self.send(append_audio(pcm))

    async def stream_pcm(self, pcm: bytes, rate: int, chunk_ms: int = 20, speed: float = 1.0) -> None:
        """Send PCM16 in ``chunk_ms`` pieces on a real-time schedule (``speed`` 0 = as fast as possible).

        The schedule is absolute (start + n x chunk), so sleep overshoot does not accumulate into drift.
        """
        t0 = time.monotonic()
        for n, chunk in enumerate(pcm_chunks(pcm, rate, chunk_ms), start=1):
            await self.append(chunk)
            if (delay := pace_delay(t0, n, chunk_ms, speed, time.monotonic())) > 0:
                await asyncio.sleep(delay)

    async def commit(self) -> None:
        await self.send(rt.InputAudioBufferCommitEvent())

    async def create_response(self, **params: Any) -> None:
        await self.send(
            rt.ResponseCreateEvent(response=msgspec.convert(params, rt.ResponseParams) if params else None)
        )

    async def cancel_response(self, response_id: str | None = None) -> None:
        await self.send(rt.ResponseCancelEvent(response_id=response_id))

    async def say(self, text: str, timeout: float = 120.0) -> Reply:
        """A text turn: the user says ``text`` and the server answers; returns the finished reply."""
        done = self.expect(lambda ev: isinstance(ev, rt.ResponseDoneEvent), fail_on_error=True)
        for event in text_turn(text):
            await self.send(event)
        ev = await asyncio.wait_for(done, timeout)
        assert isinstance(ev, rt.ResponseDoneEvent)
        return self.state.replies[ev.response.id]

    async def barge_in(self) -> int | None:
        """Interrupt the reply being heard: stop playback, ``response.cancel`` (if it is still being
        generated), then ``conversation.item.truncate`` at what was actually played.

        Cancel goes first: this server treats a truncate of a live item as a cancel too, and a
        cancel after that would be answered with an error. Returns the ``audio_end_ms`` sent.
        """
        reply = self._playing_reply()
        if reply is None:
            return None
        played = int(self.jitter.played_ms(reply.id))
        self.jitter.flush(reply.id)
        if not reply.done:
            # The server may have finished generating already (its response.done is still queued
            # behind paced audio): that cancel's "not active" error is expected, so it is not raised.
            cancel = rt.ResponseCancelEvent(response_id=reply.id, event_id="evt_cancel_" + reply.id)
            self._racy_cancels.add(cancel.event_id or "")
            await self.send(cancel)
        if reply.item_id is not None:
            await self.send(
                rt.ConversationItemTruncateEvent(item_id=reply.item_id, content_index=0, audio_end_ms=played)
            )
        return played

    def _playing_reply(self) -> Reply | None:
        rid = self.jitter.current
        if rid is not None and self.jitter.is_playing(rid) and rid in self.state.replies:
            return self.state.replies[rid]
        return self.state.current

    # -- receiving ---------------------------------------------------------------------------------------
    def expect(self, pred: Callable[[Event], bool], fail_on_error: bool = False) -> asyncio.Future[Event]:
        """A future for the next event matching ``pred``; register it *before* sending what causes it."""
        fut: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        if self._closed is not None:
            fut.set_exception(ConnectionError(f"connection closed: {self._closed}"))
        else:
            self._waiters.append((pred, fut, fail_on_error))
        return fut

    async def wait_for(self, pred: Callable[[Event], bool], timeout: float = 60.0) -> Event:
        return await asyncio.wait_for(self.expect(pred), timeout)

    async def wait_reply(self, response_id: str | None = None, timeout: float = 120.0) -> Reply:
        """The next finished reply (or the given one, if it is not finished already)."""
        if response_id is not None and (r := self.state.replies.get(response_id)) is not None and r.done:
            return r
        ev = await self.wait_for(
            lambda e: isinstance(e, rt.ResponseDoneEvent) and response_id in (None, e.response.id), timeout
        )
        assert isinstance(ev, rt.ResponseDoneEvent)
        return self.state.replies[ev.response.id]

    async def _reader(self) -> None:
        assert self.ws is not None
        try:
            async for raw in self.ws:
                now = time.monotonic()
                ev = decode_server_event(raw)
                if isinstance(ev, rt.ErrorEvent) and ev.error.event_id in self._racy_cancels:
                    self._racy_cancels.discard(ev.error.event_id)
                    continue
                reply = self.state.feed(ev, now)
                if isinstance(ev, rt.ResponseAudioDeltaEvent):
                    self.jitter.push(ev.response_id, ev.seq, ev.delta)
                elif isinstance(ev, rt.ResponseDoneEvent):
                    self.jitter.end(ev.response.id)
                elif isinstance(ev, rt.InputAudioBufferSpeechStartedEvent) and self.auto_barge_in:
                    await self._interrupted_by_speech()
                if self.on_event is not None:
                    try:
                        self.on_event(ev, reply)
                    except Exception:  # a broken callback must not stop the session
                        log.exception("on_event callback failed")
                self._resolve(ev)
            self._closed = ConnectionError("closed by server")
        except websockets.ConnectionClosed as e:
            self._closed = e
        except Exception as e:  # e.g. an undecodable frame: fail the waiters with the reason
            log.exception("realtime reader failed")
            self._closed = e
        finally:
            self._closed = self._closed or ConnectionError("reader stopped")
            for _, fut, _ in self._waiters:
                if not fut.done():
                    fut.set_exception(ConnectionError(f"connection closed: {self._closed}"))
            self._waiters.clear()

    async def _interrupted_by_speech(self) -> None:
        """Server VAD heard the user while a reply plays: the server cancels the response itself
        (``interrupt_response``); the client stops playback and truncates the item to what was heard."""
        rid = self.jitter.current
        if rid is None or not self.jitter.is_playing(rid):
            return
        reply = self.state.replies.get(rid)
        played = int(self.jitter.played_ms(rid))
        self.jitter.flush(rid)
        if reply is not None and reply.item_id is not None:
            await self.send(
                rt.ConversationItemTruncateEvent(item_id=reply.item_id, content_index=0, audio_end_ms=played)
            )

    def _resolve(self, ev: Event) -> None:
        keep = []
        for pred, fut, fail_on_error in self._waiters:
            if fut.done():
                continue
            if pred(ev):
                fut.set_result(ev)
            elif fail_on_error and isinstance(ev, rt.ErrorEvent):
                fut.set_exception(ServerError(ev.error))
            else:
                keep.append((pred, fut, fail_on_error))
        self._waiters = keep

    # -- playback ----------------------------------------------------------------------------------------
    async def _player(self) -> None:
        """Pull audio in real time; report progress with ``playback.ack`` where the server wants it."""
        t0 = time.monotonic()
        pulled = 0
        last_ack = 0.0
        while True:
            await asyncio.sleep(PLAYER_TICK_S)
            now = time.monotonic()
            due = int((now - t0) * OUTPUT_RATE) - pulled
            if due <= 0:
                continue
            pcm = self.jitter.pull(due)
            pulled += due
            if self.on_audio is not None:
                result = self.on_audio(pcm)
                if asyncio.iscoroutine(result):
                    await result
            ack = self.state.supports_playback_ack
            if ack and now - last_ack >= self.ack_interval_s and self.jitter.current is not None:
                last_ack = now
                await self._ack(self.jitter.current)
            for rid in self.jitter.finished():
                if ack:
                    await self._ack(rid)  # the final position: everything that was played
                self._acked.pop(rid, None)
                self.jitter.forget(rid)

    async def _ack(self, response_id: str) -> None:
        played = int(self.jitter.played_ms(response_id))
        if played > self._acked.get(response_id, -1):
            self._acked[response_id] = played
            with contextlib.suppress(websockets.ConnectionClosed):
                await self.send(PlaybackAckEvent(response_id=response_id, played_ms=played))
