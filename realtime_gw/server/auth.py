"""Who may connect: API keys (constant-time), browser origins, per-key session slots and start rate."""

from __future__ import annotations

import hmac
import time
from collections import Counter, deque
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import urlsplit

RATE_WINDOW_S = 60.0

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


class Refusal(NamedTuple):
    """Why a socket may not open a session now: ``code`` for error events, ``message`` for people,
    ``status`` for sockets refused with an HTTP answer before the handshake (OpenPI)."""

    code: str  # "origin_not_allowed" | "invalid_api_key" | "session_limit_reached" | "rate_limit_exceeded"
    message: str
    status: int = 503


class Access:
    """Keys, origins, per-key session slots and session-start rate, shared by every endpoint of one
    gateway. Keys are the configured ones (or "" when the gateway is open), so the per-key state is
    bounded by the configuration, not by clients."""

    def __init__(
        self,
        api_keys: list[str],
        max_sessions_per_key: int = 0,
        allowed_origins: list[str] | None = None,
        session_starts_per_key_per_min: int = 0,
    ):
        self.api_keys = [k for k in api_keys if k]
        self.max_sessions_per_key = max_sessions_per_key
        self.allowed_origins = set(allowed_origins or [])
        self.starts_per_min = session_starts_per_key_per_min
        self.sessions: Counter[str] = Counter()
        self._starts: dict[str, deque[float]] = {}

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

    def acquire(self, key: str, now: float | None = None) -> Refusal | None:
        """Take one of this key's session slots: None, or why not. Refused starts do not count
        against the rate (a client retrying a full key is not locked out longer)."""
        if self.max_sessions_per_key and self.sessions[key] >= self.max_sessions_per_key:
            return Refusal(
                "session_limit_reached",
                f"session limit for this API key reached ({self.max_sessions_per_key}); retry later",
            )
        if self.starts_per_min:
            now = time.monotonic() if now is None else now
            window = self._starts.setdefault(key, deque())
            while window and window[0] <= now - RATE_WINDOW_S:
                window.popleft()
            if len(window) >= self.starts_per_min:
                wait = RATE_WINDOW_S - (now - window[0])
                return Refusal(
                    "rate_limit_exceeded",
                    f"session starts for this API key over {self.starts_per_min} per minute; "
                    f"retry in {wait:.0f} s",
                    429,
                )
            window.append(now)
        self.sessions[key] += 1
        return None

    def release(self, key: str) -> None:
        self.sessions[key] -= 1
        if self.sessions[key] <= 0:
            del self.sessions[key]
