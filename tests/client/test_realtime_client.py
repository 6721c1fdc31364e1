"""RealtimeClient against a scripted fake server: playback.ack only when advertised, barge-in order and
position. (The real server's duplex mode with playback.ack is not there yet; these pin the client side.)"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from realtime_gw.client import RealtimeClient
from realtime_gw.client.protocol import user_text
from realtime_gw.protocols import realtime as rt
from realtime_gw.testing.gateway import LiveServer

FRAME_S = 0.08
FRAMES = 15  # 1.2 s of audio


def ev(type_: str, **fields: Any) -> str:
    return json.dumps({"type": type_, "event_id": "e", **fields})


@asynccontextmanager
async def fake_server(capabilities: dict[str, Any] | None) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """Answers response.create with FRAMES audio frames paced in real time; records client events."""
    received: list[dict[str, Any]] = []

    async def handler(ws: ServerConnection) -> None:
        session = {
            "id": "sess_fake",
            "object": "realtime.session",
            "type": "realtime",
            "capabilities": capabilities,
        }
        await ws.send(ev("session.created", session=session))
        speaker: asyncio.Task[None] | None = None
        async for raw in ws:
            msg = json.loads(raw)
            received.append(msg)
            if msg["type"] == "response.create":
                speaker = asyncio.create_task(speak(ws))
            elif msg["type"] == "response.cancel" and speaker is not None:
                speaker.cancel()
                await ws.send(ev("response.done", response={"id": "resp_1", "status": "cancelled"}))

    async def speak(ws: ServerConnection) -> None:
        ref = {"response_id": "resp_1", "item_id": "item_1", "output_index": 0, "content_index": 0}
        await ws.send(ev("response.created", response={"id": "resp_1", "status": "in_progress"}))
        item = {"id": "item_1", "type": "message", "role": "assistant", "content": []}
        await ws.send(ev("response.output_item.added", response_id="resp_1", output_index=0, item=item))
        pcm = base64.b64encode(b"\x10\x00" * 1920).decode()
        for seq in range(FRAMES):
            await ws.send(ev("response.output_audio.delta", **ref, delta=pcm, seq=seq))
            await asyncio.sleep(FRAME_S)
        await ws.send(ev("response.done", response={"id": "resp_1", "status": "completed"}))

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"ws://127.0.0.1:{port}/v1/realtime", received


async def test_playback_ack_follows_what_was_played_when_advertised() -> None:
    async with (
        fake_server({"supports_playback_ack": True}) as (url, received),
        RealtimeClient(url, prebuffer_ms=80, ack_interval_ms=100) as c,
    ):
        assert c.state.supports_playback_ack
        reply = await c.say("hello", timeout=10)
        await asyncio.sleep(0.5)  # let playback drain: the final ack follows the last sample heard
    acks = [m for m in received if m["type"] == "playback.ack"]
    assert acks and all(a["response_id"] == reply.id for a in acks)
    played = [a["played_ms"] for a in acks]
    assert played == sorted(played) and len(set(played)) == len(played), "monotonic, no repeats"
    assert played[-1] == pytest.approx(FRAMES * 80, abs=1), "the last ack is the whole reply"
    assert len(acks) >= 5, "acks arrive during playback, not only at the end"


async def test_no_playback_ack_unless_advertised() -> None:
    async with fake_server(None) as (url, received), RealtimeClient(url, prebuffer_ms=80) as c:
        await c.say("hello", timeout=10)
        await asyncio.sleep(0.3)
    assert not [m for m in received if m["type"] == "playback.ack"]


async def test_barge_in_cancels_then_truncates_at_the_played_position() -> None:
    async with (
        fake_server({"supports_playback_ack": True}) as (url, received),
        RealtimeClient(url, prebuffer_ms=80) as c,
    ):
        done = c.expect(lambda e: type(e).__name__ == "ResponseDoneEvent")
        await c.create_response()
        await asyncio.sleep(0.6)
        played = await c.barge_in()
        # Read before response.done: once done and played out, the client forgets the response.
        received_ms = c.jitter.received_ms("resp_1")
        await asyncio.wait_for(done, 5)
    assert played is not None and 200 <= played <= 600
    kinds = [m["type"] for m in received]
    cancel, truncate = kinds.index("response.cancel"), kinds.index("conversation.item.truncate")
    assert cancel < truncate
    t = received[truncate]
    assert (t["item_id"], t["content_index"], t["audio_end_ms"]) == ("item_1", 0, played)
    assert received[cancel]["response_id"] == "resp_1"
    assert played <= received_ms


async def test_duplex_session_against_the_live_server(voice_server: LiveServer) -> None:
    """The real server's duplex mode advertises playback.ack; acks and a barge-in raise no error."""
    async with RealtimeClient(voice_server.http, "test-key", duplex=True, ack_interval_ms=100) as c:
        assert c.state.supports_playback_ack
        await c.update_session({"audio": {"input": {"turn_detection": None}}})
        first = await c.say("Thank you very much.", timeout=60)
        assert first.status == "completed" and first.frames > 0
        started = c.expect(lambda e: isinstance(e, rt.ResponseAudioDeltaEvent) and e.seq >= 6)
        await c.send(user_text("I would like a cup of coffee. " * 4))
        await c.send(rt.ResponseCreateEvent())
        await asyncio.wait_for(started, 60)
        await asyncio.sleep(0.4)
        played = await c.barge_in()
        truncated = await c.wait_for(lambda e: isinstance(e, rt.ConversationItemTruncatedEvent), 10)
        await asyncio.sleep(0.5)
    assert played is not None and truncated.audio_end_ms == played
    assert c.state.last is not None and c.state.last.status == "cancelled"
    assert not c.state.errors, c.state.errors
