"""Ephemeral client secrets (``ek_…``): minted by ``POST /v1/realtime/client_secrets``
(``client_secret_endpoint.py``), checked wherever a realtime session starts.

A browser or mobile app must not hold a deployment key; its backend mints a short-lived secret with
one and hands it over. The secret may start sessions (WebSocket or WebRTC call) until it expires;
sessions outlive it. It carries a session config, applied when each session starts.

Signed, not stored: a secret is ``ek_`` + base64url(version, HMAC-SHA256, zlib(expiry, owner tag,
session config)), the MAC over everything after it, keyed by ``webrtc_client_secret_key``. Any gateway
process with the same key accepts it (several front-ends, a restart); nothing is kept per secret. The
owner tag is an HMAC of the deployment key that minted it (never the key): its sessions count against
that key, and a key removed from the configuration takes its secrets with it. Without a configured
signing key each process draws a random one (and says so once: its secrets work on it alone).

The holder can read the config it carries (base64 and zlib, not encryption), as ``session.created``
would show it anyway; it cannot change it or the expiry. MACs are compared in constant time; a secret
longer than ``MAX_SECRET_CHARS`` (it must fit a WebSocket subprotocol header) is neither minted nor
read, and decompression is bounded. ``log_hygiene`` redacts ``ek_…`` values (all base64url) from logs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import secrets
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from realtime_gw.protocols import realtime as rt

log = logging.getLogger(__name__)

PREFIX = "ek_"
VERSION = b"\x01"
MAC_BYTES = 32
OWNER_TAG_BYTES = 16
MIN_KEY_CHARS = 16
MAX_SECRET_CHARS = 7000
"""The longest secret: browsers present it in the ``Sec-WebSocket-Protocol`` header, whose line the
WebSocket server reads up to 8 KiB. A session config that does not fit is refused at minting (set
the rest with ``session.update`` once connected)."""
MAX_PAYLOAD_BYTES = 256 * 1024
"""What a secret's compressed payload may inflate to (the mint body's own bound)."""


class SecretTooLarge(ValueError):
    """The session config makes the secret longer than ``MAX_SECRET_CHARS``."""


@dataclass(frozen=True, slots=True)
class ClientSecret:
    owner: str
    """The deployment key that minted it: its sessions count against that key's slots and rate."""
    expires_at: int
    """Wall clock (seconds since the epoch)."""
    session: rt.SessionParams | None
    """Applied to every session it starts, as a ``session.update`` before ``session.created``."""


class _Payload(msgspec.Struct, array_like=True):
    expires_at: int
    owner_tag: bytes
    session_json: bytes
    """The session config as JSON (b"" for none): decoded as a client's ``session.update`` is."""


_encode_payload = msgspec.msgpack.Encoder().encode
_decode_payload = msgspec.msgpack.Decoder(_Payload).decode
_decode_session = msgspec.json.Decoder(rt.SessionParams).decode


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ClientSecrets:
    """Mints and verifies secrets with one signing key. ``key``: the configured
    ``webrtc_client_secret_key`` (None: a random key for this process)."""

    def __init__(self, key: str | None = None) -> None:
        if key and len(key) < MIN_KEY_CHARS:
            raise ValueError(f"webrtc.client_secret_key must be at least {MIN_KEY_CHARS} characters")
        self.shared = bool(key)
        self._key = hashlib.sha256(b"realtime-gw client secrets\0" + key.encode()).digest() if key else secrets.token_bytes(32)
        self._warned = False

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._key, VERSION + body, hashlib.sha256).digest()

    def _owner_tag(self, owner: str) -> bytes:
        return hmac.new(self._key, b"owner\0" + owner.encode(), hashlib.sha256).digest()[:OWNER_TAG_BYTES]

    def mint(
        self, owner: str, seconds: int, session: rt.SessionParams | None, now: float | None = None
    ) -> tuple[str, ClientSecret]:
        """A new secret's value and what it stands for; ``SecretTooLarge`` if its config makes it too long."""
        if not self.shared and not self._warned:
            self._warned = True
            log.warning(
                "client secrets are signed with a random key of this process: other gateway processes and "
                "this one after a restart refuse them; set webrtc.client_secret_key (the same on every "
                "front-end) to share them"
            )
        expires_at = int(time.time() if now is None else now) + seconds
        session_json = msgspec.json.encode(session) if session is not None else b""
        body = zlib.compress(_encode_payload(_Payload(expires_at, self._owner_tag(owner), session_json)), 9)
        value = PREFIX + _b64encode(VERSION + self._mac(body) + body)
        if len(value) > MAX_SECRET_CHARS:
            raise SecretTooLarge(
                f"the session config makes the client secret {len(value)} characters long, over the "
                f"{MAX_SECRET_CHARS} a browser can present; set the rest with session.update once connected"
            )
        return value, ClientSecret(owner, expires_at, session)

    def find(self, value: str | None, owners: Sequence[str], now: float | None = None) -> ClientSecret | None:
        """What ``value`` stands for if it is a secret signed with this key, unexpired, minted by one of
        ``owners`` (the configured keys; [""] for an open gateway), else None."""
        if not value or not value.startswith(PREFIX) or len(value) > MAX_SECRET_CHARS:
            return None
        try:
            blob = _b64decode(value[len(PREFIX) :])
        except (binascii.Error, ValueError):
            return None
        version, mac, body = blob[:1], blob[1 : 1 + MAC_BYTES], blob[1 + MAC_BYTES :]
        if version != VERSION or not hmac.compare_digest(mac, self._mac(body)):
            return None
        try:  # signed by this key, so made here: still bounded, as a key may leak
            inflater = zlib.decompressobj()
            raw = inflater.decompress(body, MAX_PAYLOAD_BYTES)
            if inflater.unconsumed_tail:
                return None
            payload = _decode_payload(raw)
            session = _decode_session(payload.session_json) if payload.session_json else None
        except (zlib.error, msgspec.DecodeError, msgspec.ValidationError):
            return None
        if payload.expires_at <= (time.time() if now is None else now):
            return None
        owner = None
        for candidate in owners:  # every one compared: timing says nothing of which
            if hmac.compare_digest(payload.owner_tag, self._owner_tag(candidate)):
                owner = candidate
        return None if owner is None else ClientSecret(owner, payload.expires_at, session)


def signing_key(key: str | None, key_file: str | None) -> str | None:
    """The configured signing key: ``key``, else the first line of ``key_file`` (a mounted secret),
    else None. Raises ``ValueError`` naming the setting when both are set or the file is unreadable."""
    if key and key_file:
        raise ValueError("set webrtc.client_secret_key or webrtc.client_secret_key_file, not both")
    if not key_file:
        return key or None
    try:
        with open(key_file, encoding="utf-8") as f:
            return f.readline().strip() or None
    except OSError as e:
        raise ValueError(f"webrtc.client_secret_key_file: cannot read {key_file}: {e.strerror}") from None
