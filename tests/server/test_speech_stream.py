"""The speech socket: a bounded outbox (a client that does not read is closed, nothing grows; one that
reads is never closed for a burst), a TTS slot only while a segment is spoken, text bounds, the idle
timeout; and FLAC encoded off the event loop. In process: a scripted socket and a tone TTS worker."""

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
from realtime_gw.protocols.text import segment_end
from realtime_gw.records.voice import FRAME_SAMPLES, TtsRequest
from realtime_gw.server import speech, speech_stream
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


def _events(ws: fakes.FakeSocket) -> list[dict[str, object]]:
    return [json.loads(m) for m in ws.sent if isinstance(m, str)]


async def _run_until(stream: speech_stream.SpeechStream, ws: fakes.FakeSocket, predicate: object) -> None:
    """Run ``stream`` until ``predicate`` holds, then the client leaves and the run ends."""
    run = asyncio.create_task(stream.run())
    await _wait(predicate)
    ws.feed_disconnect()
    await asyncio.wait_for(run, 5.0)


@pytest.mark.parametrize(
    "tone_gateway", [GatewayConfig(tts="tone", send_timeout_s=0.3, outbound_queue_frames=8)], indirect=True
)
async def test_a_client_that_stops_reading_is_closed_and_nothing_grows(tone_gateway: Gateway) -> None:
    ws = fakes.FakeSocket()
    ws.stalled = True
    stream = speech_stream.SpeechStream(ws, tone_gateway)  # type: ignore[arg-type]
    ws.feed_text(json.dumps({"type": "input.text", "text": LONG}))
    ws.feed_text(json.dumps({"type": "input.done"}))
    run = asyncio.create_task(stream.run())
    most = 0
    while not run.done():
        most = max(most, stream.outbox.qsize())
        await asyncio.sleep(0.01)
    assert ws.closed == (1008, "client is not reading")
    assert most <= 8  # the TTS pump waited for room instead of queueing the whole utterance
    assert stream.tts is None
    await _wait(lambda: not tone_gateway.workers.tts._active)  # the TTS slot came back


@pytest.mark.parametrize(
    "tone_gateway", [GatewayConfig(tts="tone", send_timeout_s=0.5, outbound_queue_frames=8)], indirect=True
)
async def test_a_burst_from_a_client_that_does_not_read_is_held_back_not_queued(
    tone_gateway: Gateway,
) -> None:
    """Bad events answered with errors: the reader stops at the input high-water, the outbox never
    passes its bound, and the close is the send timeout's (not 'queue full')."""
    ws = fakes.FakeSocket()
    ws.stalled = True
    stream = speech_stream.SpeechStream(ws, tone_gateway)  # type: ignore[arg-type]
    for _ in range(200):
        ws.feed_text(json.dumps({"type": "input.text", "text": ""}))
    run = asyncio.create_task(stream.run())
    most = 0
    while not run.done():
        most = max(most, stream.outbox.qsize())
        await asyncio.sleep(0.01)
    assert ws.closed == (1008, "client is not reading")
    assert most <= 8 and ws.incoming.qsize() > 150  # the rest was never read


@pytest.mark.parametrize("tone_gateway", [GatewayConfig(tts="tone", outbound_queue_frames=8)], indirect=True)
async def test_a_reading_client_gets_every_burst_reply(tone_gateway: Gateway) -> None:
    ws = fakes.FakeSocket()
    stream = speech_stream.SpeechStream(ws, tone_gateway)  # type: ignore[arg-type]
    for _ in range(500):
        ws.feed_text(json.dumps({"type": "input.text", "text": ""}))
    await _run_until(stream, ws, lambda: len(ws.sent) == 500)
    assert ws.closed is None and {e["code"] for e in _events(ws)} == {"invalid_value"}


@pytest.mark.parametrize("tone_gateway", [GatewayConfig(tts="tone")], indirect=True)
async def test_a_reading_client_gets_every_frame_then_done(tone_gateway: Gateway) -> None:
    ws = fakes.FakeSocket()
    stream = speech_stream.SpeechStream(ws, tone_gateway)  # type: ignore[arg-type]
    ws.feed_text(json.dumps({"type": "input.text", "text": "Hello there. "}))
    ws.feed_text(json.dumps({"type": "input.text", "text": "Two sentences, "}))
    ws.feed_text(json.dumps({"type": "input.text", "text": "three segments.\nAnd the rest"}))
    ws.feed_text(json.dumps({"type": "input.done"}))
    await _run_until(stream, ws, lambda: any(isinstance(m, str) and "audio.done" in m for m in ws.sent))
    done = json.loads(ws.sent[-1])
    frames = [m for m in ws.sent if isinstance(m, bytes)]
    assert done["type"] == "audio.done" and done["frames"] == len(frames) > 0
    assert done["text"] == "Hello there. Two sentences, three segments.\nAnd the rest"
    assert {len(f) for f in frames[:-1]} == {2 * FRAME_SAMPLES}  # segments joined into 80 ms frames
    assert ws.closed is None  # the client left; nothing to close


@pytest.mark.parametrize("tone_gateway", [GatewayConfig(tts="tone")], indirect=True)
async def test_a_tts_slot_is_held_only_while_a_segment_is_spoken(tone_gateway: Gateway) -> None:
    ws = fakes.FakeSocket()
    stream = speech_stream.SpeechStream(ws, tone_gateway)  # type: ignore[arg-type]
    run = asyncio.create_task(stream.run())
    ws.feed_text(json.dumps({"type": "input.text", "text": "Hello there. And then"}))
    await _wait(lambda: any(isinstance(m, bytes) for m in ws.sent))  # the first sentence is spoken
    await _wait(lambda: stream.tts is None and not tone_gateway.workers.tts._active)
    assert stream.session.pending == "And then"  # waits for the rest of its sentence without a slot
    ws.feed_text(json.dumps({"type": "input.done"}))
    await _wait(lambda: any(isinstance(m, str) and "audio.done" in m for m in ws.sent))
    assert not tone_gateway.workers.tts._active
    ws.feed_disconnect()
    await asyncio.wait_for(run, 5.0)


@pytest.mark.parametrize(
    "tone_gateway",
    [GatewayConfig(tts="tone", speech_max_pending_chars=50, speech_max_utterance_chars=120)],
    indirect=True,
)
async def test_text_bounds_are_clear_errors(tone_gateway: Gateway) -> None:
    ws = fakes.FakeSocket()
    stream = speech_stream.SpeechStream(ws, tone_gateway)  # type: ignore[arg-type]
    ws.feed_text(json.dumps({"type": "input.text", "text": "x" * 51}))  # one piece over the pending bound
    for _ in range(3):
        ws.feed_text(
            json.dumps({"type": "input.text", "text": "y " * 20})
        )  # 120 chars: the utterance's bound
    ws.feed_text(json.dumps({"type": "input.text", "text": "z"}))  # one more: over it
    ws.feed_text(json.dumps({"type": "input.done"}))
    await _run_until(stream, ws, lambda: any(e["type"] == "audio.done" for e in _events(ws)))
    errors = [e for e in _events(ws) if e["type"] == "error"]
    assert [e["code"] for e in errors] == ["string_above_max_length"] * 2
    assert "over the limit of 50" in str(errors[0]["message"]) and "exceed 120" in str(errors[1]["message"])
    assert [e for e in _events(ws) if e["type"] == "audio.done"][0]["text"] == "y " * 60


@pytest.mark.parametrize(
    "tone_gateway", [GatewayConfig(tts="tone", speech_idle_timeout_s=0.3)], indirect=True
)
async def test_an_idle_stream_expires(tone_gateway: Gateway) -> None:
    ws = fakes.FakeSocket()
    stream = speech_stream.SpeechStream(ws, tone_gateway)  # type: ignore[arg-type]
    ws.feed_text(json.dumps({"type": "input.text", "text": "Unfinished"}))
    await asyncio.wait_for(stream.run(), 5.0)
    assert _events(ws)[-1]["code"] == "session_expired"
    assert ws.closed is not None and ws.closed[0] == 1000 and "idle" in ws.closed[1]
    assert not tone_gateway.workers.tts._active


def test_segment_ends() -> None:
    assert segment_end("Hello there. And") == len("Hello there. ")
    assert segment_end("Pi is 3.14 and") == 0
    assert segment_end("One.\nTwo! Three?") == len("One.\nTwo! ")
    assert segment_end("word " * 100) == 500  # run-on text is cut at its last space
    assert segment_end('He said "no." Then') == len('He said "no." ')
    assert segment_end("." * 100_000 + " x", run_on=10**6) == 100_001  # linear, no backtracking


@pytest.mark.parametrize("tone_gateway", [GatewayConfig(tts="tone")], indirect=True)
async def test_flac_is_encoded_off_the_event_loop(
    tone_gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[threading.Thread] = []
    encode = sp.flac_bytes

    def spy(pcm16: bytes) -> bytes:
        threads.append(threading.current_thread())
        return encode(pcm16)

    monkeypatch.setattr(sp, "flac_bytes", spy)
    tts = tone_gateway.workers.tts.submit(TtsRequest(voice="tone"))
    tts.push("Hello there.")
    tts.close_input()
    body = b"".join([chunk async for chunk in speech._raw(speech._frames(tts), "flac")])
    audio, rate = soundfile.read(io.BytesIO(body), dtype="int16")
    assert rate == 24000 and np.abs(audio).max() > 0
    assert threads and threads[0] is not threading.main_thread()


@pytest.mark.parametrize("tone_gateway", [GatewayConfig(tts="tone")], indirect=True)
async def test_session_config_instructions_are_bounded_and_reach_the_tts_request(
    tone_gateway: Gateway,
) -> None:
    """Over-long ``instructions`` are an error naming the parameter and leave the session as it was;
    bounded ones reach every segment's ``TtsRequest`` (a backend without descriptions ignores them)."""
    worker = tone_gateway.workers.tts
    requests: list[TtsRequest] = []
    submit = worker.submit
    worker.submit = lambda request: requests.append(request) or submit(request)  # type: ignore[method-assign]
    ws = fakes.FakeSocket()
    stream = speech_stream.SpeechStream(ws, tone_gateway)  # type: ignore[arg-type]
    too_long = "x" * (sp.MAX_INSTRUCTIONS_CHARS + 1)
    ws.feed_text(json.dumps({"type": "session.config", "voice": "default", "instructions": too_long}))
    ws.feed_text(json.dumps({"type": "session.config", "instructions": "A warm, low voice"}))
    ws.feed_text(json.dumps({"type": "input.text", "text": "Hello there."}))
    ws.feed_text(json.dumps({"type": "input.done"}))
    await _run_until(stream, ws, lambda: any(e["type"] == "audio.done" for e in _events(ws)))
    errors = [e for e in _events(ws) if e["type"] == "error"]
    assert [(e["param"], e["message"]) for e in errors] == [
        ("instructions", f"instructions are longer than {sp.MAX_INSTRUCTIONS_CHARS} characters")
    ]
    assert requests and {r.instructions for r in requests} == {"A warm, low voice"}
    assert any(isinstance(m, bytes) for m in ws.sent)
