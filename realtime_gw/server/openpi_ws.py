"""The OpenPI policy socket (``/v1/realtime/robot/openpi`` and ``/``): a thin loop around ``OpenPISession``.

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
from realtime_gw.protocols.openpi import DecodeError, FrameLimits, packb, unpackb
from realtime_gw.records.policy import PolicyRequest
from realtime_gw.server.admission import Admission
from realtime_gw.server.gateway import Gateway
from realtime_gw.sessions.events import unhandled
from realtime_gw.sessions.openpi import (
    CancelPolicy,
    CloseSocket,
    Disconnected,
    FrameReceived,
    FrameUndecodable,
    IdleTimeout,
    Opened,
    OpenPIEffect,
    OpenPIEvent,
    OpenPISession,
    PolicyDone,
    PolicyRefused,
    RunPolicy,
    Wakeup,
)
from realtime_gw.sessions.policy_request_reply import SendError, SendReply

log = logging.getLogger(__name__)

OFFLOAD_DECODE_BYTES = 1 << 20
"""Frames above this are decoded on a thread so a big upload never stalls the event loop."""


class _NotReading(Exception):
    """A write blocked for ``send_timeout_s``: the robot stopped reading."""


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
    """One connection. This task owns the session and is the one runner of its effects: it waits on
    whatever the session can use next (the next frame, only while the session takes frames; the
    policy jobs it started; its wake-up time; the idle deadline), hands in what happened as one event
    and executes the effects that come back. Modes and rules live in ``OpenPISession``, not here."""

    def __init__(self, ws: WebSocket, gateway: Gateway, worker: StageWorker) -> None:
        config = gateway.config
        self.ws = ws
        self.worker = worker
        self.tracebacks = config.openpi_tracebacks
        self.send_timeout_s = config.send_timeout_s
        self.idle_s: float | None = config.openpi_idle_timeout_s or None
        self.limits = FrameLimits(
            max_frame_bytes=config.openpi_max_frame_bytes, max_array_bytes=config.openpi_max_frame_bytes
        )
        spec = worker.describe().policy_spec
        if spec is None:
            raise RuntimeError(f"{worker.name} is not a policy stage: it describes no policy spec")
        self.session = OpenPISession(spec, max_robots=config.openpi_max_robots)
        self.frame: asyncio.Task[tuple[OpenPIEvent, float]] | None = None
        """The next frame being read and decoded: one frame of read-ahead, never an unbounded buffer."""
        self.jobs: dict[int, asyncio.Task[OpenPIEvent]] = {}
        self.idle_at: float | None = None

    async def run(self) -> None:
        try:
            now = time.monotonic()
            self._arm_idle(now)
            await self._execute(self.session.handle(Opened(), now))
            while not self.session.closed:
                await self._step()
        except WebSocketDisconnect:
            return
        except _NotReading:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ws.close(code=1008, reason="client is not reading"), 2.0)
        except Exception as e:  # an internal fault: the stock contract is a text frame, then 1011
            log.exception("openpi connection failed")
            await self._fail(e)
        finally:
            pending = [t for t in (self.frame, *self.jobs.values()) if t is not None]
            for task in pending:
                task.cancel()  # a job's cancel frees its worker slot (see _run_policy)
            await asyncio.gather(*pending, return_exceptions=True)

    async def _step(self) -> None:
        """Wait for the first thing the session can use, hand it in, run what it decides."""
        session = self.session
        waiting: set[asyncio.Task[Any]] = set(self.jobs.values())
        if session.takes_frames:
            if self.frame is None:
                self.frame = asyncio.create_task(self._receive())
            waiting.add(self.frame)
        if not waiting:
            raise RuntimeError(f"the OpenPI session waits for nothing in state {session.state.name}")
        wake = session.wakeup_at()
        deadlines = [t for t in (wake, self.idle_at) if t is not None]
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        # Results first, oldest job first, then the frame: a chunk that is ready is not held up.
        for job, task in sorted(self.jobs.items()):
            if task in done and self.jobs.get(job) is task and not session.closed:
                del self.jobs[job]
                await self._handle(task.result())  # a worker fault raises here: text frame + 1011
        if self.frame is not None and self.frame in done and session.takes_frames:
            event, received_at = self.frame.result()
            self.frame = None
            self._arm_idle(received_at)
            await self._handle(event)
        if not done:
            if wake is not None and (self.idle_at is None or wake <= self.idle_at):
                await self._handle(Wakeup())
            elif self.idle_s is not None:
                await self._handle(IdleTimeout(self.idle_s))
                self._arm_idle(time.monotonic())  # still open: the client was waiting for our reply

    async def _handle(self, event: OpenPIEvent) -> None:
        await self._execute(self.session.handle(event, time.monotonic()))

    async def _execute(self, effects: list[OpenPIEffect]) -> None:
        """The one interpreter of the session's effects: every ``OpenPIEffect`` type has its case."""
        for effect in effects:
            match effect:
                case SendReply():
                    await self._send(packb(effect.payload))
                case SendError():
                    await self._send(effect.message)
                case RunPolicy():
                    self.jobs[effect.job] = asyncio.create_task(self._run(effect))
                case CancelPolicy():
                    task = self.jobs.pop(effect.job, None)
                    if task is not None:
                        _drop(task)
                case CloseSocket():
                    await self.ws.close(code=effect.code, reason=effect.reason)
                case _:
                    unhandled(effect)

    async def _send(self, data: bytes | str) -> None:
        """One write, bounded: a robot that stops reading is closed (1008), not waited on for ever."""
        try:
            async with asyncio.timeout(self.send_timeout_s):
                if isinstance(data, bytes):
                    await self.ws.send_bytes(data)
                else:
                    await self.ws.send_text(data)
        except TimeoutError:
            raise _NotReading from None

    def _arm_idle(self, now: float) -> None:
        self.idle_at = None if self.idle_s is None else now + self.idle_s

    async def _receive(self) -> tuple[OpenPIEvent, float]:
        """The next frame, decoded, and when it arrived; ``Disconnected`` once the client is gone."""
        try:
            message = await self.ws.receive()
        except (WebSocketDisconnect, RuntimeError):
            return Disconnected(), time.monotonic()
        received_at = time.monotonic()
        if message["type"] == "websocket.disconnect":
            return Disconnected(), received_at
        return await self._decode(message, received_at), received_at

    async def _decode(self, message: dict[str, Any], received_at: float) -> FrameReceived | FrameUndecodable:
        data = message.get("bytes")
        if data is None:
            return FrameUndecodable("expected a binary msgpack-numpy frame, got a text frame")
        try:
            if len(data) > OFFLOAD_DECODE_BYTES:
                return FrameReceived(await asyncio.to_thread(unpackb, data, self.limits), received_at)
            return FrameReceived(unpackb(data, self.limits), received_at)
        except DecodeError as e:
            return FrameUndecodable(str(e))

    async def _run(self, run: RunPolicy) -> OpenPIEvent:
        try:
            return PolicyDone(run.job, await _run_policy(self.worker, run.request))
        except NoFreeSlot as e:
            return PolicyRefused(run.job, str(e))

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


def _drop(task: asyncio.Task[Any]) -> None:
    """A job nobody waits for: cancel it (frees its worker slot), or discard its outcome if it is in."""
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()  # retrieved: asyncio must not report it as never retrieved


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
