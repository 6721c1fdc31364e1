"""The speech socket's bounded outbox (a client that does not read is closed, nothing grows) and FLAC
encoded off the event loop. In process: a scripted socket and a tone TTS worker."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections.abc import AsyncIterator

import numpy as np
import pytest
import soundfile

from realtime_gw.config import GatewayConfig
from realtime_gw.protocols import speech as sp
from realtime_gw.records.voice import TtsRequest
from realtime_gw.server import speech
from realtime_gw.server.gateway import Gateway
from tests.server import fakes

LONG = " ".join(["This sentence is spoken by a tone."] * 20)


@pytest.fixture
async def tone_gateway(request: pytest.FixtureRequest) -> AsyncIterator[Gateway]:
    gw = fakes.gateway(request.param)
    await gw.workers.tts.start(warmup=False)
    yield gw
    await gw.workers.tts.stop()


async def _wait(predicate: object, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    "tone_gateway", [GatewayConfig(tts="tone", send_timeout_s=0.3, outbound_queue_frames=8)], indirect=True
)
async def test_a_client_that_stops_reading_is_closed_and_nothing_grows(tone_gateway: Gateway) -> None:
    ws = fakes.FakeSocket()
    ws.stalled = True
    stream = speech.SpeechStream(ws, tone_gateway)  # type: ignore[arg-type]
    ws.feed_text(json.dumps({"type": "input.text", "text": LONG}))
    ws.feed_text(json.dumps({"type": "input.done"}))
    run = asyncio.create_task(stream.run())
    most = 0
    while not run.done():
        most = max(most, stream.outbox.qsize())
        await asyncio.sleep(0.01)
    assert ws.closed == (1008, "client is not reading")
    assert most <= 8  # the TTS pump waited for room instead of queueing the whole utterance
    assert stream.stream is None or stream.stream.cancelled
    await _wait(lambda: not tone_gateway.workers.tts._active)  # the TTS slot came back


@pytest.mark.parametrize(
    "tone_gateway", [GatewayConfig(tts="tone", send_timeout_s=30.0, outbound_queue_frames=4)], indirect=True
)
async def test_a_full_outbox_closes_on_the_next_reply(tone_gateway: Gateway) -> None:
    ws = fakes.FakeSocket()
    ws.stalled = True
    stream = speech.SpeechStream(ws, tone_gateway)  # type: ignore[arg-type]
    run = asyncio.create_task(stream.run())
    ws.feed_text(json.dumps({"type": "input.text", "text": LONG}))
    await _wait(stream.outbox.full)  # audio filled it and waits for room
    ws.feed_text(json.dumps({"type": "input.text", "text": ""}))  # its error reply has no room
    await asyncio.wait_for(run, 5.0)
    assert ws.closed == (1008, "outbound queue full: the client is not reading")


@pytest.mark.parametrize("tone_gateway", [GatewayConfig(tts="tone")], indirect=True)
async def test_a_reading_client_gets_every_frame_then_done(tone_gateway: Gateway) -> None:
    ws = fakes.FakeSocket()
    stream = speech.SpeechStream(ws, tone_gateway)  # type: ignore[arg-type]
    ws.feed_text(json.dumps({"type": "input.text", "text": "Hello there."}))
    ws.feed_text(json.dumps({"type": "input.done"}))
    run = asyncio.create_task(stream.run())
    await _wait(lambda: any(isinstance(m, str) and "audio.done" in m for m in ws.sent))
    ws.feed_disconnect()
    await asyncio.wait_for(run, 5.0)
    done = json.loads(ws.sent[-1])
    frames = [m for m in ws.sent if isinstance(m, bytes)]
    assert done["type"] == "audio.done" and done["frames"] == len(frames) > 0
    assert ws.closed is None  # the client left; nothing to close


@pytest.mark.parametrize("tone_gateway", [GatewayConfig(tts="tone")], indirect=True)
async def test_flac_is_encoded_off_the_event_loop(tone_gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[threading.Thread] = []
    encode = sp.flac_bytes

    def spy(pcm16: bytes) -> bytes:
        threads.append(threading.current_thread())
        return encode(pcm16)

    monkeypatch.setattr(sp, "flac_bytes", spy)
    tts = tone_gateway.workers.tts.submit(TtsRequest(voice="tone"))
    tts.push("Hello there.")
    tts.close_input()
    body = b"".join([chunk async for chunk in speech._raw(tts, "flac")])
    audio, rate = soundfile.read(io.BytesIO(body), dtype="int16")
    assert rate == 24000 and np.abs(audio).max() > 0
    assert threads and threads[0] is not threading.main_thread()
