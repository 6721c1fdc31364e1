"""One admission path for every socket (realtime, speech stream, OpenPI).

Two steps, because the sockets answer at different moments: ``check`` (origin, API key) runs before
the handshake on every socket; ``enter`` (the server-wide ``max_sessions`` over all kinds, a kind's own
cap, the key's slots and start rate) runs before the handshake on OpenPI (refused with an HTTP status)
and after it on realtime and the speech stream (refused with an error event, then close 1013). Each
caller renders a ``Refusal`` in its own wire format. ``leave`` (or the ``with`` block) gives
everything back, once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Literal

from starlette.websockets import WebSocket

from realtime_gw.server.auth import Refusal, presented_key
from realtime_gw.server.client_secrets import ClientSecret
from realtime_gw.server.gateway import Gateway
from realtime_gw.server.metrics import SESSIONS

Kind = Literal["realtime", "live", "speech", "openpi"]

_KIND_NAMES = {"realtime": "Realtime", "live": "GPT-Live", "speech": "Speech stream", "openpi": "OpenPI"}


class Admission:
    """Admission of one socket of one kind. Not reusable: one instance per connection."""

    def __init__(self, gateway: Gateway, kind: Kind) -> None:
        self.gateway = gateway
        self.kind = kind
        self.key: str | None = None
        self.entered = False
        self.secret: ClientSecret | None = None
        """The client secret presented instead of a key, if any (its session config applies)."""

    def check(self, headers: Mapping[str, str]) -> Refusal | None:
        """Origin and API key (constant time): None, or why not."""
        access = self.gateway.access
        if not access.origin_allowed(headers.get("origin"), headers.get("host")):
            return Refusal("origin_not_allowed", "origin not allowed", 403)
        presented = presented_key(headers)
        # A client secret opens realtime sessions only (as OpenAI's do): not speech, OpenPI or GPT-Live.
        realtime = self.kind == "realtime"
        self.key = access.identify(presented, client_secret_ok=realtime)
        self.secret = access.client_secret(presented) if realtime else None
        if self.key is None:
            return Refusal("invalid_api_key", "invalid or missing API key", 401)
        return None

    def _kind_cap(self) -> int | None:
        return self.gateway.config.openpi_max_sessions if self.kind == "openpi" else None

    def enter(self) -> Refusal | None:
        """Take a session: the kind's cap, the server-wide limit (all kinds together), then the key's
        slot and start rate. None when taken (and counted), else why not (nothing taken)."""
        assert self.key is not None and not self.entered, "check() first, enter() once"
        sessions = self.gateway.sessions
        cap = self._kind_cap()
        if cap is not None and sessions[self.kind] >= cap:
            return Refusal(
                "session_limit_reached",
                f"{_KIND_NAMES[self.kind]} session limit reached ({cap}); retry later",
            )
        limit = self.gateway.config.max_sessions
        if sum(sessions.values()) >= limit:
            return Refusal("session_limit_reached", f"server session limit reached ({limit}); retry later")
        refusal = self.gateway.access.acquire(self.key)
        if refusal is not None:
            return refusal
        self.entered = True
        sessions[self.kind] += 1
        SESSIONS.labels(self.kind).inc()
        return None

    def leave(self) -> None:
        """Give the session back (idempotent; a no-op when it was never taken)."""
        if not self.entered:
            return
        self.entered = False
        assert self.key is not None
        self.gateway.access.release(self.key)
        SESSIONS.labels(self.kind).dec()
        # The count goes last: whoever sees it drop (a limit check, a test) sees the rest released too.
        self.gateway.sessions[self.kind] -= 1

    def __enter__(self) -> Admission:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.leave()


async def admit_socket(
    ws: WebSocket,
    admission: Admission,
    refusal_event: Callable[[Refusal], str],
    subprotocol: str | None = None,
) -> bool:
    """The voice sockets' handshake: a bad key or origin is refused before it (close 1008); a full
    server after it, with the protocol's own error event (``refusal_event``) and close 1013, so the
    client can read why. True when the session is taken (the caller then leaves it)."""
    refusal = admission.check(ws.headers)
    if refusal is not None:
        await ws.close(code=1008, reason=refusal.message)
        return False
    await ws.accept(subprotocol=subprotocol)
    refusal = admission.enter()
    if refusal is None:
        return True
    await ws.send_text(refusal_event(refusal))
    await ws.close(code=1013, reason=refusal.code.replace("_", " "))
    return False
