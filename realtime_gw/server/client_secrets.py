"""Ephemeral client secrets (``ek_…``): the store behind ``POST /v1/realtime/client_secrets``
(``client_secret_endpoint.py``).

A browser or mobile app must not hold a deployment key; its backend mints a short-lived secret with
one and hands it over. The secret may start sessions (WebSocket or WebRTC call) until it expires;
sessions outlive it. It carries a session config, applied when each session starts.

Stored, not signed: secrets live in this process's memory (the gateway is one process), keyed by a
SHA-256 of their value, so neither the store nor any log holds a usable value (``log_hygiene`` redacts
``ek_…``). Bounded: expired secrets are swept as new ones are minted; over ``webrtc_max_client_secrets``
unexpired ones, minting is refused (429).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

from realtime_gw.protocols import realtime as rt

PREFIX = "ek_"


@dataclass(frozen=True, slots=True)
class ClientSecret:
    owner: str
    """The deployment key that minted it: its sessions count against that key's slots and rate."""
    expires_at: float
    """Wall clock (seconds since the epoch)."""
    session: rt.SessionParams | None
    """Applied to every session it starts, as a ``session.update`` before ``session.created``."""


class ClientSecrets:
    def __init__(self, max_live: int = 10000) -> None:
        self.max_live = max_live
        self._live: dict[bytes, ClientSecret] = {}

    @staticmethod
    def _digest(value: str) -> bytes:
        return hashlib.sha256(value.encode()).digest()

    def mint(self, owner: str, seconds: int, session: rt.SessionParams | None, now: float | None = None) -> tuple[str, ClientSecret] | None:
        """A new secret's value and record; None when ``max_live`` unexpired ones exist."""
        now = time.time() if now is None else now
        self._sweep(now)
        if len(self._live) >= self.max_live:
            return None
        value = PREFIX + secrets.token_urlsafe(32)
        record = ClientSecret(owner, now + seconds, session)
        self._live[self._digest(value)] = record
        return value, record

    def find(self, value: str | None, now: float | None = None) -> ClientSecret | None:
        """The unexpired secret ``value`` is, else None (looked up by digest, so timing says nothing
        about stored values)."""
        if not value or not value.startswith(PREFIX):
            return None
        record = self._live.get(self._digest(value))
        if record is None or record.expires_at <= (time.time() if now is None else now):
            return None
        return record

    def _sweep(self, now: float) -> None:
        for digest in [d for d, r in self._live.items() if r.expires_at <= now]:
            del self._live[digest]
