"""The official ``openai`` SDK's ``client.live.connect()`` as a client of a live gateway: start a
session, stream spoken input in real time, collect what the voice says (every server event validated
strictly against ``openai.types.live``)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from openai import AsyncOpenAI

from realtime_gw.testing.gateway import LiveServer
from tests.server.live_events import validate_live

RATE = 24000
BYTES_PER_MS = RATE * 2 // 1000


@asynccontextmanager
async def live_session(server: LiveServer, **config: Any) -> AsyncIterator[Any]:
    """A started GPT-Live session (``session.started`` checked)."""
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key")
    async with client.live.connect() as conn:
        await conn.session.start(session={"model": "gpt-live-1", **config}, event_id="start")
        started = await recv(conn)
        assert started.type == "session.started" and started.client_event_id == "start", started
        conn.started = started
        yield conn


async def recv(conn: Any, timeout: float = 30.0) -> Any:
    return validate_live(await asyncio.wait_for(conn.recv_bytes(), timeout))


def silence(ms: int) -> bytes:
    return b"\0\0" * (RATE * ms // 1000)


async def stream_audio(conn: Any, pcm: bytes, chunk_ms: int = 80) -> None:
    """Append ``pcm`` at the pace a microphone would (a little faster, so tests stay short)."""
    step = chunk_ms * BYTES_PER_MS
    for pos in range(0, len(pcm), step):
        await conn.session.input_audio.append(audio=base64.b64encode(pcm[pos : pos + step]).decode())
        await asyncio.sleep(chunk_ms / 1000 * 0.8)


@dataclass
class Heard:
    """What came back from the session, by kind."""

    events: list[Any] = field(default_factory=list)

    def of(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.type == kind]

    @property
    def input_text(self) -> str:
        return "".join(e.delta for e in self.of("session.input_transcript.delta"))

    @property
    def output_text(self) -> str:
        return "".join(e.delta for e in self.of("session.output_transcript.delta"))

    @property
    def audio(self) -> list[tuple[int, int, bytes]]:
        return [(e.start_ms, e.end_ms, base64.b64decode(e.delta)) for e in self.of("session.output_audio.delta")]

    def speech(self) -> bytes:
        """The output audio from the first non-silent frame on."""
        frames = [pcm for _, _, pcm in self.audio]
        first = next((i for i, pcm in enumerate(frames) if any(pcm)), len(frames))
        return b"".join(frames[first:])


async def listen(conn: Any, heard: Heard, until: Callable[[Heard], bool], timeout: float = 60.0) -> Heard:
    deadline = time.monotonic() + timeout
    while not until(heard):
        heard.events.append(await recv(conn, max(0.1, deadline - time.monotonic())))
    return heard


def spoke_then_quiet(quiet_ms: int = 800) -> Callable[[Heard], bool]:
    """The voice spoke, and has been silent for ``quiet_ms`` of the output stream since."""

    def done(heard: Heard) -> bool:
        frames = heard.audio
        spoken = [i for i, (_, _, pcm) in enumerate(frames) if any(pcm)]
        return bool(spoken) and frames[-1][1] - frames[spoken[-1]][1] >= quiet_ms

    return done
