"""Ephemeral client secrets: minted with the openai SDK, accepted wherever a key is, never minting more."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import websockets
from openai import AsyncOpenAI, AuthenticationError, BadRequestError

from realtime_gw.server.client_secrets import ClientSecrets
from realtime_gw.server.log_hygiene import redact
from realtime_gw.testing.gateway import LiveServer


async def mint(server: LiveServer, **kwargs: object) -> str:
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key")
    created = await client.realtime.client_secrets.create(**kwargs)  # type: ignore[arg-type]
    assert created.value.startswith("ek_")
    return created.value


async def test_a_secret_carries_its_session_into_the_websocket(voice_server: LiveServer) -> None:
    client = AsyncOpenAI(base_url=voice_server.http + "/v1", api_key="test-key")
    created = await client.realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 60},
        session={"type": "realtime", "instructions": "Be brief.", "output_modalities": ["text"]},
    )
    assert created.session.type == "realtime" and created.session.instructions == "Be brief."

    assert time.time() + 50 < created.expires_at <= time.time() + 61
    url = voice_server.ws + "/v1/realtime"
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {created.value}"}) as ws:
        first = json.loads(await ws.recv())
        assert first["type"] == "session.created"
        assert first["session"]["instructions"] == "Be brief."
        assert first["session"]["output_modalities"] == ["text"]
    # the browser's way: the secret as a subprotocol
    protocols = ["realtime", f"openai-insecure-api-key.{created.value}"]
    async with websockets.connect(url, subprotocols=protocols) as ws:  # type: ignore[arg-type]
        assert json.loads(await ws.recv())["session"]["instructions"] == "Be brief."


async def test_refusals(voice_server: LiveServer) -> None:
    secret = await mint(voice_server)
    url = voice_server.http + "/v1/realtime/client_secrets"
    # a secret cannot mint secrets (it would outlive itself)
    refused = httpx.post(url, json={}, headers={"Authorization": f"Bearer {secret}"})
    assert refused.status_code == 401
    bad = AsyncOpenAI(base_url=voice_server.http + "/v1", api_key="wrong")
    with pytest.raises(AuthenticationError):
        await bad.realtime.client_secrets.create()
    good = AsyncOpenAI(base_url=voice_server.http + "/v1", api_key="test-key")
    with pytest.raises(BadRequestError, match="between 10 and 7200"):
        await good.realtime.client_secrets.create(expires_after={"anchor": "created_at", "seconds": 5})
    with pytest.raises(BadRequestError, match="voice"):
        await good.realtime.client_secrets.create(
            session={"type": "realtime", "audio": {"output": {"voice": "no-such-voice"}}}
        )
    with pytest.raises(BadRequestError, match="not allowed"):  # an MCP server off the allow-list
        await good.realtime.client_secrets.create(
            session={
                "type": "realtime",
                "tools": [{"type": "mcp", "server_label": "s", "server_url": "http://127.0.0.1:9/mcp"}],
            }
        )
    # a secret opens realtime sessions only: the HTTP audio API and the other sockets refuse it
    auth = {"Authorization": f"Bearer {secret}"}
    speech = httpx.post(
        voice_server.http + "/v1/audio/speech",
        json={"model": "tts-1", "input": "hi", "voice": "alloy"},
        headers=auth,
    )
    assert speech.status_code == 401
    assert httpx.get(voice_server.http + "/v1/audio/voices", headers=auth).status_code == 401
    with pytest.raises(websockets.InvalidStatus):
        async with websockets.connect(voice_server.ws + "/v1/audio/speech/stream", additional_headers=auth):
            pass
    # an unknown or made-up secret is a bad key, on the socket too
    with pytest.raises(websockets.InvalidStatus):
        async with websockets.connect(
            voice_server.ws + "/v1/realtime", additional_headers={"Authorization": "Bearer ek_madeup"}
        ):
            pass


def test_the_store_expires_bounds_and_keeps_no_value() -> None:
    store = ClientSecrets(max_live=2)
    minted = store.mint("key-one", 60, None, now=1000.0)
    assert minted is not None
    value, record = minted
    assert store.find(value, now=1059.0) == record and record.owner == "key-one"
    assert store.find(value, now=1060.0) is None  # expired: refused like a bad key
    assert store.find("ek_other", now=1000.0) is None and store.find("key-one", now=1000.0) is None
    assert value not in repr(store._live)  # held by digest only
    assert store.mint("k", 60, None, now=1000.0) is not None
    assert store.mint("k", 60, None, now=1000.0) is None  # two live: full
    assert store.mint("k", 60, None, now=1061.0) is not None  # the expired ones were swept


def test_secrets_never_reach_the_log() -> None:
    assert (
        redact('"POST /v1/realtime/calls HTTP/1.1" ek_AbC-12_x')
        == '"POST /v1/realtime/calls HTTP/1.1" ek_[redacted]'
    )
