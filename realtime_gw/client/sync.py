"""Blocking client for ``/v1/realtime`` (``websockets.sync``); the OpenPI one is in ``client.openpi``.

For callers without an asyncio loop: locust users (gevent greenlets, where one event loop per user
does not mix with the gevent hub), threads, scripts. Same pure ``ClientState`` as the asyncio client;
no playback clock (a load generator measures arrival, it does not listen).
"""

from __future__ import annotations

import time
from typing import Any

from websockets.sync.client import ClientConnection, connect

from realtime_gw.client.protocol import (
    DEFAULT_URL,
    ClientState,
    Event,
    PlaybackAckEvent,
    Reply,
    ServerError,
    append_audio,
    decode_server_event,
    encode_client_event,
    pace_delay,
    pcm_chunks,
    realtime_connect_options,
    realtime_url,
    session_update,
    text_turn,
)
from realtime_gw.protocols import realtime as rt


class SyncRealtimeClient:
    """``send`` may be called from one thread/greenlet while another blocks in ``recv``."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        model: str | None = None,
        duplex: bool = False,
        keep_audio: bool = False,
        open_timeout: float = 10.0,
    ) -> None:
        self.url = realtime_url(url, model, duplex)
        self.api_key = api_key
        self.open_timeout = open_timeout
        self.state = ClientState(keep_audio=keep_audio)
        self.ws: ClientConnection | None = None

    def __enter__(self) -> SyncRealtimeClient:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> rt.SessionOut | rt.TranscriptionSessionOut:
        self.ws = connect(self.url, **realtime_connect_options(self.api_key, self.open_timeout))
        self.recv_until(lambda ev: isinstance(ev, rt.SessionCreatedEvent), self.open_timeout)
        assert self.state.session is not None
        return self.state.session

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()

    def send(self, event: rt.ClientEvent | PlaybackAckEvent) -> None:
        assert self.ws is not None, "not connected"
        self.ws.send(encode_client_event(event))

    def recv(self, timeout: float | None = None) -> tuple[Event, Reply | None]:
        assert self.ws is not None, "not connected"
        raw = self.ws.recv(timeout)
        ev = decode_server_event(raw)
        return ev, self.state.feed(ev, time.monotonic())

    def recv_until(self, pred: Any, timeout: float = 60.0, fail_on_error: bool = False) -> Event:
        deadline = time.monotonic() + timeout
        while True:
            ev, _ = self.recv(max(0.0, deadline - time.monotonic()))
            if pred(ev):
                return ev
            if fail_on_error and isinstance(ev, rt.ErrorEvent):
                raise ServerError(ev.error)

    def update_session(self, session: dict[str, Any], timeout: float = 10.0) -> rt.SessionOut | rt.TranscriptionSessionOut:
        self.send(session_update(session))
        self.recv_until(lambda ev: isinstance(ev, rt.SessionUpdatedEvent), timeout, fail_on_error=True)
        assert self.state.session is not None
        return self.state.session

    def stream_pcm(self, pcm: bytes, rate: int, chunk_ms: int = 20, speed: float = 1.0) -> None:
        """Real-time paced append (absolute schedule, no drift); call from its own greenlet/thread."""
        t0 = time.monotonic()
        for n, chunk in enumerate(pcm_chunks(pcm, rate, chunk_ms), start=1):
            self.send(append_audio(chunk))
            if (delay := pace_delay(t0, n, chunk_ms, speed, time.monotonic())) > 0:
                time.sleep(delay)

    def say(self, text: str, timeout: float = 120.0) -> Reply:
        for event in text_turn(text):
            self.send(event)
        ev = self.recv_until(lambda e: isinstance(e, rt.ResponseDoneEvent), timeout, fail_on_error=True)
        assert isinstance(ev, rt.ResponseDoneEvent)
        return self.state.replies[ev.response.id]
