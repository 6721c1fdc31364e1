"""Who may connect: API keys (constant-time), browser origins, and per-key session slots."""

from __future__ import annotations

import hmac
from collections import Counter
from collections.abc import Mapping
from urllib.parse import urlsplit

SUBPROTOCOL_KEY_PREFIX = "openai-insecure-api-key."
"""Browsers cannot set headers on WebSockets; OpenAI's clients pass the key as a subprotocol."""


def bearer_key(header: str | None, scheme: str = "Bearer") -> str | None:
    """The key from ``Authorization: <scheme> <key>`` (scheme case-insensitive), else None."""
    if not header:
        return None
    got_scheme, _, key = header.partition(" ")
    if got_scheme.lower() != scheme.lower() or not key.strip():
        return None
    return key.strip()


def key_matches(given: str | None, expected: str) -> bool:
    if given is None:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def offered_subprotocols(headers: Mapping[str, str]) -> list[str]:
    return [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]


def presented_key(headers: Mapping[str, str]) -> str | None:
    """A key from ``Authorization: Bearer``, ``Authorization: Api-Key`` (openpi-client) or the
    browser subprotocol, in that order."""
    auth = headers.get("authorization")
    key = bearer_key(auth) or bearer_key(auth, "Api-Key")
    if key is None:
        key = next(
            (p[len(SUBPROTOCOL_KEY_PREFIX) :] for p in offered_subprotocols(headers) if p.startswith(SUBPROTOCOL_KEY_PREFIX)),
            None,
        )
    return key


class Access:
    """Keys, origins and per-key session slots, shared by every endpoint of one gateway."""

    def __init__(self, api_keys: list[str], max_sessions_per_key: int = 0, allowed_origins: list[str] | None = None):
        self.api_keys = [k for k in api_keys if k]
        self.max_sessions_per_key = max_sessions_per_key
        self.allowed_origins = set(allowed_origins or [])
        self.sessions: Counter[str] = Counter()

    @property
    def required(self) -> bool:
        return bool(self.api_keys)

    def identify(self, presented: str | None) -> str | None:
        """The key that matches (compared in constant time against every key), or None.
        With no keys configured everyone is the anonymous key ""."""
        if not self.api_keys:
            return ""
        match = None
        for key in self.api_keys:
            if presented is not None and hmac.compare_digest(presented.encode(), key.encode()):
                match = key
        return match

    def origin_allowed(self, origin: str | None, host: str | None) -> bool:
        """Non-browser clients send no Origin. Browsers may connect from the gateway's own origin
        (its page at /) or from an allowlisted one; "*" allows any."""
        if origin is None or "*" in self.allowed_origins or origin in self.allowed_origins:
            return True
        return host is not None and urlsplit(origin).netloc == host

    def acquire(self, key: str) -> bool:
        """Take one of this key's session slots; False when the key is at its limit."""
        if self.max_sessions_per_key and self.sessions[key] >= self.max_sessions_per_key:
            return False
        self.sessions[key] += 1
        return True

    def release(self, key: str) -> None:
        self.sessions[key] -= 1
        if self.sessions[key] <= 0:
            del self.sessions[key]
