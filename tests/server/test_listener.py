"""Bounds before any handler runs (server/connections.py, the Host allowlist, log redaction), against a live
gateway: permessage-deflate not offered, an endless header cut off, sockets that never finish a request
closed, a cap on connections per client address, names that are not served refused, keys kept out of
the log; and (in process) the keepalive: a client held back by backpressure keeps its socket, a peer
that answers nothing is dropped."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
import websockets
import websockets.sync.client

from realtime_gw.config import GatewayConfig
from realtime_gw.server.connections import GuardedWebSocketProtocol, uvicorn_options
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server

HANDSHAKE_TIMEOUT_S = 1.5
PER_CLIENT = 6


@pytest.fixture(scope="module")
def guarded() -> Iterator[LiveServer]:
    server = start_server(
        "--policy", "none", "--tts", "tone", "--handshake-timeout-s", str(HANDSHAKE_TIMEOUT_S),
        "--max-connections-per-client", str(PER_CLIENT), "--max-header-bytes", "16384", "--max-frame-bytes", "65536",
        "--allowed-hosts", '["gw.example", "*.corp.example"]', "--no-cpu-backend-spare", "--no-warmup",
        name="guarded",
    )  # fmt: skip
    yield server
    stop_server(server)


def _raw(server: LiveServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server ends the connection (EOF or reset); fails after ``seconds``."""
    start = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"connection still open after {seconds} s")
    return time.monotonic() - start


async def test_permessage_deflate_is_not_offered(guarded: LiveServer) -> None:
    async with websockets.connect(guarded.ws + "/v1/realtime", compression="deflate") as ws:
        assert ws.response is not None and "Sec-WebSocket-Extensions" not in ws.response.headers
        assert json.loads(await ws.recv())["type"] == "session.created"


async def test_a_voice_socket_has_its_own_frame_cap(guarded: LiveServer) -> None:
    """uvicorn's one ws_max_size is the robot socket's (64 MiB here); the realtime socket refuses what
    is past its own 64 KiB + 1 MiB margin before buffering it, and answers smaller excess readably."""
    async with websockets.connect(guarded.ws + "/v1/realtime", max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "pad": "x" * 100_000}))
        error = json.loads(await ws.recv())
        assert error["type"] == "error" and error["error"]["code"] == "message_too_large"
        # The server may close (1009) while the frame is still being written: the send can raise too.
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.send("x" * (2 * 1024 * 1024))
            await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


async def test_deflate_when_turned_on_inflates_only_up_to_the_frame_cap() -> None:
    """With --ws-per-message-deflate, 2 MiB that compress to a few KiB are refused (1009) once they
    inflate past the socket's cap, not inflated to the end."""
    server = start_server(
        "--policy", "none", "--tts", "tone", "--ws-per-message-deflate", "--max-frame-bytes", "65536",
        "--no-cpu-backend-spare", "--no-warmup", name="deflate",
    )  # fmt: skip
    try:
        async with websockets.connect(server.ws + "/v1/realtime", compression="deflate") as ws:
            assert "permessage-deflate" in ws.response.headers.get("Sec-WebSocket-Extensions", "")  # type: ignore[union-attr]
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send("x" * (2 * 1024 * 1024))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    finally:
        stop_server(server)


def test_an_endless_header_is_cut_off(guarded: LiveServer) -> None:
    """32 MiB of one header: the server answers 400 (or hangs up) once 16 KiB are buffered, long before
    the header would end; the process does not grow by what was sent."""
    rss_before = _rss_kib(guarded)
    with _raw(guarded) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        refused = False
        try:
            for _ in range(512):
                sock.sendall(b"a" * 65536)
        except OSError:  # the server hung up mid-header
            refused = True
        if not refused:
            sock.settimeout(5)
            try:
                refused = sock.recv(64).startswith(b"HTTP/1.1 400")
            except ConnectionResetError:
                refused = True
        assert refused
    assert _rss_kib(guarded) - rss_before < 16 * 1024
    assert httpx.get(guarded.http + "/healthz").status_code == 200


def test_sockets_that_never_finish_a_request_are_closed(guarded: LiveServer) -> None:
    silent, partial, trickle = _raw(guarded), _raw(guarded), _raw(guarded)
    partial.sendall(b"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n")
    trickle.sendall(b"GET /healthz HTTP/1.1\r\n")
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S + 1
    while time.monotonic() < deadline:  # a byte every 0.1 s does not extend the deadline
        try:
            trickle.sendall(b"X")
        except OSError:
            break
        time.sleep(0.1)
    for sock in (silent, partial, trickle):
        with sock:
            _closed_within(sock, HANDSHAKE_TIMEOUT_S + 5)
    # A request that does finish in time is answered, and keep-alive requests get their own deadline.
    with httpx.Client() as client:
        for _ in range(3):
            assert client.get(guarded.http + "/healthz").status_code == 200


async def test_connections_per_client_address_are_capped(guarded: LiveServer) -> None:
    held = [_raw(guarded) for _ in range(PER_CLIENT)]
    try:
        time.sleep(0.2)  # the server has counted them
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(guarded.ws + "/v1/realtime"):
                pass
        assert refused.value.response.status_code == 429
        assert b"max_connections_per_client" in refused.value.response.body
        assert httpx.get(guarded.http + "/healthz").status_code == 429
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    async with websockets.connect(guarded.ws + "/v1/realtime") as ws:  # places came back
        assert json.loads(await ws.recv())["type"] == "session.created"


async def test_only_served_names_are_answered(guarded: LiveServer) -> None:
    port = guarded.port
    for host, status in (
        ("evil.example", 421), (f"evil.example:{port}", 421), ("gw.example", 200), (f"a.corp.example:{port}", 200),
        (f"localhost:{port}", 200), (f"127.0.0.1:{port}", 200), (f"[::1]:{port}", 200), ("10.1.2.3", 200),
    ):  # fmt: skip
        assert httpx.get(guarded.http + "/healthz", headers={"Host": host}).status_code == status, host
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(f"ws://evil.example:{port}/v1/realtime", host="127.0.0.1", port=port):
            pass
    assert refused.value.response.status_code == 421
    async with websockets.connect(f"ws://gw.example:{port}/v1/realtime", host="127.0.0.1", port=port) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"


async def test_origins_are_judged_by_the_served_names_not_the_host_header(guarded: LiveServer) -> None:
    port = guarded.port
    url = guarded.ws + "/v1/realtime"
    for origin in (
        f"http://127.0.0.1:{port}",
        "http://localhost:3000",
        "https://gw.example",
        "https://x.corp.example",
    ):
        async with websockets.connect(url, origin=origin) as ws:  # type: ignore[arg-type]
            assert json.loads(await ws.recv())["type"] == "session.created"
    # A rebinding page: its origin is the attacker's name, whatever Host the request carries.
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(url, origin=f"http://evil.example:{port}"):  # type: ignore[arg-type]
            pass
    assert refused.value.response.status_code == 403


async def test_keys_are_redacted_from_the_log(guarded: LiveServer) -> None:
    httpx.get(guarded.http + "/v1/models?api_key=sk-secret-one&x=1")
    async with websockets.connect(
        guarded.ws + "/v1/realtime?key=sk-secret-two",
        subprotocols=["realtime", "openai-insecure-api-key.sk-secret-three"],  # type: ignore[list-item]
    ) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
    time.sleep(0.2)
    logs = guarded.logs()
    assert "api_key=[redacted]&x=1" in logs and "key=[redacted]" in logs
    assert "sk-secret" not in logs


def _rss_kib(server: LiveServer) -> int:
    with open(f"/proc/{server.proc.pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


# -- keepalive under backpressure (in process, with short ping intervals) ---------------------------------
PING_S = 0.3


@pytest.fixture
async def keepalive_server() -> AsyncIterator[tuple[int, asyncio.Event]]:
    """uvicorn with the gateway's WebSocket protocol, pinging every ``PING_S`` with a ``PING_S``
    timeout, and an app that takes nothing from the socket until the event is set (backpressure),
    then echoes."""
    release = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "websocket"
        await receive()
        await send({"type": "websocket.accept"})
        await release.wait()
        while (message := await receive())["type"] == "websocket.receive":
            await send({"type": "websocket.send", "text": "got " + message["text"]})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    protocol = type("KeepaliveProtocol", (GuardedWebSocketProtocol,), {})
    config = uvicorn.Config(
        app, ws=protocol, ws_ping_interval=PING_S, ws_ping_timeout=PING_S, lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    yield sock.getsockname()[1], release
    server.should_exit = True
    await asyncio.wait_for(task, 5.0)


def _handshake(port: int) -> socket.socket:
    """A WebSocket whose peer answers nothing (no pong, no read): a raw socket after the upgrade."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    assert sock.recv(4096).startswith(b"HTTP/1.1 101")
    return sock


async def test_a_client_held_back_by_backpressure_keeps_its_socket(
    keepalive_server: tuple[int, asyncio.Event],
) -> None:
    """The app takes nothing for 10 ping timeouts, so uvicorn reads nothing and the client's pongs
    (its library answers every ping) wait unread behind its message: the socket stays open, and
    once the app reads again the message and the pongs come in."""
    port, release = keepalive_server
    loop = asyncio.get_running_loop()

    def client() -> str:
        with websockets.sync.client.connect(f"ws://127.0.0.1:{port}/", ping_interval=None) as ws:
            ws.send("hello")
            time.sleep(10 * PING_S)
            loop.call_soon_threadsafe(release.set)
            reply = ws.recv(timeout=5)
            time.sleep(4 * PING_S)  # read again: the pongs flow, the keepalive goes on
            ws.send("again")
            return f"{reply}, {ws.recv(timeout=5)}"

    assert await asyncio.to_thread(client) == "got hello, got again"


async def test_a_peer_that_answers_nothing_is_dropped(keepalive_server: tuple[int, asyncio.Event]) -> None:
    port, release = keepalive_server
    release.set()  # the app reads: nothing holds the socket back
    with await asyncio.to_thread(_handshake, port) as sock:
        elapsed = await asyncio.to_thread(_closed_within, sock, 10 * PING_S)
    assert 2 * PING_S * 0.8 <= elapsed <= 2 * PING_S + 1.0  # one ping interval, then its timeout


def test_the_keepalive_is_the_usual_twenty_seconds() -> None:
    options = uvicorn_options(GatewayConfig())
    assert (options["ws_ping_interval"], options["ws_ping_timeout"]) == (20.0, 20.0)
