"""Who may connect: API keys (constant-time), browser origins, per-key session slots and start rate."""

from __future__ import annotations

import hmac
import ipaddress
import time
from collections import Counter, deque
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from realtime_gw.server.client_secrets import PREFIX as CLIENT_SECRET_PREFIX
from realtime_gw.server.client_secrets import ClientSecret, ClientSecrets

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


def offered_subprotocols(headers: Mapping[str, str]) -> list[str]:
    return [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]


def presented_key(headers: Mapping[str, str]) -> str | None:
    """A key from ``Authorization: Bearer``, ``Authorization: Api-Key`` (openpi-client) or the
    browser subprotocol, in that order."""
    auth = headers.get("authorization")
    key = bearer_key(auth) or bearer_key(auth, "Api-Key")
    if key is None:
        key = next(
            (
                p[len(SUBPROTOCOL_KEY_PREFIX) :]
                for p in offered_subprotocols(headers)
                if p.startswith(SUBPROTOCOL_KEY_PREFIX)
            ),
            None,
        )
    return key


LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BIND = frozenset({"", "0.0.0.0", "::"})


def hostname_of(host_header: str | None) -> str | None:
    """The name in a ``Host`` header (lower case, no port, IPv6 without brackets), or None."""
    if not host_header:
        return None
    try:
        parts = urlsplit("//" + host_header.strip())
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError:
        return None
    name = parts.hostname
    return name.rstrip(".") if name else None


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostPolicy:
    """Which ``Host`` names the gateway answers to. DNS rebinding points a name the attacker owns at the
    gateway, so the browser sends that name: only names the operator gave are served (localhost, the
    bind address, ``allowed_hosts``). An IP literal cannot be rebound, so it is always served."""

    def __init__(self, allowed_hosts: list[str] | None = None, bind_host: str = "127.0.0.1") -> None:
        allowed = [h.lower().rstrip(".") for h in allowed_hosts or []]
        self.any = "*" in allowed
        self.names = set(LOCAL_NAMES) | {h for h in allowed if not h.startswith("*")}
        if bind_host.lower() not in WILDCARD_BIND:
            self.names.add(bind_host.lower().strip("[]"))
        self.suffixes = tuple(h[1:] for h in allowed if h.startswith("*."))

    def names_host(self, name: str) -> bool:
        """Named by the operator: localhost, the bind address or an ``allowed_hosts`` entry (not "*")."""
        return name in self.names or name.endswith(self.suffixes)

    def allows(self, host_header: str | None) -> bool:
        """A request with this ``Host`` header may be served (none at all: not a browser, allowed)."""
        if self.any or host_header is None:
            return True
        name = hostname_of(host_header)
        return name is not None and (self.names_host(name) or _is_ip_literal(name))


class HostAllowlist:
    """ASGI middleware: HTTP 421 for requests and WebSocket upgrades whose ``Host`` is not served."""

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = Headers(scope=scope).get("host")
            if not self.policy.allows(host):
                message = f"host {host!r} is not served here; add it to allowed_hosts\n"
                if scope["type"] == "http" or "websocket.http.response" in scope.get("extensions", {}):
                    await PlainTextResponse(message, status_code=421)(scope, receive, send)
                else:
                    await send({"type": "websocket.close", "code": 1008, "reason": "host not allowed"})
                return
        await self.app(scope, receive, send)


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
        hosts: HostPolicy | None = None,
        client_secrets: ClientSecrets | None = None,
    ):
        self.api_keys = [k for k in api_keys if k]
        self.max_sessions_per_key = max_sessions_per_key
        self.allowed_origins = set(allowed_origins or [])
        self.starts_per_min = session_starts_per_key_per_min
        self.hosts = hosts or HostPolicy()
        self.client_secrets = client_secrets or ClientSecrets()
        self.sessions: Counter[str] = Counter()
        self._starts: dict[str, deque[float]] = {}

    @property
    def required(self) -> bool:
        return bool(self.api_keys)

    def identify(self, presented: str | None, client_secret_ok: bool = False) -> str | None:
        """The key that matches (compared in constant time against every key), or None.
        With no keys configured everyone is the anonymous key "". A client secret (``ek_…``) is accepted
        only where ``client_secret_ok`` (a realtime session: a socket or a call), standing for the key that
        minted it while it is unexpired; elsewhere (and expired) it is refused, keys or not."""
        if presented is not None and presented.startswith(CLIENT_SECRET_PREFIX):
            record = self.client_secret(presented) if client_secret_ok else None
            return None if record is None else record.owner
        if not self.api_keys:
            return ""
        match = None
        for key in self.api_keys:
            if presented is not None and hmac.compare_digest(presented.encode(), key.encode()):
                match = key
        return match

    def client_secret(self, presented: str | None) -> ClientSecret | None:
        """The valid, unexpired client secret ``presented`` is, minted by a key configured now."""
        return self.client_secrets.find(presented, self.api_keys or [""])

    def origin_allowed(self, origin: str | None, host: str | None) -> bool:
        """Non-browser clients send no Origin. Browsers may connect from an allowlisted origin ("*" =
        any), from a host the gateway serves by name (``HostPolicy.names_host``: localhost, the bind
        address, ``allowed_hosts``; judged by that list, never by the ``Host`` header, which a
        rebinding page controls), or from the gateway's own page at an IP address (origin = ``Host``,
        which ``HostAllowlist`` has already judged)."""
        if origin is None or "*" in self.allowed_origins or origin in self.allowed_origins:
            return True
        try:
            parts = urlsplit(origin)
            name = parts.hostname
        except ValueError:
            return False
        if name is None:
            return False
        if self.hosts.names_host(name.rstrip(".")):
            return True
        return host is not None and parts.netloc == host and self.hosts.allows(host)

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
