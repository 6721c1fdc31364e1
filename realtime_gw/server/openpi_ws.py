"""The OpenPI policy socket (``/v1/realtime/robot/openpi`` and ``/``): a thin loop around ``PolicyConnection``.

Wire contract of openpi's ``WebsocketPolicyServer``, so ``WebsocketClientPolicy(host, port)`` works as is:
metadata frame first, then one msgpack-numpy reply per observation with ``server_timing``; an internal
fault sends a text frame and closes with 1011. Additions: a bad observation gets a text frame naming
the problem and the connection stays open; ``Api-Key`` auth, idle timeout and a session limit.

Requests on one connection are strictly sequential (one reply per observation, as the client expects);
concurrency comes from many connections, which the policy worker batches into one forward per step.
Streamed mode (``{"endpoint": "stream_start", ...}``, opt-in) pushes RTC-joined ``action_chunk`` frames
on the server's schedule instead; ``{"endpoint": "stream_stop"}`` returns to request/reply.
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

from realtime_gw.models.runtime import NoFreeSlot, StageWorker
from realtime_gw.protocols.openpi import DecodeError, Limits, packb, unpackb
from realtime_gw.records.policy import PolicyRequest
from realtime_gw.server.admission import Admission
from realtime_gw.server.gateway import Gateway
from realtime_gw.sessions.policy import Effect, Infer, PolicyConnection, Send, SendError, StartStream
from realtime_gw.sessions.policy_stream import RunChunk, StopStream, StreamSession

log = logging.getLogger(__name__)

OFFLOAD_DECODE_BYTES = 1 << 20
"""Frames above this are decoded on a thread so a big upload never stalls the event loop."""


async def openpi_endpoint(ws: WebSocket) -> None:
    gateway: Gateway = ws.app.state.gateway
    admission = _admit(ws, gateway)
    if isinstance(admission, tuple):
        await _deny(ws, *admission)
        return
    assert gateway.workers.policy is not None
    try:
        await ws.accept()
        await _Loop(ws, gateway, gateway.workers.policy).run()
    finally:
        admission.leave()
        if ws.client_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await ws.close()


def _admit(ws: WebSocket, gateway: Gateway) -> Admission | tuple[int, str]:
    """The admission with its session taken, or (HTTP status, reason): all before the handshake."""
    admission = Admission(gateway, "openpi")
    refusal = admission.check(ws.headers)
    if refusal is not None:
        hint = " (send 'Authorization: Api-Key <key>')" if refusal.code == "invalid_api_key" else ""
        return refusal.status, refusal.message + hint  # openpi-client sends 'Authorization: Api-Key <key>'
    worker = gateway.workers.policy
    if worker is None:
        return 503, "the robot policy is disabled on this server (policy=none)"
    if not worker.ready:
        return 503, "the robot policy is still warming up; retry shortly"
    refusal = admission.enter()
    if refusal is not None:
        return refusal.status, refusal.message
    return admission


async def _deny(ws: WebSocket, status: int, reason: str) -> None:
    # An HTTP answer reaches openpi-client as InvalidStatus with this body; a bare close would not.
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(PlainTextResponse(reason + "\n", status_code=status))
    else:
        await ws.close(code=1008 if status in (401, 403) else 1013, reason=reason[:120])


class _Loop:
    """One connection: a reader task feeds frames into a one-slot queue; this task owns the session.

    Request/reply mode handles one frame at a time (the stock contract). Streamed mode
    (``stream_start``) waits on the next frame, the chunk being computed and the scheduler's next
    wake-up at once, and runs whatever the pure ``StreamSession`` decides."""

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
        # One frame of read-ahead: enough to notice frames while a chunk computes, no unbounded buffer.
        self.frames: asyncio.Queue[tuple[dict[str, Any], float] | None] = asyncio.Queue(maxsize=1)
        self.held: list[tuple[dict[str, Any], float] | None] = []
        """A frame (or the end, None) taken from the queue by streamed mode but not handled there."""
        self.busy = False

    async def run(self) -> None:
        reader = asyncio.create_task(self._read())
        try:
            await self.ws.send_bytes(packb(self.conn.metadata))
            while True:
                item = await self._next_frame()
                if item is None:
                    return
                message, started = item
                self.busy = True  # the client is waiting for us: not idle
                try:
                    if not await self._run_effects(await self._effects_for(message), started):
                        return
                finally:
                    self.busy = False
        except WebSocketDisconnect:
            return
        except Exception as e:  # an internal fault: the stock contract is a text frame, then 1011
            log.exception("openpi connection failed")
            await self._fail(e)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def _read(self) -> None:
        """Frames -> queue; None once the client is gone or idle (the owner then returns)."""
        try:
            while True:
                try:
                    message = await asyncio.wait_for(self.ws.receive(), self.idle_s)
                except asyncio.TimeoutError:
                    if self.busy:
                        continue  # a reply is still being computed: the silence is ours
                    await self.frames.put(({"type": "idle"}, time.monotonic()))
                    return
                if message["type"] == "websocket.disconnect":
                    break
                await self.frames.put((message, time.monotonic()))
        except (WebSocketDisconnect, RuntimeError):
            pass
        await self.frames.put(None)

    async def _next_frame(self) -> tuple[dict[str, Any], float] | None:
        item = self.held.pop() if self.held else await self.frames.get()
        if item is not None and item[0]["type"] == "idle":
            await self.ws.close(code=1000, reason=f"idle for {self.idle_s:g} s")
            return None
        return item

    async def _decode(self, message: dict[str, Any]) -> tuple[Any, str | None]:
        """(decoded frame, None) or (None, why it could not be decoded)."""
        data = message.get("bytes")
        if data is None:
            return None, "expected a binary msgpack-numpy frame, got a text frame"
        try:
            if len(data) > OFFLOAD_DECODE_BYTES:
                return await asyncio.to_thread(unpackb, data, self.limits), None
            return unpackb(data, self.limits), None
        except DecodeError as e:
            return None, str(e)

    async def _effects_for(self, message: dict[str, Any]) -> list[Effect]:
        obs, error = await self._decode(message)
        if error is not None:
            return self.conn.reject(error)
        return self.conn.handle(obs)

    async def _run_effects(self, effects: list[Effect], started: float) -> bool:
        """Execute effects; False once the connection is gone."""
        for effect in effects:
            if isinstance(effect, SendError):
                await self.ws.send_text(effect.message)
            elif isinstance(effect, Send):
                await self.ws.send_bytes(packb(effect.payload))
            elif isinstance(effect, Infer):
                await self._infer(effect.request, started)
            elif isinstance(effect, StartStream) and not await self._stream(
                StreamSession(self.conn, effect.settings, started)
            ):
                return False
        return True

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

    # -- streamed mode ------------------------------------------------------------------------------------
    async def _stream(self, session: StreamSession) -> bool:
        """Run streamed mode until ``stream_stop`` (True) or the connection ends (False)."""
        await self.ws.send_bytes(packb(session.started().payload))
        scheduler = session.scheduler
        self.busy = False  # streaming robots keep sending: silence for openpi_idle_timeout_s is idle
        get: asyncio.Task[Any] | None = None
        chunk: asyncio.Task[tuple[int, np.ndarray | None, str | None]] | None = None
        try:
            while True:
                wake = scheduler.wakeup_at()
                timeout = None if wake is None else max(0.0, wake - time.monotonic())
                if get is None:
                    get = asyncio.create_task(self._next_frame())
                waiting: set[asyncio.Task[Any]] = {get} if chunk is None else {get, chunk}
                done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                now = time.monotonic()
                effects: list[Any] = []
                if chunk is not None and chunk in done:
                    index, actions, error = chunk.result()  # a worker fault raises: text frame + 1011
                    chunk = None
                    if actions is not None:
                        effects += scheduler.on_chunk(index, actions, now)
                    else:
                        effects += scheduler.on_failure(index, error or "failed", now)
                if get in done:
                    item = get.result()
                    get = None
                    if item is None:
                        return False
                    obs, error = await self._decode(item[0])
                    effects += session.reject(error) if error is not None else session.handle(obs, now)
                if not done:
                    effects += scheduler.on_tick(now)
                for effect in effects:
                    if isinstance(effect, RunChunk):
                        chunk = asyncio.create_task(self._chunk(effect))
                    elif isinstance(effect, SendError):
                        await self.ws.send_text(effect.message)
                    elif isinstance(effect, Send):
                        await self.ws.send_bytes(packb(effect.payload))
                    elif isinstance(effect, StopStream):
                        return True
        finally:
            self.busy = True
            if get is not None:
                if get.done() and not get.cancelled() and get.exception() is None:
                    self.held.append(get.result())  # raced the stop: request/reply mode gets it
                else:
                    get.cancel()
            if chunk is not None:
                chunk.cancel()  # frees the worker slot (see _run_policy)

    async def _chunk(self, run: RunChunk) -> tuple[int, np.ndarray | None, str | None]:
        try:
            return run.chunk_index, await _run_policy(self.worker, run.request), None
        except NoFreeSlot as e:
            return run.chunk_index, None, f"policy busy: {e}"

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
