"""``/v1/realtime`` under pressure from its own client, live: bursts never close a client that reads
(backpressure instead of closing), audio far ahead of real time is slowed rather than refused while a
bystander keeps hearing its turn, and an idle session expires with a clear error."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import websockets

from realtime_gw.testing.gateway import LiveServer, start_server, stop_server

IDLE_S = 3.0
RATE_FACTOR = 10.0
BURST_S = 1.0


@pytest.fixture(scope="module")
def bounded() -> Iterator[LiveServer]:
    server = start_server(
        "--policy", "none", "--tts", "tone", "--max-conversation-items", "20000",
        "--realtime-idle-timeout-s", str(IDLE_S), "--input-audio-rate-factor", str(RATE_FACTOR),
        "--input-audio-burst-s", str(BURST_S), "--no-cpu-backend-spare", name="bounded",
    )  # fmt: skip
    yield server
    stop_server(server)


async def _session(server: LiveServer) -> Any:
    ws = await websockets.connect(server.ws + "/v1/realtime", max_size=None)
    assert json.loads(await ws.recv())["type"] == "session.created"
    await ws.send(
        json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
    )
    assert json.loads(await ws.recv())["type"] == "session.updated"
    return ws


def _item(text: str) -> str:
    content = [{"type": "input_text", "text": text}]
    return json.dumps(
        {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": content}}
    )


async def _read_until(ws: Any, done: Any, timeout: float = 60.0) -> Counter[str]:
    """Read events, counting their types, until ``done(counts)``."""
    counts: Counter[str] = Counter()
    async with asyncio.timeout(timeout):
        while not done(counts):
            event = json.loads(await ws.recv())
            counts[event["type"]] += 1
            if event["type"] == "error":
                counts["error:" + event["error"]["code"]] += 1
    return counts


async def _send_all(ws: Any, frames: list[str]) -> None:
    for frame in frames:
        await ws.send(frame)


async def test_ten_thousand_item_creates_do_not_close_a_reading_client(bounded: LiveServer) -> None:
    """Without the input gate this closed the client with 1008 'outbound queue full'."""
    ws = await _session(bounded)
    n = 10_000
    sender = asyncio.create_task(_send_all(ws, [_item(f"item {i}") for i in range(n)]))
    counts = await _read_until(ws, lambda c: c["conversation.item.done"] >= n)
    await sender
    assert counts["error"] == 0 and counts["conversation.item.added"] == n
    await ws.send(json.dumps({"type": "session.update", "session": {"instructions": "still here"}}))
    assert (await _read_until(ws, lambda c: c["session.updated"] >= 1))["session.updated"] == 1
    await ws.close()


async def test_create_cancel_pairs_do_not_close_a_reading_client(bounded: LiveServer) -> None:
    """1,000 pairs (without the input gate, this closed the client with 1008 'outbound queue full')."""
    ws = await _session(bounded)
    await ws.send(_item("Say something long enough to cancel."))
    n = 1000
    pairs = [json.dumps({"type": t}) for _ in range(n) for t in ("response.create", "response.cancel")]
    sender = asyncio.create_task(_send_all(ws, pairs))
    counts = await _read_until(ws, lambda c: c["response.done"] >= n)
    await sender
    assert counts["response.created"] == n and counts["error"] == 0
    await ws.close()


async def test_audio_far_ahead_of_real_time_is_slowed_not_refused(bounded: LiveServer) -> None:
    """20 s of audio pushed at once (100 ms frames, as fast as the socket takes them): the session
    reads it at RATE_FACTOR x real time after BURST_S, so the commit is answered no sooner than that
    allows, without an error; a bystander's turn meanwhile gets all its audio."""
    attacker, bystander = await _session(bounded), await _session(bounded)
    chunk = base64.b64encode(b"\0\0" * 2400).decode()  # 100 ms at 24 kHz
    audio_s = 20.0
    frames = [json.dumps({"type": "input_audio_buffer.append", "audio": chunk})] * int(audio_s * 10)
    started = time.monotonic()
    sender = asyncio.create_task(
        _send_all(attacker, [*frames, json.dumps({"type": "input_audio_buffer.commit"})])
    )
    await bystander.send(_item("Hello there, neighbour."))
    await bystander.send(json.dumps({"type": "response.create"}))
    heard = await _read_until(bystander, lambda c: c["response.done"] >= 1)
    assert heard["response.output_audio.delta"] > 0 and heard["error"] == 0
    counts = await _read_until(attacker, lambda c: c["input_audio_buffer.committed"] >= 1 or c["error"] > 0)
    elapsed = time.monotonic() - started
    await sender
    assert counts["error"] == 0
    assert elapsed >= (audio_s - BURST_S) / RATE_FACTOR * 0.9  # a lower bound the budget sets
    await attacker.close()
    await bystander.close()


async def test_an_idle_session_expires_with_an_error(bounded: LiveServer) -> None:
    ws = await _session(bounded)
    async with asyncio.timeout(IDLE_S + 5):
        event = json.loads(await ws.recv())
        assert event["type"] == "error" and event["error"]["code"] == "session_expired"
        assert "idle" in event["error"]["message"]
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
