"""Keys (several, each with its own session slots), browser origins, and refusals on every endpoint."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
import websockets

from realtime_gw.testing.gateway import LiveServer, start_server, stop_server


@pytest.fixture(scope="module")
def secured() -> Iterator[LiveServer]:
    server = start_server(
        "--policy", "none", "--tts", "tone", "--api-keys", '["key-one", "key-two"]', "--max-sessions-per-key", "1",
        "--allowed-origins", '["https://app.example"]', "--no-cpu-backend-spare", "--no-warmup",
        name="secured",
    )  # fmt: skip
    yield server
    stop_server(server)


async def no_sessions(server: LiveServer) -> None:
    """Per-key slots come back when the server has seen the close; wait for that."""
    for _ in range(100):
        if server.metric("realtime_gw_sessions", 'kind="realtime"') == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("sessions were not released")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_per_key_session_limit(secured: LiveServer) -> None:
    url = secured.ws + "/v1/realtime"
    await no_sessions(secured)
    async with websockets.connect(url, additional_headers=auth("key-one")) as first:
        assert json.loads(await first.recv())["type"] == "session.created"
        async with websockets.connect(url, additional_headers=auth("key-one")) as second:
            err = json.loads(await second.recv())
            assert err["type"] == "error" and err["error"]["code"] == "session_limit_reached"
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await second.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        # another key has its own slots
        async with websockets.connect(url, additional_headers=auth("key-two")) as other:
            assert json.loads(await other.recv())["type"] == "session.created"


async def test_keys_are_checked_on_every_endpoint(secured: LiveServer) -> None:
    for path in ("/v1/realtime", "/v1/audio/speech/stream"):
        for headers in ({}, auth("wrong"), {"Authorization": "Basic key-one"}):
            with pytest.raises(websockets.InvalidStatus) as refused:
                async with websockets.connect(secured.ws + path, additional_headers=headers):
                    pass
            assert refused.value.response.status_code == 403
    assert httpx.post(secured.http + "/v1/audio/speech", json={"input": "hi"}).status_code == 401
    assert httpx.get(secured.http + "/v1/models", headers=auth("wrong")).status_code == 401
    assert httpx.get(secured.http + "/v1/models", headers=auth("key-two")).status_code == 200
    # health and metrics stay open for probes
    assert httpx.get(secured.http + "/healthz").status_code == 200


async def test_browser_subprotocol_key_and_origins(secured: LiveServer) -> None:
    url = secured.ws + "/v1/realtime"
    protocols = ["realtime", "openai-insecure-api-key.key-two"]
    for origin in ("https://app.example", f"http://127.0.0.1:{secured.port}"):
        await no_sessions(secured)
        async with websockets.connect(url, subprotocols=protocols, origin=origin) as ws:  # type: ignore[arg-type]
            assert ws.subprotocol == "realtime"
            assert json.loads(await ws.recv())["type"] == "session.created"
    with pytest.raises(websockets.InvalidStatus):
        async with websockets.connect(url, subprotocols=protocols, origin="https://evil.example"):  # type: ignore[arg-type]
            pass


async def test_session_start_rate_per_key() -> None:
    """Two starts per minute per key over every socket: the third gets `rate_limit_exceeded` (realtime)
    or HTTP 429 (OpenPI), and another key is not affected."""
    server = start_server(
        "--policy", "noop", "--tts", "tone", "--api-keys", '["key-one", "key-two"]',
        "--session-starts-per-key-per-min", "2", "--no-cpu-backend-spare", "--no-warmup", name="rate",
    )  # fmt: skip
    try:
        url = server.ws + "/v1/realtime"
        for _ in range(2):
            async with websockets.connect(url, additional_headers=auth("key-one")) as ws:
                assert json.loads(await ws.recv())["type"] == "session.created"
        async with websockets.connect(url, additional_headers=auth("key-one")) as third:
            err = json.loads(await third.recv())
            assert err["type"] == "error" and err["error"]["code"] == "rate_limit_exceeded"
            assert "per minute" in err["error"]["message"]
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await third.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(server.ws + "/", additional_headers={"Authorization": "Api-Key key-one"}):
                pass
        assert refused.value.response.status_code == 429
        async with websockets.connect(url, additional_headers=auth("key-two")) as other:
            assert json.loads(await other.recv())["type"] == "session.created"
    finally:
        stop_server(server)
