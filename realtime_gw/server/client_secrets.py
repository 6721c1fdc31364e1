"""Ephemeral client secrets (``ek_…``): minted by ``POST /v1/realtime/client_secrets``
(``client_secret_endpoint.py``), checked wherever a realtime session starts.

A browser or mobile app must not hold a deployment key; its backend mints a short-lived secret with
one and hands it over. The secret may start sessions (WebSocket or WebRTC call) until it expires;
sessions outlive it. It carries a session config, applied when each session starts.

Sealed, not stored: a secret is ``ek_`` + base64url(version, key id, expiry, nonce, AES-256-GCM(owner
tag, zlib(session config), its tools' credentials)). The holder (a browser) can neither read the config
(it may carry the app's MCP ``headers``/``authorization`` and its instructions, as OpenAI's opaque
secrets keep them) nor change it; the version byte, the key id and the expiry are in the clear and
bound as associated data, so none can be altered or swapped between secrets. Each configured key
yields, with HKDF-SHA256, one key per purpose (the cipher key, the owner-tag key) and its key id (8
bytes, one-way: it names the key without revealing it); each secret draws a random 96-bit nonce. Any
gateway process that holds the key accepts it (several front-ends, a restart); nothing is kept per
secret. The owner tag is an HMAC of the deployment key that minted it (never the key): its sessions
count against that key, and a key removed from the configuration takes its secrets with it. Without a
configured key each process draws a random one (and says so once: its secrets work on it alone).

Rotation: one key seals (the newest), earlier ones only open until their secrets have expired. The
key id picks the one key that opens a secret (one AES-GCM attempt, whatever the number of keys); a
secret whose key is no longer held is refused as any bad secret is. The key file may be re-read
without a restart (``reload_keys``, on SIGHUP), so a fleet rotates with no secret refused (the
procedure: docs/protocols.md).

Whatever fails (not base64url, a length or version that does not fit, a tag that does not verify, an
expiry passed, an owner no longer configured) is the same ``None``, hence the same 401. The GCM tag is
checked by OpenSSL in constant time, owner tags with ``hmac.compare_digest`` against every configured
key. A secret longer than ``MAX_SECRET_CHARS`` (it must fit a WebSocket subprotocol header) is neither
minted nor read, and decompression is bounded. The length of a secret follows the compressed size of its
config (encryption hides content, not length); the tools' credentials (MCP ``headers`` and
``authorization``) are kept out of the compressed part, so text an app mixes into a config cannot probe
them through that length, as CRIME and BREACH probed TLS. ``log_hygiene`` redacts ``ek_…`` values (all
base64url) from logs; neither keys nor configs are logged here.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import logging
import os
import signal
import struct
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from realtime_gw.protocols import realtime as rt

log = logging.getLogger(__name__)

PREFIX = "ek_"
VERSION = b"\x03"
"""The sealed format (1 was the signed, readable one; 2 the sealed one without a key id: both refused)."""
KEY_ID_BYTES = 8
_EXPIRY = struct.Struct(">Q")
HEADER_BYTES = len(VERSION) + KEY_ID_BYTES + _EXPIRY.size
"""Version, key id and expiry, in the clear and authenticated as the cipher's associated data."""
NONCE_BYTES = 12
TAG_BYTES = 16
OWNER_TAG_BYTES = 16
MIN_KEY_CHARS = 16
MAX_SECRET_CHARS = 7000
"""The longest secret: browsers present it in the ``Sec-WebSocket-Protocol`` header, whose line the
WebSocket server reads up to 8 KiB. A session config that does not fit is refused at minting (set
the rest with ``session.update`` once connected)."""
MAX_PAYLOAD_BYTES = 256 * 1024
"""What a secret's compressed session config may inflate to (the mint body's own bound)."""
_CIPHER_INFO = b"realtime-gw client secrets v3: AES-256-GCM key"
_OWNER_INFO = b"realtime-gw client secrets v3: owner tag key"
_KEY_ID_INFO = b"realtime-gw client secrets v3: key id"


class SecretTooLarge(ValueError):
    """The session config makes the secret longer than ``MAX_SECRET_CHARS``."""


@dataclass(frozen=True, slots=True)
class ClientSecret:
    owner: str = field(repr=False)
    """The deployment key that minted it: its sessions count against that key's slots and rate."""
    expires_at: int
    """Wall clock (seconds since the epoch)."""
    session: rt.SessionParams | None = field(repr=False)
    """Applied to every session it starts, as a ``session.update`` before ``session.created``."""


class _Payload(msgspec.Struct, array_like=True):
    owner_tag: bytes
    session_zlib: bytes
    """The session config as compressed JSON (b"" for none), less its tools' credentials."""
    credentials: dict[int, dict[str, Any]]
    """Tool index -> its ``CREDENTIAL_FIELDS``, not compressed."""


CREDENTIAL_FIELDS = ("headers", "authorization")
"""What a tool (an MCP server's) may hold that must not share a compression window with the rest."""


def _split_credentials(session: rt.SessionParams) -> tuple[bytes, dict[int, dict[str, Any]]]:
    """The config's JSON without its tools' credentials, and those credentials by tool index."""
    config = msgspec.to_builtins(session)
    credentials: dict[int, dict[str, Any]] = {}
    for index, tool in enumerate(config.get("tools") or []):
        if isinstance(tool, dict):
            held = {name: tool.pop(name) for name in CREDENTIAL_FIELDS if name in tool}
            if held:
                credentials[index] = held
    return msgspec.json.encode(config), credentials


def _join_credentials(config_json: bytes, credentials: dict[int, dict[str, Any]]) -> rt.SessionParams:
    """The config as minted, decoded as a client's ``session.update`` is; ``ValueError`` if the parts
    do not fit (they were sealed together, so only with a leaked key)."""
    if not credentials:
        return _decode_session(config_json)
    config = msgspec.json.decode(config_json)
    tools = config.get("tools") if isinstance(config, dict) else None
    for index, held in credentials.items():
        if not isinstance(tools, list) or not 0 <= index < len(tools) or not isinstance(tools[index], dict):
            raise ValueError("credentials of a tool the config does not have")
        tools[index].update(held)
    return _decode_session(msgspec.json.encode(config))


_encode_payload = msgspec.msgpack.Encoder().encode
_decode_payload = msgspec.msgpack.Decoder(_Payload).decode
_decode_session = msgspec.json.Decoder(rt.SessionParams).decode


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _derive(master: bytes, info: bytes, length: int = 32) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(master)


def key_id(key: str) -> bytes:
    """The id a key's secrets carry in the clear (HKDF of the key: it names the key, never reveals it)."""
    return _derive(key.encode(), _KEY_ID_INFO, KEY_ID_BYTES)


@dataclass(frozen=True, slots=True)
class _Key:
    """What one configured key seals or opens with."""

    key_id: bytes
    cipher: AESGCM = field(repr=False)
    owner_key: bytes = field(repr=False)

    @classmethod
    def derive(cls, master: bytes) -> _Key:
        return cls(
            _derive(master, _KEY_ID_INFO, KEY_ID_BYTES),
            AESGCM(_derive(master, _CIPHER_INFO)),
            _derive(master, _OWNER_INFO),
        )

    def owner_tag(self, owner: str) -> bytes:
        return hmac.new(self.owner_key, owner.encode(), hashlib.sha256).digest()[:OWNER_TAG_BYTES]


@dataclass(frozen=True, slots=True)
class _KeyRing:
    sealer: _Key
    """The newest key: every secret minted is sealed with it."""
    by_id: dict[bytes, _Key]
    """Every key that opens secrets (the sealer and the previous ones), by key id."""


def _key_ring(key: str | None, previous: Iterable[str]) -> _KeyRing:
    """The keys ``key`` seals and ``previous`` open with (None: a random sealing key); ``ValueError``
    (never naming a key) for a key too short or previous keys without a sealing one."""
    previous = list(previous)
    if key is None:
        if previous:
            raise ValueError(
                "previous client secret keys only open secrets: set the key that seals new ones too "
                "(webrtc.client_secret_key, or the first line of webrtc.client_secret_key_file)"
            )
        sealer = _Key.derive(os.urandom(32))
        return _KeyRing(sealer, {sealer.key_id: sealer})
    if len(key) < MIN_KEY_CHARS:
        raise ValueError(
            f"the client secret key (webrtc.client_secret_key, or the first line of its key file) must be at "
            f"least {MIN_KEY_CHARS} characters"
        )
    ring = _KeyRing(_Key.derive(key.encode()), {})
    ring.by_id[ring.sealer.key_id] = ring.sealer
    for index, old in enumerate(previous, 1):
        if len(old) < MIN_KEY_CHARS:
            raise ValueError(
                f"previous client secret key {index} of {len(previous)} (the key file's later lines, then "
                f"webrtc.client_secret_previous_keys) must be at least {MIN_KEY_CHARS} characters"
            )
        derived = _Key.derive(old.encode())
        ring.by_id.setdefault(derived.key_id, derived)  # a key listed twice opens as once (ids: 64 bits)
    return ring


class ClientSecrets:
    """Mints secrets with one key and opens them with that key and the previous ones. ``key``: the
    configured sealing key (None: a random key for this process); ``previous``: keys that only open."""

    def __init__(self, key: str | None = None, previous: Iterable[str] = ()) -> None:
        self._ring = _key_ring(key or None, previous)
        self.shared = bool(key)
        self._warned = False

    @property
    def opening_keys(self) -> int:
        """How many keys open secrets (the sealing one included)."""
        return len(self._ring.by_id)

    def rekey(self, key: str, previous: Iterable[str] = ()) -> None:
        """Seal with ``key`` from now on and open with it and ``previous``; on ``ValueError`` nothing changes.
        Secrets of a key no longer listed are refused from now on; sessions they started go on."""
        self._ring = _key_ring(key, previous)  # one assignment: a secret is opened with one ring or the other
        self.shared = True

    def mint(
        self, owner: str, seconds: int, session: rt.SessionParams | None, now: float | None = None
    ) -> tuple[str, ClientSecret]:
        """A new secret's value and what it stands for; ``SecretTooLarge`` if its config makes it too long."""
        if not self.shared and not self._warned:
            self._warned = True
            log.warning(
                "client secrets are sealed with a random key of this process: other gateway processes and "
                "this one after a restart refuse them; set webrtc.client_secret_key (the same on every "
                "front-end) to share them"
            )
        sealer = self._ring.sealer
        expires_at = int(time.time() if now is None else now) + seconds
        config_json, credentials = _split_credentials(session) if session is not None else (b"", {})
        config_zlib = zlib.compress(config_json, 9) if config_json else b""
        plain = _encode_payload(_Payload(sealer.owner_tag(owner), config_zlib, credentials))
        header = VERSION + sealer.key_id + _EXPIRY.pack(expires_at)
        nonce = os.urandom(NONCE_BYTES)
        value = PREFIX + _b64encode(header + nonce + sealer.cipher.encrypt(nonce, plain, header))
        if len(value) > MAX_SECRET_CHARS:
            raise SecretTooLarge(
                f"the session config makes the client secret {len(value)} characters long, over the "
                f"{MAX_SECRET_CHARS} a browser can present; set the rest with session.update once connected"
            )
        return value, ClientSecret(owner, expires_at, session)

    def find(self, value: str | None, owners: Sequence[str], now: float | None = None) -> ClientSecret | None:
        """What ``value`` stands for if it is a secret sealed with a key held here, unexpired, minted by
        one of ``owners`` (the configured keys; [""] for an open gateway), else None."""
        if not value or not value.startswith(PREFIX) or len(value) > MAX_SECRET_CHARS:
            return None
        text = value[len(PREFIX) :]
        try:
            blob = _b64decode(text)
        except (binascii.Error, ValueError):
            return None
        if _b64encode(blob) != text:  # one spelling per secret (base64's spare bits are not a second)
            return None
        if len(blob) < HEADER_BYTES + NONCE_BYTES + TAG_BYTES or blob[:1] != VERSION:
            return None
        key = self._ring.by_id.get(blob[len(VERSION) : len(VERSION) + KEY_ID_BYTES])
        if key is None:  # a key never held here or since removed
            return None
        nonce_end = HEADER_BYTES + NONCE_BYTES
        header, nonce, sealed = blob[:HEADER_BYTES], blob[HEADER_BYTES:nonce_end], blob[nonce_end:]
        try:
            plain = key.cipher.decrypt(nonce, sealed, header)
        except InvalidTag:
            return None
        (expires_at,) = _EXPIRY.unpack(header[-_EXPIRY.size :])
        try:  # sealed with this key, so made here: still bounded, as a key may leak
            payload = _decode_payload(plain)
            session = None
            if payload.session_zlib:
                inflater = zlib.decompressobj()
                config_json = inflater.decompress(payload.session_zlib, MAX_PAYLOAD_BYTES)
                if inflater.unconsumed_tail or not inflater.eof:  # over the bound, or cut short
                    return None
                session = _join_credentials(config_json, payload.credentials)
        except (zlib.error, ValueError):  # msgspec's DecodeError and ValidationError are ValueErrors
            return None
        if expires_at <= (time.time() if now is None else now):
            return None
        owner = None
        for candidate in owners:  # every one compared: timing says nothing of which
            if hmac.compare_digest(payload.owner_tag, key.owner_tag(candidate)):
                owner = candidate
        return None if owner is None else ClientSecret(owner, expires_at, session)


def configured_keys(
    key: str | None, previous: Sequence[str], key_file: str | None
) -> tuple[str | None, list[str]]:
    """The configured key that seals secrets and the previous keys that only open them: ``key`` and
    ``previous``, or the key file's lines (blank ones skipped: the first seals, the later ones open)
    followed by ``previous``. No key: (None, previous). ``ValueError`` naming the setting when both
    ``key`` and ``key_file`` are set or the file is unreadable (never naming a key)."""
    if key and key_file:
        raise ValueError("set webrtc.client_secret_key or webrtc.client_secret_key_file, not both")
    if not key_file:
        return key or None, list(previous)
    try:
        with open(key_file, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise ValueError(f"webrtc.client_secret_key_file: cannot read {key_file}: {reason}") from None
    keys = [line for line in lines if line]
    return (keys[0], keys[1:] + list(previous)) if keys else (None, list(previous))


def reload_keys(secrets: ClientSecrets, previous: Sequence[str], key_file: str) -> bool:
    """Re-read ``key_file`` into ``secrets`` (on SIGHUP); False (logged, the keys in use kept) if it
    cannot be read, holds no key or a key too short. Logs how many keys, never one."""
    try:
        key, openers = configured_keys(None, previous, key_file)
        if key is None:
            raise ValueError(f"webrtc.client_secret_key_file: {key_file} holds no key")
        secrets.rekey(key, openers)
    except ValueError as e:
        log.error("client secret keys not reloaded, those in use stay: %s", e)
        return False
    log.info(
        "client secret keys reloaded from %s: one seals, %d open (the sealing one included)",
        key_file,
        secrets.opening_keys,
    )
    return True


@contextlib.contextmanager
def reloading_on_hangup(secrets: ClientSecrets, previous: Sequence[str], key_file: str) -> Iterator[None]:
    """While inside (the gateway's lifespan), SIGHUP re-reads ``key_file`` (``reload_keys``), and it is
    re-read on entering (a SIGHUP before could not be taken). Only where the running loop takes signals (the
    main thread, on Unix); elsewhere the file is read at start alone."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGHUP, reload_keys, secrets, previous, key_file)
    except (ValueError, RuntimeError, NotImplementedError, AttributeError):  # not the main thread, or Windows
        log.info("the client secret key file is read at start only here (no SIGHUP outside the main thread)")
        yield
        return
    # once more now: a SIGHUP while the app was built (ignored then, see cli.serve) asked for what the file says now
    reload_keys(secrets, previous, key_file)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
