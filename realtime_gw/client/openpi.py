"""Blocking client for the OpenPI robot socket (``websockets.sync``), wire-compatible with openpi-client.

Blocking as openpi-client's ``WebsocketClientPolicy`` is, so a robot loop, a thread or a locust greenlet
calls ``infer`` directly. ``sample_observation`` builds an observation the server accepts from its
metadata frame.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from websockets.sync.client import ClientConnection, connect

from realtime_gw.client.protocol import DEFAULT_URL, auth_headers, ws_url
from realtime_gw.protocols import openpi

OPENPI_PATH = "/v1/realtime/robot/openpi"


class PolicyServerError(RuntimeError):
    """The robot socket answered an observation with a text frame (the OpenPI error contract)."""


class OpenPIClient:
    """openpi-client's ``WebsocketClientPolicy``, wire for wire, with timings and our extensions.

    Connects to ``/v1/realtime/robot/openpi`` unless the URL names a path (``ws://host:port/`` is the
    stock openpi location and works too).
    """

    def __init__(
        self, url: str = DEFAULT_URL, api_key: str | None = None, open_timeout: float = 10.0
    ) -> None:
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
        self.ws = connect(
            self.url,
            additional_headers=auth_headers(self.api_key, "Api-Key"),
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

    Uses ``policy_server_config``: a robot preset's ``observation`` schema (DROID, LIBERO, ALOHA: every
    key's path, shape and dtype), else the camera keys, image size, state key and size; a server that
    sends no such config gets the DROID layout openpi's examples use.
    """
    cfg = metadata.get("policy_server_config") or {}
    if cfg.get("observation"):
        return _from_schema(cfg["observation"], prompt, seed)
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


def _from_schema(fields: list[dict[str, Any]], prompt: str, seed: int | None) -> dict[str, Any]:
    """One value per field of the metadata's ``observation`` schema (nested paths become nested maps)."""
    rng = np.random.default_rng(seed) if seed is not None else None
    obs: dict[str, Any] = {}
    for field in fields:
        *parents, key = field["path"]
        target = obs
        for name in parents:
            target = target.setdefault(name, {})
        shape = tuple(field["shape"])
        if field["dtype"] == "str":
            target[key] = prompt
        elif field["dtype"] == "uint8":
            target[key] = rng.integers(0, 256, shape, dtype=np.uint8) if rng else np.zeros(shape, np.uint8)
        else:
            target[key] = rng.uniform(-1, 1, shape).astype(np.float32) if rng else np.zeros(shape, np.float32)
    return obs
