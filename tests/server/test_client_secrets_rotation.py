"""Rotating the key that seals client secrets: the newest key seals, previous ones open until their secrets
expire, a key id picks the one key to try, and the key file is re-read on SIGHUP."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets
from openai import AsyncOpenAI

from realtime_gw.protocols import realtime as rt
from realtime_gw.server.client_secrets import (
    ClientSecret,
    ClientSecrets,
    _Key,
    configured_keys,
    key_id,
    reload_keys,
    reloading_on_hangup,
)
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.server.sealed_secrets import blob_of, value_of

OLD = "the key the fleet sealed with until today"
NEW = "the key the fleet seals with from today on"
SESSION = rt.SessionParams(type="realtime", instructions="Be brief.")


def test_the_new_key_seals_and_the_previous_one_still_opens() -> None:
    before = ClientSecrets(OLD)
    old_value, old_record = before.mint("key-one", 600, SESSION)
    # step 1, on every gateway: the new key opens, the old one still seals
    opening = ClientSecrets(OLD, [NEW])
    assert opening.find(old_value, ["key-one"]) == old_record
    # step 2: the new key seals, the old one only opens (its secrets keep their config and owner)
    rotated = ClientSecrets(NEW, [OLD])
    assert (
        rotated.find(old_value, ["key-one"])
        == old_record
        == ClientSecret("key-one", old_record.expires_at, SESSION)
    )
    new_value, new_record = rotated.mint("key-one", 600, SESSION)
    assert blob_of(new_value)[1:9] == key_id(NEW) and blob_of(old_value)[1:9] == key_id(OLD)
    # a gateway still at step 1 opens what step 2 seals: that is why step 1 comes first, everywhere
    assert opening.find(new_value, ["key-one"]) == new_record
    assert before.find(new_value, ["key-one"]) is None  # one that skipped step 1 would refuse it
    # step 3, after the longest expiry: the old key dropped takes its secrets with it
    dropped = ClientSecrets(NEW)
    assert dropped.find(old_value, ["key-one"]) is None
    assert dropped.find(new_value, ["key-one"]) == new_record
    # the owner is still checked with the key that opens: another deployment key's secret stays refused
    assert rotated.find(old_value, ["key-two"]) is None


def test_the_key_id_picks_the_one_key_tried_and_cannot_be_swapped() -> None:
    many = [f"a previous key of the deployment, number {i}" for i in range(50)]
    ring = ClientSecrets(NEW, [OLD, *many])
    value, record = ClientSecrets(OLD).mint("", 60, SESSION, now=1000.0)

    class Untouchable:
        def decrypt(self, *args: object, **kwargs: object) -> bytes:
            raise AssertionError("tried a key other than the one the secret names")

    for derived in list(ring._ring.by_id.values()):
        if derived.key_id != key_id(OLD):  # every other key fails the test if it is tried
            ring._ring.by_id[derived.key_id] = _Key(derived.key_id, Untouchable(), derived.owner_key)  # type: ignore[arg-type]
    assert ring.find(value, [""], now=1000.0) == record  # opened, and no other key was tried
    # another held key's id put on it: that key is tried, and the associated data no longer matches
    blob, honest = blob_of(value), ClientSecrets(NEW, [OLD, *many])
    for other in (NEW, many[7]):
        assert honest.find(value_of(blob[:1] + key_id(other) + blob[9:]), [""], now=1000.0) is None
    # an id no key here has: refused without trying any
    assert ring.find(value_of(blob[:1] + bytes(8) + blob[9:]), [""], now=1000.0) is None
    # the id is derived, one-way: no run of the key's bytes, and a key one character apart shares nothing
    assert key_id(OLD) not in OLD.encode() and key_id(OLD)[:2] != key_id(OLD + "!")[:2]


def test_key_settings_are_checked_at_start_without_naming_a_key() -> None:
    with pytest.raises(ValueError, match="set the key that seals new ones too"):
        ClientSecrets(None, [OLD])
    with pytest.raises(ValueError, match=r"previous client secret key 2 of 2 .* at least 16 characters") as e:
        ClientSecrets(NEW, [OLD, "too-short"])
    assert "too-short" not in str(e.value) and OLD not in str(e.value)
    with pytest.raises(ValueError, match="16 characters") as e:
        ClientSecrets("short-key", [OLD])
    assert "short-key" not in str(e.value)
    # listing the sealing key among the previous ones too (a half-finished edit) is harmless
    assert ClientSecrets(NEW, [NEW, OLD, OLD]).opening_keys == 2


def test_the_key_file_seals_with_its_first_line_and_opens_with_the_others(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    assert configured_keys(None, [], None) == (None, [])
    assert configured_keys(NEW, [OLD], None) == (NEW, [OLD])
    path.write_text(NEW + "\n")  # the one-key file of before: unchanged
    assert configured_keys(None, [], str(path)) == (NEW, [])
    path.write_text(f"\n{NEW}\n\n  {OLD}  \n")
    assert configured_keys(None, ["one more key of the fleet"], str(path)) == (
        NEW,
        [OLD, "one more key of the fleet"],
    )
    with pytest.raises(ValueError, match="not both"):
        configured_keys(NEW, [], str(path))
    with pytest.raises(ValueError, match="cannot read"):
        configured_keys(None, [], str(tmp_path / "missing"))
    path.write_bytes(b"\xff\xfe not text")
    with pytest.raises(ValueError, match="not UTF-8"):
        configured_keys(None, [], str(path))


def test_a_reload_swaps_the_keys_or_keeps_them(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "keys"
    path.write_text(OLD)
    secrets = ClientSecrets(*configured_keys(None, [], str(path)))
    old_value, _ = secrets.mint("", 600, None)
    with caplog.at_level(logging.INFO, logger="realtime_gw.server.client_secrets"):
        path.write_text(f"{NEW}\n{OLD}\n")
        assert reload_keys(secrets, [], str(path))
        assert blob_of(secrets.mint("", 600, None)[0])[1:9] == key_id(NEW)
        assert secrets.find(old_value, [""]) is not None
        for broken in ("", "\n\n", f"{NEW}\ntoo-short\n"):  # refused: the keys in use stay
            path.write_text(broken)
            assert not reload_keys(secrets, [], str(path))
        path.unlink()
        assert not reload_keys(secrets, [], str(path))
        assert secrets.find(old_value, [""]) is not None and secrets.opening_keys == 2
        path.write_text(NEW)
        assert reload_keys(secrets, [], str(path))
        assert secrets.find(old_value, [""]) is None
    said = caplog.text
    assert "reloaded" in said and "not reloaded" in said and "holds no key" in said
    assert OLD not in said and NEW not in said and "too-short" not in said



async def test_the_file_is_read_again_when_the_signal_is_first_taken(tmp_path: Path) -> None:
    """A SIGHUP while the app is built (models loading) is ignored, not taken: so the file is read again
    when the handler goes in, and what a rotation wrote meanwhile applies."""
    path = tmp_path / "keys"
    path.write_text(OLD)
    secrets = ClientSecrets(*configured_keys(None, [], str(path)))
    path.write_text(f"{NEW}\n{OLD}\n")  # rotated while the gateway loaded
    with reloading_on_hangup(secrets, [], str(path)):
        assert blob_of(secrets.mint("", 600, None)[0])[1:9] == key_id(NEW)
    assert signal.getsignal(signal.SIGHUP) in (signal.SIG_DFL, signal.default_int_handler)

# -- live: one gateway through a whole rotation, its key file rewritten and re-read on SIGHUP ----------
@pytest.fixture(scope="module")
def rotating_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Path]]:
    key_file = tmp_path_factory.mktemp("keys") / "client-secret-keys"
    key_file.write_text(OLD + "\n")
    server = start_server(
        "--policy", "none", "--tts", "tone", "--api-key", "test-key",
        "--webrtc-client-secret-key-file", str(key_file), "--no-warmup", "--no-cpu-backend-spare", name="rotating",
    )  # fmt: skip
    yield server, key_file
    stop_server(server)


async def _mint(server: LiveServer) -> str:
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key")
    return (await client.realtime.client_secrets.create()).value


async def _opens(server: LiveServer, secret: str) -> bool:
    """Whether the gateway starts a realtime session for ``secret``; else it refused it as any bad key
    (the socket's handshake as for a made-up secret, and 401 on the calls route)."""
    headers = {"Authorization": f"Bearer {secret}"}
    try:
        async with websockets.connect(server.ws + "/v1/realtime", additional_headers=headers) as ws:
            return json.loads(await ws.recv())["type"] == "session.created"
    except websockets.InvalidStatus as e:
        with pytest.raises(websockets.InvalidStatus) as made_up:
            async with websockets.connect(
                server.ws + "/v1/realtime", additional_headers={"Authorization": "Bearer ek_AAAA"}
            ):
                pass
        assert e.response.status_code == made_up.value.response.status_code
        offer = {**headers, "Content-Type": "application/sdp"}
        call = httpx.post(server.http + "/v1/realtime/calls", content=b"v=0\r\n", headers=offer)
        assert call.status_code == 401 and call.json()["error"]["code"] == "invalid_api_key"
        return False


async def _reload(server: LiveServer, key_file: Path, lines: list[str]) -> None:
    """Rewrite the key file, send SIGHUP, and wait until the gateway says it read it (or refused it)."""
    said = server.logs().count("client secret keys")
    key_file.write_text("\n".join(lines) + "\n")
    server.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while server.logs().count("client secret keys") == said:
        assert time.monotonic() < deadline, "the gateway did not read its key file again"
        await asyncio.sleep(0.02)


async def test_a_gateway_rotates_its_key_without_a_restart(rotating_server: tuple[LiveServer, Path]) -> None:
    server, key_file = rotating_server
    old_secret = await _mint(server)  # a gateway with the old key alone
    assert blob_of(old_secret)[1:9] == key_id(OLD)
    await _reload(server, key_file, [NEW, OLD])  # the new key seals, the old one opens
    new_secret = await _mint(server)
    assert blob_of(new_secret)[1:9] == key_id(NEW)
    assert await _opens(server, old_secret) and await _opens(server, new_secret)
    await _reload(server, key_file, [NEW])  # the old key dropped: its secret is a bad key
    assert not await _opens(server, old_secret) and await _opens(server, new_secret)
    # a key file that turned bad is logged and the keys in use stay; the gateway serves on
    await _reload(server, key_file, ["too-short"])
    assert "not reloaded" in server.logs()
    assert await _opens(server, new_secret) and blob_of(await _mint(server))[1:9] == key_id(NEW)
    logs = server.logs()
    assert OLD not in logs and NEW not in logs and "too-short" not in logs
