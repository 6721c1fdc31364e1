"""Blocking clients for ``/v1/realtime`` and the OpenPI robot socket (``websockets.sync``).

For callers without an asyncio loop: locust users (gevent greenlets, where one event loop per user
does not mix with the gevent hub), threads, scripts. Same pure ``ClientState`` as the asyncio client;
no playback clock (a load generator measures arrival, it does not listen).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from websockets.sync.client import ClientConnection, connect

from realtime_gw.client.protocol import (
    ClientState,
    PlaybackAckEvent,
    Reply,
    UnknownEvent,
    append_audio,
    decode_server_event,
    encode_client_event,
    session_update,
    user_text,
)
from realtime_gw.client.realtime import ServerError, ws_url
from realtime_gw.protocols import openpi
from realtime_gw.protocols import realtime as rt

Event = rt.ServerEvent | UnknownEvent
OPENPI_PATH = "/v1/realtime/robot/openpi"


class SyncRealtimeClient:
    """``send`` may be called from one thread/greenlet while another blocks in ``recv``."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        *,
        model: str | None = None,
        duplex: bool = False,
        keep_audio: bool = False,
        open_timeout: float = 10.0,
    ) -> None:
        self.url = ws_url(url, "/v1/realtime", model=model or "", duplex="1" if duplex else "")
        self.api_key = api_key
        self.open_timeout = open_timeout
        self.state = ClientState(keep_audio=keep_audio)
        self.ws: ClientConnection | None = None

    def __enter__(self) -> SyncRealtimeClient:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> rt.SessionOut:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        self.ws = connect(
            self.url,
            additional_headers=headers,
            subprotocols=["realtime"],  # type: ignore[list-item]
            max_size=None,
            open_timeout=self.open_timeout,
        )
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

    def update_session(self, session: dict[str, Any], timeout: float = 10.0) -> rt.SessionOut:
        self.send(session_update(session))
        self.recv_until(lambda ev: isinstance(ev, rt.SessionUpdatedEvent), timeout, fail_on_error=True)
        assert self.state.session is not None
        return self.state.session

    def stream_pcm(self, pcm: bytes, rate: int, chunk_ms: int = 20, speed: float = 1.0) -> None:
        """Real-time paced append (absolute schedule, no drift); call from its own greenlet/thread."""
        step = rate * chunk_ms // 1000 * 2
        t0 = time.monotonic()
        for n, pos in enumerate(range(0, len(pcm), step), start=1):
            self.send(append_audio(pcm[pos : pos + step]))
            if speed > 0:
                delay = t0 + n * chunk_ms / 1000.0 / speed - time.monotonic()
                if delay > 0:
                    time.sleep(delay)

    def say(self, text: str, timeout: float = 120.0) -> Reply:
        self.send(user_text(text))
        self.send(rt.ResponseCreateEvent())
        ev = self.recv_until(lambda e: isinstance(e, rt.ResponseDoneEvent), timeout, fail_on_error=True)
        assert isinstance(ev, rt.ResponseDoneEvent)
        return self.state.replies[ev.response.id]


class PolicyServerError(RuntimeError):
    """The robot socket answered an observation with a text frame (the OpenPI error contract)."""


class OpenPIClient:
    """openpi-client's ``WebsocketClientPolicy``, wire for wire, with timings and our extensions.

    Connects to ``/v1/realtime/robot/openpi`` unless the URL names a path (``ws://host:port/`` is the
    stock openpi location and works too).
    """

    def __init__(
        self, url: str = "http://127.0.0.1:8000", api_key: str | None = None, open_timeout: float = 10.0
    ):
        self.url = ws_url(url, OPENPI_PATH)
        self.api_key = api_key
        self.open_timeout = open_timeout
        self.ws: ClientConnection | None = None
        self.metadata: dict[str, Any] = {}
        self.last_rtt_s: float | None = None

    def __enter__(self) -> OpenPIClient:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> dict[str, Any]:
        headers = {"Authorization": f"Api-Key {self.api_key}"} if self.api_key else None
        self.ws = connect(
            self.url,
            additional_headers=headers,
            max_size=None,
            open_timeout=self.open_timeout,
            compression=None,
        )
        first = self.ws.recv(self.open_timeout)
        if isinstance(first, str):
            raise PolicyServerError(first)
        self.metadata = openpi.unpackb(first)
        return self.metadata

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()

    def infer(self, obs: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        assert self.ws is not None, "not connected"
        t0 = time.perf_counter()
        self.ws.send(openpi.packb(obs))
        reply = self.ws.recv(timeout)
        self.last_rtt_s = time.perf_counter() - t0
        if isinstance(reply, str):
            raise PolicyServerError(reply)
        return openpi.unpackb(reply)

    def reset(self, timeout: float = 10.0) -> Any:
        assert self.ws is not None, "not connected"
        self.ws.send(openpi.packb({"endpoint": "reset"}))
        reply = self.ws.recv(timeout)
        return reply if isinstance(reply, str) else openpi.unpackb(reply)


def sample_observation(
    metadata: dict[str, Any], prompt: str = "pick up the cup", seed: int | None = None
) -> dict[str, Any]:
    """An observation the server will accept, built from its metadata frame (zeros, or noise with ``seed``).

    Uses ``policy_server_config`` (camera keys, image size, state key and size); a server that sends
    no such config gets the DROID layout openpi's examples use.
    """
    cfg = metadata.get("policy_server_config") or {}
    cameras = cfg.get("camera_keys") or ["observation/exterior_image_1_left", "observation/wrist_image_left"]
    h, w = (cfg.get("image_size") or [224, 224])[:2]
    state_key = cfg.get("state_key") or "observation/joint_position"
    state_dim = int(cfg.get("state_dim") or 7)
    rng = np.random.default_rng(seed) if seed is not None else None
    obs: dict[str, Any] = {}
    for key in cameras:
        obs[key] = (
            rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            if rng is not None
            else np.zeros((h, w, 3), np.uint8)
        )
    obs[state_key] = (
        rng.standard_normal(state_dim).astype(np.float32)
        if rng is not None
        else np.zeros(state_dim, np.float32)
    )
    obs[cfg.get("prompt_key") or "prompt"] = prompt
    return obs
