"""The reading side of a ``/v1/realtime`` connection: client frames in, decoded events to the mailbox.

It reads only while there is room: not while the connection's outbox is above its input high-water
or too many events wait to be handled (``InputGate``), and not faster than the input audio budget
allows (``InputBudget``). A client that sends too fast is slowed by TCP backpressure, never refused.
Frames above ``OFFLOAD_DECODE_BYTES`` are decoded on a thread, in order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.websockets import WebSocketDisconnect

from realtime_gw.config import GatewayConfig
from realtime_gw.protocols import realtime as rt
from realtime_gw.server.limits import InputBudget, InputGate, Lifetime

OFFLOAD_DECODE_BYTES = 256 * 1024
"""Client frames above this (~0.25 ms of JSON/base64 here) are decoded on a thread, off the loop."""
MAX_PENDING_INPUT = 32
"""Client events read but not yet handled (see ``InputGate``)."""


class Channel(Protocol):
    """What moves a session's JSON events: a Starlette ``WebSocket``, or a call's data channel
    (``server/webrtc``) speaking the same ASGI-style messages."""

    async def receive(self) -> dict[str, Any]: ...

    async def send_text(self, data: str) -> None: ...

    async def close(self, code: int = 1000, reason: str | None = None) -> None: ...


@dataclass(slots=True)
class FromClient:
    """A client event in the mailbox (counted by the input gate until the session task takes it)."""

    event: Any


class ClientInput:
    def __init__(
        self,
        ws: Channel,
        config: GatewayConfig,
        mailbox: asyncio.Queue[Any],
        queued: Callable[[], int],
        decode: Callable[[str], Any] | None = None,
        audio_events: tuple[type, ...] = (rt.InputAudioBufferAppendEvent,),
        refusal: Callable[[str, str], Any] = lambda message, code: rt.error_event(message, code=code),
    ) -> None:
        self.ws = ws
        self.decode = decode or rt.decode_client_event
        """The protocol's decoder (realtime's by default): a client event, or the error event that
        explains why not."""
        self.audio_events = audio_events
        """Client events whose ``audio`` spends the input audio budget."""
        self.refusal = refusal
        """A frame refused before decoding (message, code), as the protocol's error event."""
        self.max_frame_bytes = config.max_frame_bytes
        self.mailbox = mailbox
        self.queued = queued
        """How many events wait in the connection's outbox."""
        self.gate = InputGate(config.outbound_queue_frames, MAX_PENDING_INPUT)
        self.wake = asyncio.Event()  # set when the gate may have opened (the reader re-checks)
        now = time.monotonic()
        self.audio_budget = InputBudget.for_audio(
            config.input_audio_rate_factor, config.input_audio_burst_s, now
        )
        self.lifetime = Lifetime(config.realtime_idle_timeout_s, config.realtime_max_session_s, now)

    def taken(self, item: FromClient) -> Any:
        """The session task took a client event: one fewer waits."""
        self.gate.pending -= 1
        self.wake.set()
        return item.event

    def outbox_drained(self) -> None:
        """The outbox shrank: wake the reader if that reopens the gate."""
        if self.gate.may_resume(self.queued()):
            self.wake.set()

    async def read(self) -> None:
        """Until the client leaves (returns; a broken socket too)."""
        try:
            while True:
                while self.gate.blocked(self.queued()):
                    self.wake.clear()
                    await self.wake.wait()
                msg = await self.ws.receive()
                self.lifetime.touch(time.monotonic())
                if msg["type"] == "websocket.disconnect":
                    return
                event = await self._decode(msg)
                if event is None:
                    continue
                self.gate.pending += 1
                await self.mailbox.put(FromClient(event))
                if isinstance(event, self.audio_events) and self.audio_budget is not None:
                    # Audio ahead of its allowed rate: stop reading until the budget refills.
                    wait = self.audio_budget.spend(len(event.audio), time.monotonic())
                    if wait > 0:
                        await asyncio.sleep(wait)
        except (WebSocketDisconnect, RuntimeError):
            return

    async def _decode(self, msg: dict[str, Any]) -> Any:
        data = msg.get("text")
        if data is None:
            if msg.get("bytes") is None:
                return None
            return self.refusal("Binary frames are not supported; send JSON text events", "invalid_frame")
        if len(data) > self.max_frame_bytes:
            # uvicorn's own cap is the largest of all sockets' limits; enforce ours here
            message = f"Message of {len(data)} bytes exceeds the limit of {self.max_frame_bytes}"
            return self.refusal(message, "message_too_large")
        if len(data) > OFFLOAD_DECODE_BYTES:
            # Awaited before the next receive, so events keep their order.
            return await asyncio.to_thread(self.decode, data)
        return self.decode(data)
