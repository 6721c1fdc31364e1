"""Ephemeral client secrets: minted with the openai SDK, accepted wherever a key is, never minting more."""

from __future__ import annotations

import json
import logging
import os
import struct
import time
import zlib

import httpx
import msgspec
import pytest
import websockets
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from openai import AsyncOpenAI, AuthenticationError, BadRequestError

from realtime_gw.protocols import realtime as rt
from realtime_gw.server.auth import Access
from realtime_gw.server.client_secrets import ClientSecret, ClientSecrets, SecretTooLarge, key_id
from realtime_gw.server.log_hygiene import redact
from realtime_gw.testing.gateway import LiveServer
from tests.server.sealed_secrets import blob_of as _blob
from tests.server.sealed_secrets import value_of as _value


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


def _readable(blob: bytes) -> list[bytes]:
    """The bytes as they are, and whatever inflates from any offset (zlib, raw deflate or gzip)."""
    found = [blob]
    for start in range(len(blob)):
        for wbits in (15, -15, 31):
            try:
                found.append(zlib.decompressobj(wbits).decompress(blob[start:], 1 << 20))
            except zlib.error:
                continue
    return found


MCP_KEY = "mcp-api-key-7f3a9c2e51d04b86"
OAUTH = "oauth-access-token-b41d07e9c3"
PROMPT = "You are the concierge of Hotel Miramar; the staff door code is 4417."
CONFIDENTIAL = rt.SessionParams(
    type="realtime",
    instructions=PROMPT,
    tools=[
        {
            "type": "mcp",
            "server_label": "crm",
            "server_url": "https://crm.example/mcp",
            "headers": {"X-Api-Key": MCP_KEY},
            "authorization": OAUTH,
            "require_approval": "never",
        }
    ],
)


def test_the_holder_cannot_read_the_config_a_secret_carries() -> None:
    sealer = ClientSecrets(KEY)
    value, record = sealer.mint("key-one", 60, CONFIDENTIAL)
    needles = [n.encode() for n in (MCP_KEY, OAUTH, PROMPT, "Miramar", "crm.example", "key-one")]
    readable = _readable(_blob(value))
    for needle in needles:
        assert needle not in value.encode() and not any(needle in r for r in readable), needle
    # the check sees through compression: the same config merely deflated is caught
    deflated = _readable(b"\x01" + zlib.compress(msgspec.json.encode(CONFIDENTIAL), 9))
    assert all(any(needle in r for r in deflated) for needle in needles[:5])
    # a fresh nonce per secret: the same config twice gives two unrelated values, both good
    again, _ = sealer.mint("key-one", 60, CONFIDENTIAL, now=time.time())
    assert again != value and _blob(again)[17:29] != _blob(value)[17:29]
    assert sealer.find(value, ["key-one"]) == sealer.find(again, ["key-one"]) == record
    assert sealer.find(value, ["key-one"]).session.tools[0]["headers"] == {"X-Api-Key": MCP_KEY}  # type: ignore[union-attr,index]
    assert MCP_KEY not in repr(record) and "key-one" not in repr(record)
    assert CONFIDENTIAL.tools[0]["headers"] == {"X-Api-Key": MCP_KEY}  # type: ignore[index]  # not taken from it


def test_text_mixed_into_a_config_cannot_probe_its_credentials_through_the_length() -> None:
    """CRIME/BREACH: were the credentials compressed with the rest, an app's user whose text lands in
    the instructions could learn them from how short the secret gets when a guess is right."""
    sealer = ClientSecrets(KEY)
    right, wrong = MCP_KEY, MCP_KEY[:12] + MCP_KEY[12:][::-1]  # same characters, same length

    def typed(guess: str) -> rt.SessionParams:
        return msgspec.structs.replace(CONFIDENTIAL, instructions="The caller's note: " + guess)

    assert len(zlib.compress(msgspec.json.encode(typed(right)))) < len(zlib.compress(msgspec.json.encode(typed(wrong))))
    assert len(sealer.mint("", 60, typed(right))[0]) == len(sealer.mint("", 60, typed(wrong))[0])


def test_a_secret_changed_anywhere_is_refused() -> None:
    sealer = ClientSecrets(KEY)
    value, _ = sealer.mint("", 60, SESSION, now=1000.0)
    blob = _blob(value)
    assert sealer.find(value, [""], now=1000.0) is not None
    for i in range(len(blob)):  # version, key id, expiry, nonce, ciphertext, tag: any bit of any byte
        for bit in (0x01, 0x80):
            changed = blob[:i] + bytes([blob[i] ^ bit]) + blob[i + 1 :]
            assert sealer.find(_value(changed), [""], now=1000.0) is None, (i, bit)
    for i in range(3, len(value)):  # any character, base64's spare bits included
        changed = value[:i] + ("A" if value[i] != "A" else "B") + value[i + 1 :]
        assert sealer.find(changed, [""], now=1000.0) is None, i
    for cut in (blob[:-1], blob[:45], blob[:17], blob + b"\0", b"\x01" + blob[1:], b"\x02" + blob[1:]):  # old formats too
        assert sealer.find(_value(cut), [""], now=1000.0) is None
    for bad in (None, "", "ek_", "ek_!!!", "key-one", "ek_" + "A" * 9000, value + "AAAA", value + "="):
        assert sealer.find(bad, [""], now=1000.0) is None


def test_an_expiry_moved_or_swapped_is_refused() -> None:
    sealer = ClientSecrets(KEY)
    short, _ = sealer.mint("", 60, SESSION, now=1000.0)
    long, _ = sealer.mint("", 7200, SESSION, now=1000.0)
    assert sealer.find(short, [""], now=1059.0) is not None
    assert sealer.find(short, [""], now=1060.0) is None  # expired
    assert sealer.find(long, [""], now=1060.0) is not None
    # the long one's expiry on the short one (and back): the associated data no longer matches
    a, b = _blob(short), _blob(long)
    assert sealer.find(_value(b[:17] + a[17:]), [""], now=1000.0) is None
    assert sealer.find(_value(a[:17] + b[17:]), [""], now=1000.0) is None
    later = a[:9] + struct.pack(">Q", struct.unpack(">Q", a[9:17])[0] + 3600) + a[17:]
    assert sealer.find(_value(later), [""], now=1100.0) is None


def test_only_the_same_key_opens_a_secret() -> None:
    value, _ = ClientSecrets(KEY).mint("", 60, SESSION)
    assert ClientSecrets(KEY).find(value, [""]) is not None
    for other in (ClientSecrets(KEY + "!"), ClientSecrets("another key of the same length!"), ClientSecrets()):
        assert other.find(value, [""]) is None
    one, two = ClientSecrets(), ClientSecrets()  # random keys: each process its own
    assert two.find(one.mint("", 60, None)[0], [""]) is None


def _hkdf(key: str, info: bytes, length: int = 32) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(key.encode())


def _cipher_by_hand(key: str, version: int = 3) -> AESGCM:
    """The documented format's cipher, built with ``cryptography`` alone (as a holder of the key could)."""
    return AESGCM(_hkdf(key, b"realtime-gw client secrets v%d: AES-256-GCM key" % version))


def _seal_by_hand(key: str, expires_at: int, payload: list[object]) -> str:
    """Version, key id and expiry in the clear, as associated data; a random nonce; the sealed msgpack payload."""
    id_of_key = _hkdf(key, b"realtime-gw client secrets v3: key id", 8)
    header, nonce = b"\x03" + id_of_key + struct.pack(">Q", expires_at), os.urandom(12)
    return _value(header + nonce + _cipher_by_hand(key).encrypt(nonce, msgspec.msgpack.encode(payload), header))


def _open_by_hand(key: str, value: str) -> list[object]:
    blob = _blob(value)
    return msgspec.msgpack.decode(_cipher_by_hand(key).decrypt(blob[17:29], blob[29:], blob[:17]))


def test_the_format_is_the_documented_one_and_bounded_even_with_a_leaked_key() -> None:
    sealer = ClientSecrets(KEY)
    value, record = sealer.mint("", 60, CONFIDENTIAL, now=1000.0)
    assert _blob(value)[:9] == b"\x03" + key_id(KEY) and key_id(KEY) == _hkdf(KEY, b"realtime-gw client secrets v3: key id", 8)
    tag, compressed, credentials = _open_by_hand(KEY, value)
    assert credentials == {0: {"headers": {"X-Api-Key": MCP_KEY}, "authorization": OAUTH}}
    assert MCP_KEY.encode() not in zlib.decompress(compressed)  # type: ignore[arg-type]
    config = zlib.compress(msgspec.json.encode({"type": "realtime", "instructions": PROMPT}))
    made = _seal_by_hand(KEY, 1060, [tag, config, {}])
    expected = ClientSecret("", 1060, rt.SessionParams(type="realtime", instructions=PROMPT))
    assert sealer.find(made, [""], now=1000.0) == expected
    assert sealer.find(value, [""], now=1000.0) == record
    # what only a leaked key could make: still refused, not a crash nor a 256 MiB inflation
    bomb = zlib.compress(b" " * (4 << 20), 9)
    for payload in (
        [tag, bomb, {}],  # inflates past the bound
        [tag, config, {3: {"headers": {"a": "b"}}}],  # credentials of a tool the config lacks
        [tag, b"not zlib", {}],
        [tag, config[:-4], {}],  # a stream cut short
        [tag, zlib.compress(b'{"type": "realtime", "instructions": 7}'), {}],  # not a valid session config
        ["not a payload"],
    ):
        assert sealer.find(_seal_by_hand(KEY, 1060, payload), [""], now=1000.0) is None, payload
    # the format before key ids (version 2: version and expiry as associated data), even with the same key
    header, nonce = b"\x02" + struct.pack(">Q", 1060), os.urandom(12)
    sealed = _cipher_by_hand(KEY, version=2).encrypt(nonce, msgspec.msgpack.encode([tag, config, {}]), header)
    assert sealer.find(_value(header + nonce + sealed), [""], now=1000.0) is None


def test_a_config_too_large_to_present_is_refused_when_minting() -> None:
    huge = rt.SessionParams(type="realtime", instructions=os.urandom(6000).hex())
    with pytest.raises(SecretTooLarge, match="session.update"):
        ClientSecrets(KEY).mint("", 60, huge)
    with pytest.raises(ValueError, match="16 characters"):
        ClientSecrets("short")


def test_a_random_key_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="realtime_gw.server.client_secrets"):
        shared = ClientSecrets(KEY)
        shared.mint("", 60, None)
        assert not caplog.records  # a configured key: nothing to say
        alone = ClientSecrets()
        values = [alone.mint("", 60, None)[0] for _ in range(3)]
    assert len([r for r in caplog.records if "random key" in r.getMessage()]) == 1
    assert not any(v in caplog.text for v in values)  # and no secret in it


def test_secrets_never_reach_the_log() -> None:
    assert (
        redact('"POST /v1/realtime/calls HTTP/1.1" ek_AbC-12_x')
        == '"POST /v1/realtime/calls HTTP/1.1" ek_[redacted]'
    )
