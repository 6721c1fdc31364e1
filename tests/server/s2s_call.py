"""The official ``openai`` SDK in a call with a speech-to-speech session (``client.realtime`` or
``client.live``): a microphone task that appends 80 ms of audio every 80 ms (queued speech, else
silence), and a reader that logs every server event (validated against the SDK's models) with its
arrival time."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from openai import AsyncOpenAI

from realtime_gw.testing.gateway import LiveServer
from tests.event_wait import first_event
from tests.server.live_events import validate_live
from tests.server.realtime_sdk_client import recv
from tests.server.sdk_events import validate

STEP_BYTES = 1920 * 2
STEP_S = 0.08


class Call:
    def __init__(self, conn: Any, session: Any, live: bool = False) -> None:
        self.conn = conn
        self.session = session
        """The ``session.created`` (or GPT-Live ``session.started``) resource."""
        self.append = conn.session.input_audio.append if live else conn.input_audio_buffer.append
        self.validate = validate_live if live else validate
        self.events: list[tuple[float, Any]] = []
        self.new = asyncio.Event()
        self.speech = bytearray()
        """Audio the microphone sends before it goes back to silence."""
        self.appended = 0
        self.tasks: list[asyncio.Task[None]] = []

    async def _microphone(self) -> None:
        start = time.monotonic()
        while True:
            chunk = bytes(self.speech[:STEP_BYTES])
            del self.speech[:STEP_BYTES]
            await self.append(audio=base64.b64encode(chunk.ljust(STEP_BYTES, b"\0")).decode())
            self.appended += 1
            await asyncio.sleep(max(0.0, start + self.appended * STEP_S - time.monotonic()))

    async def _reader(self) -> None:
        with contextlib.suppress(Exception):  # the connection closed
            while True:
                raw = await self.conn.recv_bytes()
                self.events.append((time.monotonic(), self.validate(raw)))
                self.new.set()

    async def stop(self) -> None:
        """Hang up: the microphone stops, the socket closes, and the reader ends with it."""
        self.tasks[0].cancel()
        await self.conn.close()
        await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 10)

    async def said(self) -> None:
        """Until the queued speech has gone out (the microphone runs at real time)."""
        for _ in range(round(len(self.speech) / STEP_BYTES) + 50):
            if not self.speech:
                return
            assert not self.tasks[0].done(), self.tasks[0]
            await asyncio.sleep(STEP_S)
        raise AssertionError("the microphone fell behind real time")

    async def wait(self, pred: Callable[[Any], bool], timeout: float = 15.0, after: int = 0) -> Any:
        return await first_event(self.events, self.new, pred, timeout, after)

    def of(self, kind: str, response_id: str | None = None, after: int = 0) -> list[Any]:
        return [e for _, e in self.events[after:] if e.type == kind and (response_id is None or e.response_id == response_id)]

    def times(self, kind: str, response_id: str) -> list[float]:
        return [t for t, e in self.events if e.type == kind and e.response_id == response_id]


@asynccontextmanager
async def call(server: LiveServer, seed: int | None = None, **session: Any) -> AsyncIterator[Call]:
    """A speech-to-speech session of ``model=moshi`` (the model's sampling ``seed``, and any
    ``session.update`` fields), its microphone running."""
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key")
    query = {"seed": str(seed)} if seed is not None else {}
    async with client.realtime.connect(model="moshi", extra_query=query) as conn:
        created = await recv(conn)
        assert created.type == "session.created", created
        c = Call(conn, created.session)
        c.tasks.append(asyncio.create_task(c._reader()))  # the model speaks from the start: log all of it
        if session:
            await conn.session.update(session={"type": "realtime", **session})
            await c.wait(lambda e: e.type in ("session.updated", "error"))
            assert not c.of("error"), c.of("error")
        c.tasks.insert(0, asyncio.create_task(c._microphone()))
        try:
            yield c
        finally:
            await c.stop()


@asynccontextmanager
async def live_call(server: LiveServer, **config: Any) -> AsyncIterator[Call]:
    """A GPT-Live session of ``model=moshi`` (``config``: the rest of its ``session.start``), its
    microphone running from ``session.started`` on; the events that came with the start are logged."""
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key")
    async with client.live.connect() as conn:
        await conn.session.start(session={"model": "moshi", **config}, event_id="start")
        started = validate_live(await asyncio.wait_for(conn.recv_bytes(), 15))
        assert started.type == "session.started" and started.client_event_id == "start", started
        c = Call(conn, started.session, live=True)
        c.tasks += [asyncio.create_task(c._microphone()), asyncio.create_task(c._reader())]
        try:
            yield c
        finally:
            await c.stop()
