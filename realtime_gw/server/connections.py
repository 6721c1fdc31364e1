"""How the gateway listens: uvicorn's options from the config, and a guard on every TCP connection.

uvicorn bounds nothing before a request reaches the app: httptools accepts an endless URL or header,
and ``timeout_keep_alive`` only runs *between* requests, so a socket that never sends a byte (or never
finishes its headers) is held for ever. Here the HTTP parser is h11, whose buffer is capped at
``max_header_bytes`` (HTTP 400 above it), and ``GuardedH11Protocol`` adds what uvicorn lacks:

- a handshake deadline: from the connection (or its previous response) to the end of the request's
  headers, ``handshake_timeout_s``; past it the socket is closed;
- a cap on open connections per client address (``max_connections_per_client``): one more gets
  HTTP 429 as soon as its request line and headers are in, then the socket is closed.

A WebSocket upgrade hands the socket to ``GuardedWebSocketProtocol``, which gives the connection's
place back when the socket closes and keeps the keepalive honest under backpressure (see
``WS_PING_TIMEOUT_S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from realtime_gw.config import GatewayConfig

log = logging.getLogger(__name__)

WS_PING_INTERVAL_S = 20.0
WS_PING_TIMEOUT_S = 20.0
"""How long a ping waits for its pong while the socket is read. uvicorn stops reading a socket while
a message waits for the app, so while a session is slowed by backpressure (the input audio budget:
up to ~32 s for one 15 MiB append at 10x real time) the client's pong waits behind its own data,
unread. That time does not count: the deadline is extended while reading is held back or the peer
is still sending (``GuardedWebSocketProtocol.keepalive_timeout``). A peer that sends nothing, pong
included, for a whole timeout while it is read is dropped: ping interval + timeout, ~40 s at most."""


class ConnectionGuard:
    """Open connections per client address, shared by every protocol instance of one server."""

    def __init__(self, max_per_client: int, handshake_timeout_s: float) -> None:
        self.max_per_client = max_per_client
        self.handshake_timeout_s = handshake_timeout_s
        self.open: Counter[str] = Counter()

    def take(self, address: str) -> bool:
        """Count one more connection from ``address``; False when that is over the cap (it is
        counted anyway until ``give``, so a refused socket still holds its place while open)."""
        self.open[address] += 1
        return not self.max_per_client or self.open[address] <= self.max_per_client

    def give(self, address: str) -> None:
        self.open[address] -= 1
        if self.open[address] <= 0:
            del self.open[address]


OPENPI_PATHS = frozenset({"/", "/v1/realtime/robot/openpi"})
FRAME_MARGIN = 1024 * 1024
"""Frames up to this much over a socket's limit still reach its handler, which answers with a readable
error; larger ones are refused by the WebSocket layer (close 1009) before they are buffered."""


class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol that gives its connection's place back when the socket closes, with
    the frame-size cap of the socket's own kind (uvicorn has one ``ws_max_size`` for all paths, so a
    voice socket would otherwise buffer and UTF-8-decode frames as large as a robot's)."""

    release: Callable[[], None] | None = None
    max_frame_bytes: ClassVar[int] = 16 * 1024 * 1024
    openpi_max_frame_bytes: ClassVar[int] = 64 * 1024 * 1024

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            limit = self.openpi_max_frame_bytes if scope["path"] in OPENPI_PATHS else self.max_frame_bytes
            self.conn.max_message_size = limit + FRAME_MARGIN

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            if self.release is not None:
                self.release()
                self.release = None

    # -- keepalive under backpressure -----------------------------------------------------------------
    # A pong cannot overtake the data the peer sent before it, and reading that data ahead of the app
    # would buffer what backpressure leaves in the peer's socket. So the pong's deadline only counts
    # time in which the pong could have arrived: a wait in which reading was held back (a message
    # waiting for the app) or bytes kept coming is extended by another timeout.
    _pong_may_be_queued = False
    """Since the ping (or the last extension): reading was held back or the peer sent something."""

    def data_received(self, data: bytes) -> None:
        self._pong_may_be_queued = True  # a peer that sends is alive; its pong may be behind this data
        super().data_received(data)

    def send_receive_event_to_app(self) -> None:
        super().send_receive_event_to_app()
        self._pong_may_be_queued = self._pong_may_be_queued or self.read_paused

    def send_keepalive_ping(self) -> None:
        self._pong_may_be_queued = self.read_paused
        super().send_keepalive_ping()

    def keepalive_timeout(self) -> None:
        held = self._pong_may_be_queued
        if held and self.ping_timeout is not None and not (self.close_sent or self.transport.is_closing()):
            self._pong_may_be_queued = self.read_paused
            self.pong_timer = self.loop.call_later(self.ping_timeout, self.keepalive_timeout)
            return
        super().keepalive_timeout()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a handshake deadline and a per-address connection cap."""

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._address: str | None = None
        self._over_cap = False
        self._headers_timer: Any = None

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._address = self.client[0] if self.client else "unknown"
        self._over_cap = not self.guard.take(self._address)
        self._arm_headers_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_headers_deadline()
        try:
            super().connection_lost(exc)
        finally:
            self._release()

    def _release(self) -> None:
        if self._address is not None:
            self.guard.give(self._address)
            self._address = None

    # -- the handshake deadline ----------------------------------------------------------------------
    def _arm_headers_deadline(self) -> None:
        self._disarm_headers_deadline()
        if self.guard.handshake_timeout_s > 0:
            self._headers_timer = self.loop.call_later(self.guard.handshake_timeout_s, self._headers_too_slow)

    def _disarm_headers_deadline(self) -> None:
        if self._headers_timer is not None:
            self._headers_timer.cancel()
            self._headers_timer = None

    def _headers_too_slow(self) -> None:
        self._headers_timer = None
        if not self.transport.is_closing():
            log.info(
                "%s: no complete request within %.0f s; closed", self._address, self.guard.handshake_timeout_s
            )
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._over_cap:
            self._refuse(data)
            return
        super().data_received(data)
        if self._headers_timer is not None and self.conn.their_state is not h11.IDLE:
            self._disarm_headers_deadline()  # the request line and headers are in

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_headers_deadline()  # the next request on this keep-alive socket gets its own

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._disarm_headers_deadline()
        address, self._address = self._address, None  # the WebSocket protocol gives it back
        super().handle_websocket_upgrade(event)
        protocol = self.transport.get_protocol()
        if isinstance(protocol, GuardedWebSocketProtocol) and address is not None:
            protocol.release = lambda: self.guard.give(address)
        elif address is not None:
            self.guard.give(address)

    # -- the per-address cap ---------------------------------------------------------------------------
    def _refuse(self, data: bytes) -> None:
        """Answer 429 once the request's headers are in (an answer before them could be lost to the
        reset that closing an unread socket causes), then close."""
        self.conn.receive_data(data)
        try:
            event = self.conn.next_event()
        except h11.RemoteProtocolError:
            self.transport.close()
            return
        if event is h11.NEED_DATA:
            return
        self._disarm_headers_deadline()
        limit = self.guard.max_per_client
        body = f"too many connections from {self._address} (max_connections_per_client={limit})\n".encode()
        log.info("%s: over %d connections; refused with 429", self._address, limit)
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"connection", b"close"),
            (b"retry-after", b"1"),
        ]
        with_body = [h11.Response(status_code=429, headers=headers), h11.Data(data=body), h11.EndOfMessage()]
        with contextlib.suppress(h11.LocalProtocolError):
            self.transport.write(b"".join(self.conn.send(part) or b"" for part in with_body))
        self.transport.close()


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard one (every socket is a file; the usual soft 1,024 or
    4,096 resets clients long before the session limits). Returns (soft, hard) as they are now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as e:
        log.warning("could not raise the open-files limit from %d to %d: %s", soft, target, e)
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def uvicorn_options(config: GatewayConfig) -> dict[str, Any]:
    """``uvicorn.run``/``uvicorn.Config`` keyword arguments for serving ``config`` (besides the app)."""
    guard = ConnectionGuard(config.max_connections_per_client, config.handshake_timeout_s)
    http = type("GatewayH11Protocol", (GuardedH11Protocol,), {"guard": guard})
    limits = {
        "max_frame_bytes": config.max_frame_bytes,
        "openpi_max_frame_bytes": config.openpi_max_frame_bytes,
    }
    ws = type("GatewayWebSocketProtocol", (GuardedWebSocketProtocol,), limits)
    return {
        "host": config.host,
        "port": config.port,
        "log_level": config.log_level,
        "http": http,
        "ws": ws,
        "h11_max_incomplete_event_size": config.max_header_bytes,
        "ws_per_message_deflate": config.ws_per_message_deflate,
        "ws_max_size": max(config.max_frame_bytes, config.openpi_max_frame_bytes) + FRAME_MARGIN,
        "ws_ping_interval": WS_PING_INTERVAL_S,
        "ws_ping_timeout": WS_PING_TIMEOUT_S,
    }


SHUTDOWN_DRAIN_S = 3.0
"""At shutdown, how long sessions have to say goodbye (GPT-Live's ``session.closed``) before uvicorn
closes their sockets."""


class GracefulServer(uvicorn.Server):
    """uvicorn's server, which at shutdown first stops listening and sets ``stopping`` so sessions
    can end themselves, and waits while ``ending()`` says some still are (at most
    ``SHUTDOWN_DRAIN_S``) before it closes every connection left (a bare 1012)."""

    def __init__(self, config: uvicorn.Config, stopping: asyncio.Event, ending: Callable[[], bool]) -> None:
        super().__init__(config)
        self.stopping, self.ending = stopping, ending

    async def shutdown(self, sockets: Any = None) -> None:
        for server in self.servers:
            server.close()
        self.stopping.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SHUTDOWN_DRAIN_S
        while self.ending() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await super().shutdown(sockets)
