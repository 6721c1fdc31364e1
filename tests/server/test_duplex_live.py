"""A scripted duplex client against a live gateway: a microphone that streams continuously (silence
unless it is speaking), a player that acks what it has played, and speech over the assistant."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import websockets

from realtime_gw.testing.audio import synthesize
from realtime_gw.testing.gateway import LiveServer
from tests.event_wait import first_event
from tests.server.sdk_events import validate

CHUNK_MS = 80
BYTES_PER_MS = 48  # 24 kHz PCM16
LONG_TEXT = (
    "Please open the door for me. I would like a cup of coffee. Thank you very much for your help. "
    "My phone is on the table. We will meet at the station tomorrow morning. The weather is nice today."
)


STOP = synthesize("Hold on, please stop talking now.", 24000)
YEAH = synthesize("Yeah.", 24000)


class DuplexClient:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.events: list[tuple[float, Any]] = []
        self.frames: dict[str, list[float]] = {}  # response_id -> receive times of its audio frames
        self.first_frame_at: dict[str, float] = {}
        self.sentence_starts: dict[str, list[tuple[float, str]]] = {}  # response -> (start_ms, text)
        self.speech: bytearray = bytearray()
        self.acking: str | None = None
        self._new_event = asyncio.Event()

    async def run(self) -> None:
        async for raw in self.ws:
            ev = validate(raw)
            now = time.monotonic()
            self.events.append((now, ev))
            if ev.type == "response.output_audio.delta":
                frames = self.frames.setdefault(ev.response_id, [])
                self.first_frame_at.setdefault(ev.response_id, now)
                frames.append(now)
            elif ev.type == "response.output_audio_transcript.delta":
                received_ms = len(self.frames.get(ev.response_id, [])) * CHUNK_MS
                self.sentence_starts.setdefault(ev.response_id, []).append((received_ms, ev.delta.strip()))
            self._new_event.set()

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def microphone(self) -> None:
        """80 ms of audio every 80 ms: queued speech if any, else silence."""
        n = CHUNK_MS * BYTES_PER_MS
        next_at = time.monotonic()
        while True:
            chunk = bytes(self.speech[:n]).ljust(n, b"\x00")
            del self.speech[:n]
            await self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()})
            next_at += CHUNK_MS / 1000
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    def played_ms(self, response_id: str, now: float | None = None) -> float:
        """The player starts at the first frame and plays in real time, never past what arrived."""
        start = self.first_frame_at.get(response_id)
        if start is None:
            return 0.0
        now = time.monotonic() if now is None else now
        return min((now - start) * 1000, len(self.frames[response_id]) * CHUNK_MS)

    async def acker(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            if self.acking and self.acking in self.first_frame_at:
                played = int(self.played_ms(self.acking))
                await self.send({"type": "playback.ack", "response_id": self.acking, "played_ms": played})

    async def wait_for(self, pred: Callable[[Any], bool], timeout: float = 60.0, after: int = 0) -> Any:
        return await first_event(self.events, self._new_event, pred, timeout, after)

    def of_type(self, kind: str) -> list[Any]:
        return [ev for _, ev in self.events if ev.type == kind]

    def say(self, pcm: bytes) -> None:
        """Speak into the microphone (synthesize before: Piper would block the client's loop)."""
        self.speech += pcm


@asynccontextmanager
async def duplex_session(server: LiveServer, **session: Any) -> AsyncIterator[DuplexClient]:
    headers = {"Authorization": "Bearer test-key"}
    async with websockets.connect(server.ws + "/v1/realtime?duplex=1", additional_headers=headers) as ws:
        client = DuplexClient(ws)
        tasks = [asyncio.create_task(t) for t in (client.run(), client.microphone(), client.acker())]
        await client.wait_for(lambda e: e.type == "session.created")
        await client.send(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "audio": {
                        "input": {
                            "transcription": {"model": "pocketsphinx"},
                            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                        }
                    },
                    **session,
                },
            }
        )
        await client.wait_for(lambda e: e.type == "session.updated")
        try:
            yield client
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def start_text_response(client: DuplexClient, text: str) -> str:
    mark = len(client.events)
    await client.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
        }
    )
    await client.send({"type": "response.create"})
    created = await client.wait_for(lambda e: e.type == "response.created", after=mark)
    client.acking = created.response.id
    return created.response.id


async def wait_playing(client: DuplexClient, response_id: str, ms: float) -> None:
    await client.wait_for(lambda e: e.type == "response.output_audio.delta" and e.response_id == response_id)
    while client.played_ms(response_id) < ms:
        await asyncio.sleep(0.02)


def done_of(client: DuplexClient, response_id: str) -> Callable[[Any], bool]:
    return lambda e: e.type == "response.done" and e.response.id == response_id


async def test_barge_in_stops_audio_and_keeps_only_heard_words(voice_server: LiveServer) -> None:
    async with duplex_session(voice_server) as client:
        created = client.of_type("session.created")[0]
        assert created.session.model_extra["capabilities"]["supports_playback_ack"] is True
        first = await start_text_response(client, LONG_TEXT)
        await wait_playing(client, first, 1500)
        client.say(STOP)
        decision = await client.wait_for(lambda e: e.type == "overlap.decision")
        assert decision.decision == "barge_in"
        done = await client.wait_for(done_of(client, first))
        done_at = next(t for t, e in client.events if e is done)
        assert done.response.status == "cancelled"
        truncated = await client.wait_for(lambda e: e.type == "conversation.item.truncated")

        # The next response (the echo of the interruption) starts cleanly.
        second = await client.wait_for(lambda e: e.type == "response.created" and e.response.id != first)
        client.acking = second.response.id
        second_done = await client.wait_for(done_of(client, second.response.id), timeout=90)
        assert second_done.response.status == "completed"
        await client.send({"type": "conversation.item.retrieve", "item_id": truncated.item_id})
        kept = await client.wait_for(lambda e: e.type == "conversation.item.retrieved")

    # No audio of the cancelled response after its response.done.
    late = [t for t in client.frames[first] if t > done_at]
    assert len(late) <= 1
    # Truncated to what this client had played when the barge-in was decided (within a frame or two
    # of event latency), never past what it received.
    received_ms = len(client.frames[first]) * CHUNK_MS
    assert truncated.audio_end_ms <= received_ms
    decided_at = next(t for t, e in client.events if e is decision)
    assert abs(truncated.audio_end_ms - client.played_ms(first, decided_at)) <= 250
    # The kept transcript holds the sentences heard before audio_end_ms and none that started after.
    transcript = kept.item.content[0].transcript
    starts = client.sentence_starts[first]
    for i, (start_ms, sentence) in enumerate(starts):
        end_ms = starts[i + 1][0] if i + 1 < len(starts) else received_ms
        if end_ms <= truncated.audio_end_ms - CHUNK_MS * 2:
            assert sentence in transcript
        if start_ms >= truncated.audio_end_ms + CHUNK_MS * 2:
            assert sentence not in transcript
    assert transcript and transcript != LONG_TEXT
    # the second response's frames are numbered from 0 again
    deltas = [e for _, e in client.events if e.type == "response.output_audio.delta" and e.response_id == second.response.id]
    assert [d.model_extra["seq"] for d in deltas] == list(range(len(deltas)))


async def test_backchannel_is_dropped_and_response_continues(voice_server: LiveServer) -> None:
    async with duplex_session(voice_server) as client:
        rid = await start_text_response(client, "Please open the door for me. I would like a cup of coffee.")
        await wait_playing(client, rid, 800)
        client.say(YEAH)
        decision = await client.wait_for(lambda e: e.type == "overlap.decision")
        done = await client.wait_for(done_of(client, rid))
    assert decision.decision == "drop", decision
    assert done.response.status == "completed"
    assert not client.of_type("input_audio_buffer.committed"), "a backchannel is not a user turn"


async def test_speech_inside_echo_guard_does_not_interrupt(voice_server: LiveServer) -> None:
    async with duplex_session(voice_server, duplex={"echo_guard_ms": 5000}) as client:
        rid = await start_text_response(client, "Please open the door for me. I would like a cup of coffee.")
        await wait_playing(client, rid, 200)
        client.say(STOP)
        decision = await client.wait_for(lambda e: e.type == "overlap.decision")
        done = await client.wait_for(done_of(client, rid))
    assert decision.decision == "drop" and "echo" in decision.reason
    assert done.response.status == "completed"


async def test_ack_ledger_and_event_seq_over_three_turns(voice_server: LiveServer) -> None:
    async with duplex_session(voice_server) as client:
        for text in ("My phone is on the table.", "Thank you very much.", "We will meet tomorrow."):
            rid = await start_text_response(client, text)
            await client.wait_for(done_of(client, rid))
            # let the player finish so the last acks land
            while client.played_ms(rid) < len(client.frames[rid]) * CHUNK_MS:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
    acks = client.of_type("playback.acknowledged")
    assert len({a.response_id for a in acks}) == 3
    for rid in {a.response_id for a in acks}:
        played = [a.played_ms for a in acks if a.response_id == rid]
        assert played == sorted(played) and played[-1] > 0
    seqs = [e.model_extra["server_event_seq"] if hasattr(e, "model_extra") else e.server_event_seq for _, e in client.events]  # noqa: E501
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


async def test_duplex_bad_input_and_close(voice_server: LiveServer) -> None:
    async with duplex_session(voice_server, audio={"input": {"turn_detection": None}}) as client:
        mark = len(client.events)
        await client.send(
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            }
        )
        added = await client.wait_for(lambda e: e.type == "conversation.item.added", after=mark)
        await client.send(
            {"type": "conversation.item.truncate", "item_id": added.item.id, "content_index": 0, "audio_end_ms": 0}
        )
        err = await client.wait_for(lambda e: e.type == "error", after=mark)
        assert err.error.code == "invalid_item"
        mark = len(client.events)
        await client.send({"type": "playback.ack", "response_id": "resp_unknown", "played_ms": 10})
        err = await client.wait_for(lambda e: e.type == "error", after=mark)
        assert err.error.code == "unknown_response"
        rid = await start_text_response(client, "Thank you.")
        assert (await client.wait_for(done_of(client, rid))).response.status == "completed"
        await client.send({"type": "session.close"})
        closed = await client.wait_for(lambda e: e.type == "session.closed")
        assert closed.session_id
        await asyncio.wait_for(client.ws.wait_closed(), 5)
        assert client.ws.close_code == 1000
