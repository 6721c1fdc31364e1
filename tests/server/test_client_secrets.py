"""Ephemeral client secrets: minted with the openai SDK, accepted wherever a key is, never minting more."""

from __future__ import annotations

import base64
import json
import logging
import os
import time
import zlib
from pathlib import Path

import httpx
import msgspec
import pytest
import websockets
from openai import AsyncOpenAI, AuthenticationError, BadRequestError

from realtime_gw.protocols import realtime as rt
from realtime_gw.server.auth import Access
from realtime_gw.server.client_secrets import ClientSecret, ClientSecrets, SecretTooLarge, signing_key
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


KEY = "a shared signing key of the deployment"
SESSION = rt.SessionParams(type="realtime", instructions="Be brief.", output_modalities=["text"])


def _gateway(key: str | None, api_keys: list[str]) -> Access:
    """One gateway process's view of keys and secrets (what ``create_app`` builds from its config)."""
    return Access(api_keys, client_secrets=ClientSecrets(key))


def test_front_ends_with_the_same_key_accept_each_others_secrets() -> None:
    one, two = _gateway(KEY, ["key-one", "key-two"]), _gateway(KEY, ["key-one", "key-two"])
    value, record = one.client_secrets.mint("key-two", 60, SESSION)
    found = two.client_secret(value)
    assert value.startswith("ek_") and found == record == ClientSecret("key-two", record.expires_at, SESSION)
    assert two.identify(value, client_secret_ok=True) == "key-two"
    assert two.identify(value, client_secret_ok=False) is None  # realtime sessions only
    # a restart with the same key: still good; another key, or a random one: a bad key
    assert _gateway(KEY, ["key-one", "key-two"]).client_secret(value) == found
    assert _gateway(KEY + "!", ["key-one", "key-two"]).client_secret(value) is None
    assert _gateway(None, ["key-one", "key-two"]).client_secret(value) is None
    # the minting key taken out of the configuration takes its secrets with it
    assert _gateway(KEY, ["key-one"]).client_secret(value) is None


def test_a_tampered_expired_or_oversized_secret_is_refused() -> None:
    secrets_ = ClientSecrets(KEY)
    value, _ = secrets_.mint("", 60, SESSION, now=1000.0)
    assert secrets_.find(value, [""], now=1059.0) is not None
    assert secrets_.find(value, [""], now=1060.0) is None  # expired
    for i in range(3, len(value)):  # any character changed (the MAC, the payload): refused
        changed = value[:i] + ("A" if value[i] != "A" else "B") + value[i + 1 :]
        assert secrets_.find(changed, [""], now=1000.0) is None, i
    for bad in (None, "", "ek_", "ek_!!!", "key-one", "ek_" + "A" * 9000, value + "AAAA"):
        assert secrets_.find(bad, [""], now=1000.0) is None
    # a longer life written into the payload: the MAC no longer matches
    blob = base64.urlsafe_b64decode(value[3:] + "=" * (-len(value[3:]) % 4))
    payload = msgspec.msgpack.decode(zlib.decompress(blob[33:]))
    payload[0] += 3600
    forged = blob[:33] + zlib.compress(msgspec.msgpack.encode(payload))
    assert secrets_.find("ek_" + base64.urlsafe_b64encode(forged).decode().rstrip("="), [""], now=1000.0) is None
    # a config too large for a browser to present is refused when minting, with the way out
    huge = rt.SessionParams(type="realtime", instructions=os.urandom(6000).hex())
    with pytest.raises(SecretTooLarge, match="session.update"):
        secrets_.mint("", 60, huge)
    with pytest.raises(ValueError, match="16 characters"):
        ClientSecrets("short")


def test_a_random_signing_key_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="realtime_gw.server.client_secrets"):
        shared = ClientSecrets(KEY)
        shared.mint("", 60, None)
        assert not caplog.records  # a configured key: nothing to say
        alone = ClientSecrets()
        values = [alone.mint("", 60, None)[0] for _ in range(3)]
    assert len([r for r in caplog.records if "random key" in r.getMessage()]) == 1
    assert not any(v in caplog.text for v in values)  # and no secret in it


def test_the_signing_key_comes_from_its_setting_or_a_file(tmp_path: Path) -> None:
    assert signing_key(None, None) is None and signing_key(KEY, None) == KEY
    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    assert signing_key(None, str(path)) == KEY
    with pytest.raises(ValueError, match="not both"):
        signing_key(KEY, str(path))
    with pytest.raises(ValueError, match="cannot read"):
        signing_key(None, str(tmp_path / "missing"))


def test_secrets_never_reach_the_log() -> None:
    assert (
        redact('"POST /v1/realtime/calls HTTP/1.1" ek_AbC-12_x')
        == '"POST /v1/realtime/calls HTTP/1.1" ek_[redacted]'
    )
