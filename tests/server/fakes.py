"""Stand-ins for transport unit tests: a scripted WebSocket and a Gateway with a tone TTS worker."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from realtime_gw.config import GatewayConfig
from realtime_gw.models.registry import Workers
from realtime_gw.models.runtime import StageWorker
from realtime_gw.models.speech.tts_tone import ToneTtsBackend
from realtime_gw.server.auth import Access
from realtime_gw.server.gateway import Gateway


class FakeSocket:
    """Enough of starlette's ``WebSocket`` for a handler: scripted receives, recorded sends, and
    ``stalled`` to make every send block, like a client that stopped reading."""

    def __init__(self, headers: dict[str, str] | None = None) -> None:
        self.headers = headers or {}
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent: list[str | bytes] = []
        self.closed: tuple[int, str] | None = None
        self.stalled = False

    def feed_text(self, text: str) -> None:
        self.incoming.put_nowait({"type": "websocket.receive", "text": text})

    def feed_disconnect(self) -> None:
        self.incoming.put_nowait({"type": "websocket.disconnect", "code": 1000})

    async def receive(self) -> dict[str, Any]:
        return await self.incoming.get()

    async def _send(self, data: str | bytes) -> None:
        if self.stalled:
            await asyncio.Event().wait()  # never: the client's buffers are full
        self.sent.append(data)

    async def send_text(self, data: str) -> None:
        await self._send(data)

    async def send_bytes(self, data: bytes) -> None:
        await self._send(data)

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        self.closed = (code, reason or "")


def gateway(config: GatewayConfig | None = None, tts: StageWorker | None = None, keys: list[str] | None = None) -> Gateway:
    """A Gateway for handler tests: only ``tts`` is a real worker (the others are never reached)."""
    config = config or GatewayConfig(tts="tone", policy="none")
    unused = cast(StageWorker, None)
    worker = tts or StageWorker(ToneTtsBackend())
    return Gateway(
        config=config,
        workers=Workers(tts=worker, asr=unused, vad=unused, all=[worker]),
        responder=cast(Any, None),
        access=Access(keys or [], config.max_sessions_per_key, config.allowed_origins, config.session_starts_per_key_per_min),
    )
