"""Bounds before any handler runs (server/listener.py, the Host allowlist, log redaction), against a live
gateway: permessage-deflate not offered, an endless header cut off, sockets that never finish a request
closed, a cap on connections per client address, names that are not served refused, keys kept out of
the log."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
import websockets

from realtime_gw.testing.gateway import LiveServer, start_server, stop_server

HANDSHAKE_TIMEOUT_S = 1.5
PER_CLIENT = 6


@pytest.fixture(scope="module")
def guarded() -> Iterator[LiveServer]:
    server = start_server(
        "--policy", "none", "--tts", "tone", "--handshake-timeout-s", str(HANDSHAKE_TIMEOUT_S),
        "--max-connections-per-client", str(PER_CLIENT), "--max-header-bytes", "16384", "--max-frame-bytes", "65536",
        "--allowed-hosts", '["gw.example", "*.corp.example"]', name="guarded",
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
        name="deflate",
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
