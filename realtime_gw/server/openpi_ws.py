"""The OpenPI policy socket (``/v1/realtime/robot/openpi`` and ``/``): a thin loop around ``PolicyConnection``.

Wire contract of openpi's ``WebsocketPolicyServer``, so ``WebsocketClientPolicy(host, port)`` works as is:
metadata frame first, then one msgpack-numpy reply per observation with ``server_timing``; an internal
fault sends a text frame and closes with 1011. Additions: a bad observation gets a text frame naming
the problem and the connection stays open; ``Api-Key`` auth, idle timeout and a session limit.

Requests on one connection are strictly sequential (one reply per observation, as the client expects);
concurrency comes from many connections, which the policy worker batches into one forward per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from typing import Any

import numpy as np
from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from realtime_gw.app import Gateway
from realtime_gw.models.policy_types import PolicyRequest
from realtime_gw.models.runtime import NoFreeSlot, StageWorker
from realtime_gw.protocols.openpi import DecodeError, Limits, packb, unpackb
from realtime_gw.server import auth
from realtime_gw.server.metrics import SESSIONS
from realtime_gw.sessions.policy import Effect, Infer, PolicyConnection, Send, SendError

log = logging.getLogger(__name__)

OFFLOAD_DECODE_BYTES = 1 << 20
"""Frames above this are decoded on a thread so a big upload never stalls the event loop."""


async def openpi_endpoint(ws: WebSocket) -> None:
    gateway: Gateway = ws.app.state.gateway
    key, refusal = _admit(ws, gateway)
    if refusal is not None:
        await _deny(ws, *refusal)
        return
    assert key is not None and gateway.workers.policy is not None
    gateway.sessions["openpi"] += 1
    SESSIONS.labels("openpi").inc()
    try:
        await ws.accept()
        await _Loop(ws, gateway, gateway.workers.policy).run()
    finally:
        gateway.sessions["openpi"] -= 1
        gateway.access.release(key)
        SESSIONS.labels("openpi").dec()
        if ws.client_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await ws.close()


def _admit(ws: WebSocket, gateway: Gateway) -> tuple[str | None, tuple[int, str] | None]:
    """(the caller's key, None) with one of its session slots taken, or (None, (HTTP status, reason))."""
    config, access = gateway.config, gateway.access
    if not access.origin_allowed(ws.headers.get("origin"), ws.headers.get("host")):
        return None, (403, "origin not allowed")
    # Keys are compared in constant time; openpi-client sends 'Authorization: Api-Key <key>'.
    key = access.identify(auth.presented_key(ws.headers))
    if key is None:
        return None, (401, "invalid or missing API key (send 'Authorization: Api-Key <key>')")
    worker = gateway.workers.policy
    if worker is None:
        return None, (503, "the robot policy is disabled on this server (policy=none)")
    if not worker.ready:
        return None, (503, "the robot policy is still warming up; retry shortly")
    if gateway.sessions["openpi"] >= config.openpi_max_sessions:
        return None, (503, f"OpenPI session limit reached ({config.openpi_max_sessions}); retry later")
    if sum(gateway.sessions.values()) >= config.max_sessions:
        return None, (503, f"server session limit reached ({config.max_sessions}); retry later")
    if not access.acquire(key):
        return None, (
            503,
            f"session limit for this API key reached ({config.max_sessions_per_key}); retry later",
        )
    return key, None


async def _deny(ws: WebSocket, status: int, reason: str) -> None:
    # An HTTP answer reaches openpi-client as InvalidStatus with this body; a bare close would not.
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(PlainTextResponse(reason + "\n", status_code=status))
    else:
        await ws.close(code=1008 if status in (401, 403) else 1013, reason=reason[:120])


class _Loop:
    def __init__(self, ws: WebSocket, gateway: Gateway, worker: StageWorker) -> None:
        config = gateway.config
        self.ws = ws
        self.worker = worker
        self.tracebacks = config.openpi_tracebacks
        self.idle_s = config.openpi_idle_timeout_s or None
        self.limits = Limits(
            max_frame_bytes=config.openpi_max_frame_bytes, max_array_bytes=config.openpi_max_frame_bytes
        )
        self.conn = PolicyConnection(worker.backend.spec, max_robots=config.openpi_max_robots)  # type: ignore[attr-defined]
        self.prev_total_ms: float | None = None

    async def run(self) -> None:
        try:
            await self.ws.send_bytes(packb(self.conn.metadata))
            while True:
                try:
                    message = await asyncio.wait_for(self.ws.receive(), self.idle_s)
                except asyncio.TimeoutError:
                    await self.ws.close(code=1000, reason=f"idle for {self.idle_s:g} s")
                    return
                if message["type"] == "websocket.disconnect":
                    return
                started = time.monotonic()
                await self._run_effects(await self._effects_for(message), started)
        except WebSocketDisconnect:
            return
        except Exception as e:  # an internal fault: the stock contract is a text frame, then 1011
            log.exception("openpi connection failed")
            await self._fail(e)

    async def _effects_for(self, message: dict[str, Any]) -> list[Effect]:
        data = message.get("bytes")
        if data is None:
            return self.conn.reject("expected a binary msgpack-numpy frame, got a text frame")
        try:
            if len(data) > OFFLOAD_DECODE_BYTES:
                obs = await asyncio.to_thread(unpackb, data, self.limits)
            else:
                obs = unpackb(data, self.limits)
        except DecodeError as e:
            return self.conn.reject(str(e))
        return self.conn.handle(obs)

    async def _run_effects(self, effects: list[Effect], started: float) -> None:
        for effect in effects:
            if isinstance(effect, SendError):
                await self.ws.send_text(effect.message)
            elif isinstance(effect, Send):
                await self.ws.send_bytes(packb(effect.payload))
            elif isinstance(effect, Infer):
                await self._infer(effect.request, started)

    async def _infer(self, request: PolicyRequest, started: float) -> None:
        t0 = time.monotonic()
        try:
            actions = await _run_policy(self.worker, request)
        except NoFreeSlot as e:
            await self._run_effects(self.conn.on_error(f"policy busy: {e}; retry"), started)
            return
        timing = {"infer_ms": (time.monotonic() - t0) * 1000}
        if self.prev_total_ms is not None:
            timing["prev_total_ms"] = self.prev_total_ms
        for effect in self.conn.on_actions(actions):
            if isinstance(effect, Send):
                await self.ws.send_bytes(packb({**effect.payload, "server_timing": timing}))
            else:
                await self._run_effects([effect], started)
        # Server-side total of the previous request: frame received -> reply written.
        self.prev_total_ms = (time.monotonic() - started) * 1000

    async def _fail(self, error: Exception) -> None:
        if self.tracebacks:
            text = traceback.format_exc()
            reason = "Internal server error. Traceback included in previous frame."
        else:
            text = "internal server error: " + " ".join(f"{type(error).__name__}: {error}".split())
            reason = "Internal server error."
        with contextlib.suppress(Exception):
            await self.ws.send_text(text)
            await self.ws.close(code=1011, reason=reason)


async def _run_policy(worker: StageWorker, request: PolicyRequest) -> np.ndarray:
    """One action chunk from the policy worker (batched there with other robots' requests)."""
    stream = worker.submit(request)
    try:
        outputs = await stream.collect()
    finally:
        if not stream.finished:
            stream.cancel()  # e.g. server shutdown while waiting: free the slot at once
    if len(outputs) != 1:
        raise RuntimeError(f"policy worker returned {len(outputs)} outputs for one request")
    return outputs[0]
