"""A WebSocket tap between a voice-agent framework and the gateway: frames pass through unchanged
and every one is kept, so a test can check the gateway's own events whatever the framework does
with them."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from tests.server.sdk_events import validate

FORWARDED_HEADERS = ("authorization", "openai-beta", "user-agent")


class RealtimeTap:
    """``url`` goes to the framework; what the gateway sends is in ``server_events`` (raw text),
    what the framework sends in ``client_events``."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.server_events: list[str] = []
        self.client_events: list[str] = []
        self.open_connections = 0
        self.connections = 0
        self._server: Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        port = next(iter(self._server.sockets)).getsockname()[1]
        return f"ws://127.0.0.1:{port}"

    async def __aenter__(self) -> RealtimeTap:
        self._server = await serve(
            self._relay, "127.0.0.1", 0, max_size=None, select_subprotocol=lambda conn, offered: None
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _relay(self, downstream: ServerConnection) -> None:
        request = downstream.request
        assert request is not None
        headers = {k: v for k, v in request.headers.raw_items() if k.lower() in FORWARDED_HEADERS}
        async with connect(
            self.upstream + request.path, additional_headers=headers, max_size=None
        ) as upstream:
            self.connections += 1
            self.open_connections += 1
            try:
                pumps = [
                    asyncio.create_task(self._pump(downstream, upstream, self.client_events)),
                    asyncio.create_task(self._pump(upstream, downstream, self.server_events)),
                ]
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
                for pump in pumps:
                    pump.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await pump
            finally:
                self.open_connections -= 1

    @staticmethod
    async def _pump(
        source: ServerConnection | ClientConnection,
        sink: ServerConnection | ClientConnection,
        kept: list[str],
    ) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for message in source:
                if isinstance(message, str):
                    kept.append(message)
                await sink.send(message)
        await sink.close()

    # -- what tests ask ------------------------------------------------------------------------------
    def events(self) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.server_events]

    def types(self) -> list[str]:
        return [e["type"] for e in self.events()]

    def sent(self) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.client_events]

    def errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["type"] == "error"]

    async def wait_for(self, kind: str, start: int = 0, timeout: float = 20.0, **fields: Any) -> int:
        """Index of the first server event of type ``kind`` at or after ``start`` whose top-level
        fields (and ``response.status`` given as ``status``) match."""
        deadline = asyncio.get_running_loop().time() + timeout
        checked = start
        while True:
            while checked < len(self.server_events):
                event = json.loads(self.server_events[checked])
                if event["type"] == kind and _matches(event, fields):
                    return checked
                checked += 1
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"no {kind} {fields or ''} after event {start}: {self.types()[start:]}")
            await asyncio.sleep(0.02)

    def event(self, index: int) -> dict[str, Any]:
        return json.loads(self.server_events[index])

    def validate_all(self) -> None:
        """Every server event parses strictly as the openai SDK's GA model for its type."""
        for raw in self.server_events:
            validate(raw)


def _matches(event: dict[str, Any], fields: dict[str, Any]) -> bool:
    for key, want in fields.items():
        got = event.get("response", {}).get("status") if key == "status" else event.get(key)
        if got != want:
            return False
    return True
