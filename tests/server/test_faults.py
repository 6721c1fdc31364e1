"""Faults: a backend that raises, a worker thread that dies, a worker that hangs; a client that stops
reading; abrupt disconnects at every phase. The gateway answers, recovers and frees everything."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets

from realtime_gw.testing.gateway import LiveServer, start_server, stop_server

LONG = " ".join(["This sentence is spoken by a tone."] * 6)


async def connect(server: LiveServer, **kw: Any) -> Any:
    ws = await websockets.connect(server.ws + "/v1/realtime", **kw)
    assert json.loads(await ws.recv())["type"] == "session.created"
    await ws.send(
        json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
    )
    assert json.loads(await ws.recv())["type"] == "session.updated"
    return ws


async def turn(ws: Any, text: str = LONG) -> list[dict[str, Any]]:
    await ws.send(
        json.dumps(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": text}],
                },
            }
        )
    )
    await ws.send(json.dumps({"type": "response.create"}))
    events = []
    while True:
        ev = json.loads(await asyncio.wait_for(ws.recv(), 30))
        events.append(ev)
        if ev["type"] == "response.done":
            return events


async def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


@pytest.fixture(params=["raise@2", "die@2", "hang@2:30"])
def faulty_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, LiveServer]]:
    fault = request.param
    server = start_server(
        "--policy", "none", "--tts", "tone", "--no-cpu-backend-spare", "--audio-lead-ms", "0",
        "--worker-step-timeout-s", "1", "--fault-injection", json.dumps([f"tts:{fault}"]),
        name=f"fault-{fault.split('@')[0]}",
    )  # fmt: skip
    yield fault, server
    stop_server(server)


async def test_worker_fault_fails_the_response_and_the_worker_recovers(
    faulty_server: tuple[str, LiveServer],
) -> None:
    fault, server = faulty_server
    ws = await connect(server)
    events = await turn(ws)
    kinds = [e["type"] for e in events]
    assert "error" in kinds, kinds
    err = events[kinds.index("error")]["error"]
    assert err["type"] == "server_error" and err["code"] == "response_failed"
    assert events[-1]["response"]["status"] == "failed"
    assert kinds.count("response.done") == 1
    if not fault.startswith("raise"):
        assert server.metric("realtime_gw_worker_restarts_total", 'worker="tts-tone"') == 1
    # the same session, and a new one, work again within 5 s
    t0 = time.monotonic()
    again = await turn(ws, "Back to normal.")
    assert again[-1]["response"]["status"] == "completed"
    await ws.close()
    fresh = await connect(server)
    assert (await turn(fresh, "A new session."))[-1]["response"]["status"] == "completed"
    assert time.monotonic() - t0 < 5.0
    await fresh.close()


def test_a_speech_request_failing_before_any_audio_gets_an_error_status() -> None:
    """``POST /v1/audio/speech`` sends its status with the first audio: a stream that fails before any
    (the worker's first step raises) is a 500 with the reason, not a 200 with an empty body."""
    server = start_server(
        "--policy", "none", "--tts", "tone", "--no-cpu-backend-spare",
        "--fault-injection", json.dumps(["tts:raise@1"]), name="speech-fault",
    )  # fmt: skip
    try:
        url, headers = server.http + "/v1/audio/speech", {"Authorization": "Bearer test-key"}
        body = {"input": "Hello there.", "response_format": "wav"}
        failed = httpx.post(url, json=body, headers=headers, timeout=30)
        assert failed.status_code == 500, failed.status_code
        assert failed.json()["error"]["type"] == "server_error"
        ok = httpx.post(url, json=body, headers=headers, timeout=30)
        assert ok.status_code == 200 and ok.content[:4] == b"RIFF" and len(ok.content) > 44
    finally:
        stop_server(server)


@pytest.fixture
def tone_no_pacing() -> Iterator[LiveServer]:
    server = start_server(
        "--policy", "none", "--tts", "tone", "--audio-lead-ms", "0", "--send-timeout-s", "1",
        "--no-cpu-backend-spare", name="stall",
    )  # fmt: skip
    yield server
    stop_server(server)


def _masked_text_frame(text: str) -> bytes:
    payload = text.encode()
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        header = bytes([0x81, 0x80 | n])
    elif n < 65536:
        header = bytes([0x81, 0x80 | 126]) + n.to_bytes(2, "big")
    else:
        header = bytes([0x81, 0x80 | 127]) + n.to_bytes(8, "big")
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def test_client_that_stops_reading_is_closed_and_freed(tone_no_pacing: LiveServer) -> None:
    """A raw client with a tiny receive buffer that never reads after the handshake: the server's
    socket writes block, it closes the session (1008) and frees it instead of buffering forever."""
    server = tone_no_pacing
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert b" 101 " in head.split(b"\r\n")[0]
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": LONG * 40}]}
    sock.sendall(_masked_text_frame(json.dumps({"type": "conversation.item.create", "item": item})))
    sock.sendall(_masked_text_frame(json.dumps({"type": "response.create"})))
    deadline = time.monotonic() + 20
    while server.metric("realtime_gw_sessions", 'kind="realtime"') > 0:
        assert time.monotonic() < deadline, "a client that stops reading must be dropped"
        time.sleep(0.2)
    assert server.metric("realtime_gw_worker_active_requests", 'worker="tts-tone"') == 0
    sock.close()


async def _abort(ws: Any) -> None:
    ws.transport.abort()  # no close frame: the TCP connection just goes away
    await asyncio.sleep(0)


async def test_abrupt_disconnects_at_every_phase_free_all_state(voice_server: LiveServer) -> None:
    headers = {"Authorization": "Bearer test-key"}
    url = voice_server.ws + "/v1/realtime"
    speech = base64.b64encode(b"\x10\x00" * 24000).decode()

    async def before_created() -> None:
        ws = await websockets.connect(url, additional_headers=headers)
        await _abort(ws)

    async def mid_append() -> None:
        ws = await websockets.connect(url, additional_headers=headers)
        await ws.recv()
        for _ in range(5):
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": speech}))
        await _abort(ws)

    async def during_transcription() -> None:
        ws = await websockets.connect(url, additional_headers=headers)
        await ws.recv()
        await ws.send(
            json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
        )
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": speech}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send(json.dumps({"type": "response.create"}))
        await _abort(ws)

    async def mid_response() -> None:
        ws = await websockets.connect(url, additional_headers=headers)
        await ws.recv()
        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": LONG}],
                    },
                }
            )
        )
        await ws.send(json.dumps({"type": "response.create"}))
        while json.loads(await ws.recv())["type"] != "response.output_audio.delta":
            pass
        await _abort(ws)

    for phase in (before_created, mid_append, during_transcription, mid_response):
        await phase()
        await wait_until(
            lambda: (
                voice_server.metric("realtime_gw_sessions", 'kind="realtime"') == 0
                and voice_server.metric("realtime_gw_worker_active_requests") == 0
            ),
            5.0,
            f"state left behind after a disconnect {phase.__name__}",
        )


@pytest.fixture
def asr_spin_server() -> Iterator[LiveServer]:
    """ASR (pocketsphinx, in its child process) whose first decode holds the child's GIL in a busy loop
    for two minutes: the 6 s step deadline must kill it (not less: the next, real decode must fit in
    it on a shared 2-core box running other tests)."""
    server = start_server(
        "--policy", "none", "--tts", "tone", "--asr-slots", "1", "--worker-step-timeout-s", "6",
        "--fault-injection", json.dumps(["asr:spin@1:120"]), name="asr-spin",
    )  # fmt: skip
    yield server
    stop_server(server)


async def _transcribe(ws: Any, pcm: bytes) -> dict[str, Any]:
    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}))
    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    while True:
        ev = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if ev["type"].startswith("conversation.item.input_audio_transcription.") and ev["type"] != (
            "conversation.item.input_audio_transcription.delta"
        ):
            return ev  # type: ignore[no-any-return]


async def test_a_stuck_asr_step_is_killed_and_readyz_recovers_without_a_restart(
    asr_spin_server: LiveServer,
) -> None:
    server = asr_spin_server
    async with httpx.AsyncClient(base_url=server.http) as http:
        healthz: list[float] = []

        async def probe() -> None:  # the gateway answers while the child spins
            while True:
                t = time.monotonic()
                assert (await http.get("/healthz", timeout=10)).status_code == 200
                healthz.append(time.monotonic() - t)
                await asyncio.sleep(0.05)

        await wait_until(
            lambda: server.metric("realtime_gw_backend_spare_ready", 'worker="asr-pocketsphinx"') == 1,
            60.0,
            "the warm spare is prepared after the first warm-up",
        )
        prober = asyncio.create_task(probe())
        ws = await connect(server)
        transcribe = {"turn_detection": None, "transcription": {"model": "pocketsphinx"}}
        await ws.send(json.dumps({"type": "session.update", "session": {"audio": {"input": transcribe}}}))
        speech = b"\x10\x00\xf0\xff" * 12000  # 1 s at 24 kHz
        failed = await _transcribe(ws, speech)
        assert failed["type"] == "conversation.item.input_audio_transcription.failed", failed
        assert "exceeded 6 s" in failed["error"]["message"]
        t_failed = time.monotonic()
        saw_not_ready = False
        while (await http.get("/readyz")).status_code != 200:
            saw_not_ready = True
            assert time.monotonic() - t_failed < 5.0, "ASR worker not ready again within 5 s"
            await asyncio.sleep(0.05)
        prober.cancel()
        assert saw_not_ready  # the worker really went through a restart
        assert len(healthz) > 5 and max(healthz) < 1.0, healthz  # loose: the box is shared
        # the same session transcribes again: a fresh child, both decoders free
        done = await _transcribe(ws, speech)
        assert done["type"] == "conversation.item.input_audio_transcription.completed", done
        await ws.close()
    assert server.metric("realtime_gw_worker_restarts_total", 'worker="asr-pocketsphinx"') == 1
    await wait_until(
        lambda: server.metric("realtime_gw_worker_active_requests", 'worker="asr-pocketsphinx"') == 0,
        5.0,
        "slots",
    )
