"""The official ``openai`` SDK as a client of a live gateway: connect, receive validated server events,
collect a turn."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from openai import AsyncOpenAI

from realtime_gw.testing.gateway import LiveServer
from tests.server.sdk_events import validate

FRAME_BYTES = 1920 * 2
RATE = 24000
CHUNK_MS = 40


async def speak(conn: Any, pcm: bytes) -> float:
    """Append ``pcm`` in 40 ms chunks at real time, as a microphone would; returns when it ended."""
    n = RATE * 2 * CHUNK_MS // 1000
    start = time.monotonic()
    for i in range(0, len(pcm), n):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + n]).decode())
        # Sleep to the chunk's real-time deadline (no drift however long the appends take).
        await asyncio.sleep(max(0.0, start + (i + n) / (RATE * 2) - time.monotonic()))
    return time.monotonic()


def silence(ms: int) -> bytes:
    return bytes(RATE * 2 * ms // 1000)


@asynccontextmanager
async def connect(server: LiveServer, **session: Any) -> AsyncIterator[Any]:
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key")
    async with client.realtime.connect(model="gpt-realtime") as conn:
        first = await recv(conn)
        assert first.type == "session.created"
        if session:
            await conn.session.update(session={"type": "realtime", **session})
            updated = await recv(conn)
            assert updated.type == "session.updated", updated
        yield conn


async def recv(conn: Any, timeout: float = 30.0) -> Any:
    """Next server event, validated against the SDK's pydantic models (not just constructed)."""
    return validate(await asyncio.wait_for(conn.recv_bytes(), timeout))


async def collect_until(conn: Any, stop: Callable[[Any], bool], timeout: float = 60.0) -> list[Any]:
    events: list[Any] = []
    deadline = time.monotonic() + timeout
    while True:
        ev = await recv(conn, max(0.1, deadline - time.monotonic()))
        events.append(ev)
        if stop(ev):
            return events


def types(events: list[Any]) -> list[str]:
    return [e.type for e in events]


def audio_of(events: list[Any]) -> bytes:
    return b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")


def is_done(ev: Any) -> bool:
    return ev.type == "response.done"


async def text_turn(conn: Any, text: str) -> list[Any]:
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    await conn.response.create()
    return await collect_until(conn, is_done)
