"""The ``oai-events`` data channel as the session's ``Channel``: the same JSON events as the WebSocket.

It speaks the ASGI-style messages ``ClientInput`` reads (``websocket.receive`` / ``.disconnect``), so
the one reading loop, session task and writer of ``realtime_ws`` serve the call unchanged. Events the
server sends before the channel opens wait for it (the writer blocks, so the outbox's own bounds and
backpressure apply); the writer waits while the channel's send buffer is above ``BUFFERED_HIGH``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiortc import RTCDataChannel

LABEL = "oai-events"
BUFFERED_HIGH = 1024 * 1024
"""Bytes queued in the data channel above which the writer waits (SCTP sends them at the link's pace)."""
BUFFERED_LOW = 256 * 1024
MAX_INBOX = 1024
"""Client messages received but not yet read; a peer that floods past it has its call ended."""
MAX_INBOX_BYTES = 16 * 1024 * 1024
"""The same bound in bytes: aiortc takes messages of any size, so the count alone would not bound memory."""
DEFAULT_MAX_MESSAGE_BYTES = 65536
"""RFC 8841's default when the offer names no ``a=max-message-size``."""


class EventChannel:
    def __init__(self, expect_channel: bool = True) -> None:
        self.expect_channel = expect_channel
        """False when the offer has no data channel: events have nowhere to go and are dropped."""
        self.channel: RTCDataChannel | None = None
        self.opened = asyncio.Event()
        self.drained = asyncio.Event()
        self.drained.set()
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.inbox_bytes = 0
        self.gone = False
        self.max_message_bytes = DEFAULT_MAX_MESSAGE_BYTES

    def attach(self, channel: RTCDataChannel, max_message_bytes: int | None) -> None:
        """The peer's ``oai-events`` channel arrived (aiortc announces it open)."""
        self.channel = channel
        if max_message_bytes:
            self.max_message_bytes = max_message_bytes
        channel.bufferedAmountLowThreshold = BUFFERED_LOW
        channel.on("message", self._received)
        channel.on("close", self.disconnected)
        channel.on("bufferedamountlow", self.drained.set)
        self.opened.set()

    def _received(self, message: str | bytes) -> None:
        self.inbox_bytes += len(message)
        if self.inbox.qsize() >= MAX_INBOX or self.inbox_bytes > MAX_INBOX_BYTES:
            self.disconnected()
            return
        if isinstance(message, str):
            self.inbox.put_nowait({"type": "websocket.receive", "text": message})
        else:
            self.inbox.put_nowait({"type": "websocket.receive", "bytes": message})

    def disconnected(self) -> None:
        """The channel or the whole call is gone: the reader ends, and with it the session."""
        if not self.gone:
            self.gone = True
            self.inbox.put_nowait({"type": "websocket.disconnect"})
            self.opened.set()  # a writer waiting for the channel to open gives up

    # -- the Channel protocol ----------------------------------------------------------------------------
    async def receive(self) -> dict[str, Any]:
        message = await self.inbox.get()
        self.inbox_bytes -= len(message.get("text") or message.get("bytes") or "")
        return message

    async def send_text(self, data: str) -> None:
        if not self.expect_channel:
            return
        await self.opened.wait()
        channel = self.channel
        if self.gone or channel is None or channel.readyState != "open":
            raise RuntimeError("the data channel is closed")
        while channel.bufferedAmount > BUFFERED_HIGH:
            self.drained.clear()
            await self.drained.wait()
            if self.gone:
                raise RuntimeError("the data channel is closed")
        try:
            channel.send(data)
        except Exception as e:  # aiortc raises InvalidStateError once closing
            raise RuntimeError(str(e)) from e

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        """The session ended: let what is buffered go out (briefly); the call then hangs up."""
        with contextlib.suppress(Exception):
            if self.channel is not None and self.channel.readyState == "open" and self.channel.bufferedAmount:
                self.drained.clear()
                await asyncio.wait_for(self.drained.wait(), 1.0)
