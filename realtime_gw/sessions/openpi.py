"""The OpenPI socket's session: one pure object that owns both modes (no I/O, no asyncio, no torch).

``OpenPISession.handle(event, now) -> list[effect]`` is all the transport calls. It feeds in what
happened (a decoded frame, a policy job's result, the wake-up time it was asked for, silence) and
executes what comes back (send a frame, run or cancel a policy job, close). Every decision lives
here: which mode the connection is in, whether a frame may be taken now, which results are stale,
what an idle connection gets, and the ``server_timing`` of every action reply, in both modes.

States (h11-style: an event that cannot happen in a state raises ``OpenPIStateError``)::

    OPENING --Opened--> REQUEST_REPLY --observation--> INFERRING --PolicyDone/Refused--> REQUEST_REPLY
                        REQUEST_REPLY --stream_start--> STREAMING --stream_stop--> REQUEST_REPLY
    any --Disconnected, or silence outside INFERRING--> CLOSED

Request/reply is the stock contract: one reply per observation, in order, so while INFERRING the
session takes no frame (the transport leaves them unread). Streamed mode takes frames, chunk results
and wake-ups in any order. The modes' rules are parts: ``PolicyConnection`` (``sessions/policy_request_reply.py``)
and ``StreamSession`` (``sessions/policy_stream.py``); this object routes between them and numbers
the policy jobs, so a result always finds the request it answers.

With an openpi robot preset (``spec.robot``) every job's actions go through the robot's output
transform here, once for both modes, before a reply or the stream scheduler sees them; an RTC target
(the client's, or the scheduler's rest of the previous chunk) goes the other way, into the space the
model denoises in, and the frozen steps of the answer are the robot's own values, bit for bit.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any, Union

import numpy as np

from realtime_gw.protocols.action_contract import ReplyRequest, reply_fields
from realtime_gw.records.policy import PolicyRequest, PolicySpec
from realtime_gw.sessions.observation import StreamSettings
from realtime_gw.sessions.policy_request_reply import (
    Infer,
    PolicyConnection,
    SendError,
    SendReply,
    StartStream,
)
from realtime_gw.sessions.policy_stream import RunChunk, StopStream, StreamEffect, StreamSession

IDLE_CLOSE_CODE = 1000


class OpenPIStateError(RuntimeError):
    """An event that cannot happen in the session's state: a bug of the transport, not of the client."""


class OpenPIState(enum.Enum):
    OPENING = "opening"
    """Accepted; the metadata frame goes first."""
    REQUEST_REPLY = "request_reply"
    """Request/reply mode, waiting for the next frame."""
    INFERRING = "inferring"
    """Request/reply mode, the client waits for this reply: frames wait until it is sent."""
    STREAMING = "streaming"
    """Streamed mode: frames, chunk results and wake-ups in any order."""
    CLOSED = "closed"


# -- events -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Opened:
    """The socket is accepted."""


@dataclass(frozen=True, slots=True)
class FrameReceived:
    message: Any
    """The decoded msgpack-numpy value."""
    received_at: float
    """When the frame arrived (before decoding): the start of the server's total for this request."""


@dataclass(frozen=True, slots=True)
class FrameUndecodable:
    reason: str


@dataclass(frozen=True, slots=True)
class PolicyDone:
    job: int
    actions: np.ndarray


@dataclass(frozen=True, slots=True)
class PolicyRefused:
    """The worker refused the job at once (no free slot); the client may retry."""

    job: int
    reason: str


@dataclass(frozen=True, slots=True)
class Wakeup:
    """The time ``wakeup_at()`` named has come."""


@dataclass(frozen=True, slots=True)
class IdleTimeout:
    """No frame for ``seconds``."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The client is gone."""


OpenPIEvent = Union[  # noqa: UP007 -- a runtime alias (py3.10)
    Opened, FrameReceived, FrameUndecodable, PolicyDone, PolicyRefused, Wakeup, IdleTimeout, Disconnected
]


# -- effects (besides SendReply and SendError) --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RunPolicy:
    """Run the policy on ``request``; answer with ``PolicyDone`` or ``PolicyRefused`` for ``job``."""

    job: int
    request: PolicyRequest


@dataclass(frozen=True, slots=True)
class CancelPolicy:
    """Nobody waits for this job any more: free its worker slot; no answer is expected."""

    job: int


@dataclass(frozen=True, slots=True)
class CloseSocket:
    code: int
    reason: str


OpenPIEffect = Union[SendReply, SendError, RunPolicy, CancelPolicy, CloseSocket]  # noqa: UP007


@dataclass(frozen=True, slots=True)
class _Job:
    started_at: float
    received_at: float | None = None
    """Request/reply: when its observation arrived (for the next reply's ``prev_total_ms``)."""
    chunk_index: int | None = None
    """Streamed: the scheduler's chunk it computes."""
    state: np.ndarray | None = None
    """A robot preset's model-space state of the observation (its output transform needs it)."""
    frozen: np.ndarray | None = None
    """RTC: the robot-space actions the reply must repeat exactly (its first ``inference_delay`` steps)."""
    reply: ReplyRequest | None = None
    """The observation opted in to the action contract's reply fields."""
    frozen_steps: int = 0
    """RTC's ``inference_delay`` of the request (0 without RTC)."""


class OpenPISession:
    def __init__(self, spec: PolicySpec, max_robots: int = 64, streaming: bool = True) -> None:
        self.conn = PolicyConnection(spec, max_robots=max_robots)
        self.streaming = streaming
        """False where streamed actions cannot be served (an in-process, call-by-call runner)."""
        self.state = OpenPIState.OPENING
        self.stream: StreamSession | None = None
        self._jobs: dict[int, _Job] = {}
        self._next_job = 0
        self._prev_total_ms: float | None = None

    @property
    def spec(self) -> PolicySpec:
        return self.conn.spec

    @property
    def metadata(self) -> dict[str, Any]:
        return self.conn.metadata

    @property
    def closed(self) -> bool:
        return self.state is OpenPIState.CLOSED

    @property
    def takes_frames(self) -> bool:
        """Whether the next frame may be handed in now (request/reply keeps strict order)."""
        return self.state in (OpenPIState.REQUEST_REPLY, OpenPIState.STREAMING)

    def wakeup_at(self) -> float | None:
        """When to send ``Wakeup`` (None: only another event can change anything)."""
        if self.stream is None:
            return None
        return self.stream.scheduler.wakeup_at()

    # -- events -----------------------------------------------------------------------------------------
    def handle(self, event: OpenPIEvent, now: float) -> list[OpenPIEffect]:
        if self.state is OpenPIState.CLOSED:
            raise OpenPIStateError(f"{type(event).__name__} after the session closed")
        if isinstance(event, Disconnected):
            return self._close()
        if isinstance(event, Opened):
            self._expect(event, OpenPIState.OPENING)
            self.state = OpenPIState.REQUEST_REPLY
            return [SendReply(self.metadata)]
        if self.state is OpenPIState.OPENING:
            raise OpenPIStateError(f"{type(event).__name__} before Opened: the metadata frame goes first")
        if isinstance(event, (FrameReceived, FrameUndecodable)):
            self._expect(event, OpenPIState.REQUEST_REPLY, OpenPIState.STREAMING)
            if self.stream is not None:
                return self._streamed_frame(event, now)
            return self._frame(event, now)
        if isinstance(event, (PolicyDone, PolicyRefused)):
            return self._result(event, now)
        if isinstance(event, Wakeup):
            self._expect(event, OpenPIState.STREAMING)
            assert self.stream is not None
            return self._from_stream(self.stream.scheduler.on_tick(now), now)
        if isinstance(event, IdleTimeout):
            if self.state is OpenPIState.INFERRING:
                return []  # the client waits for our reply: the silence is ours
            return [*self._close(), CloseSocket(IDLE_CLOSE_CODE, f"idle for {event.seconds:g} s")]
        raise TypeError(f"not an OpenPI session event: {event!r}")

    # -- request/reply ----------------------------------------------------------------------------------
    def _frame(self, event: FrameReceived | FrameUndecodable, now: float) -> list[OpenPIEffect]:
        if isinstance(event, FrameUndecodable):
            return [*self.conn.reject(event.reason)]
        out: list[OpenPIEffect] = []
        for effect in self.conn.handle(event.message):
            if isinstance(effect, Infer):
                self.state = OpenPIState.INFERRING
                out.append(self._start(effect.request, _Job(now, received_at=event.received_at)))
            elif isinstance(effect, StartStream):
                out.append(self._start_stream(effect.settings, now))
            else:
                out.append(effect)
        return out

    def _start_stream(self, settings: StreamSettings, now: float) -> SendReply | SendError:
        if not self.streaming:
            return SendError("streamed actions are not served here; this policy is request/reply only")
        self.stream = StreamSession(self.conn, settings, now)
        self.state = OpenPIState.STREAMING
        return self.stream.started()

    # -- streamed ---------------------------------------------------------------------------------------
    def _streamed_frame(self, event: FrameReceived | FrameUndecodable, now: float) -> list[OpenPIEffect]:
        assert self.stream is not None
        if isinstance(event, FrameUndecodable):
            return self._from_stream(self.stream.reject(event.reason), now)
        return self._from_stream(self.stream.handle(event.message, now), now)

    def _from_stream(self, effects: list[StreamEffect], now: float) -> list[OpenPIEffect]:
        out: list[OpenPIEffect] = []
        for effect in effects:
            if isinstance(effect, RunChunk):
                out.append(self._start(effect.request, _Job(now, chunk_index=effect.chunk_index)))
            elif isinstance(effect, StopStream):
                self.stream = None
                self.state = OpenPIState.REQUEST_REPLY
            else:
                out.append(effect)
        return out + self._cancel_unwanted()

    def _cancel_unwanted(self) -> list[OpenPIEffect]:
        """Chunks the stream no longer waits for (it stopped, or a reset dropped them): free their slots."""
        in_flight = None if self.stream is None else self.stream.scheduler.in_flight
        unwanted = [
            job
            for job, j in self._jobs.items()
            if j.chunk_index is not None and (in_flight is None or in_flight.index != j.chunk_index)
        ]
        for job in unwanted:
            del self._jobs[job]
        return [CancelPolicy(job) for job in unwanted]

    # -- policy jobs, both modes ------------------------------------------------------------------------
    def _start(self, request: PolicyRequest, job: _Job) -> RunPolicy:
        if request.reply is not None:
            delay = 0 if request.rtc is None else request.rtc.inference_delay
            job = replace(job, reply=request.reply, frozen_steps=delay)
        if not self.spec.robot.generic:
            request, job = self._to_model(request, job)
        number = self._next_job
        self._next_job += 1
        self._jobs[number] = job
        return RunPolicy(number, request)

    def _result(self, event: PolicyDone | PolicyRefused, now: float) -> list[OpenPIEffect]:
        job = self._jobs.pop(event.job, None)
        if job is None:
            raise OpenPIStateError(f"{type(event).__name__} for job {event.job}, which is not running")
        if job.chunk_index is None:
            self._expect(event, OpenPIState.INFERRING)
            self.state = OpenPIState.REQUEST_REPLY
            if isinstance(event, PolicyRefused):
                return [*self.conn.on_error(f"policy busy: {event.reason}; retry")]
            (reply,) = self.conn.on_actions(self._to_robot(event.actions, job))
            return [self._timed(reply, job, now)]
        self._expect(event, OpenPIState.STREAMING)
        assert self.stream is not None
        scheduler = self.stream.scheduler
        if isinstance(event, PolicyRefused):
            failed = scheduler.on_failure(job.chunk_index, f"policy busy: {event.reason}", now)
            return self._from_stream(failed, now)
        sent = scheduler.on_chunk(job.chunk_index, self._to_robot(event.actions, job), now)
        return self._from_stream(
            [self._timed(e, job, now) if isinstance(e, SendReply) else e for e in sent], now
        )

    # -- a robot preset's action space ------------------------------------------------------------------
    def _to_model(self, request: PolicyRequest, job: _Job) -> tuple[PolicyRequest, _Job]:
        """Keep what the output transform needs; an RTC target goes to the space the model denoises in."""
        robot, state = self.spec.robot, request.state[-1]
        frozen = None
        if request.rtc is not None:
            prev = request.rtc.prev_actions
            frozen = prev[: request.rtc.inference_delay].copy()
            request = replace(request, rtc=replace(request.rtc, prev_actions=robot.actions_to_model(prev, state)))
        return request, replace(job, state=state, frozen=frozen)

    def _to_robot(self, actions: np.ndarray, job: _Job) -> np.ndarray:
        """Model-space actions (un-normalized by the worker) -> the robot's, with RTC's frozen steps exact."""
        if job.state is None:
            return actions  # generic: the model's action space is the robot's
        expected = (self.spec.action_horizon, self.spec.action_dim)
        if actions.shape != expected:
            raise RuntimeError(f"policy returned {actions.dtype} {actions.shape}, expected float32 {expected}")
        out = self.spec.robot.outputs(actions, job.state)
        if job.frozen is not None and len(job.frozen):
            # The round trip through the robot's conversions is exact only to rounding; the executed
            # steps must be bit-identical to what the robot is executing.
            out[: len(job.frozen)] = job.frozen
        return out

    def _timed(self, reply: SendReply, job: _Job, now: float) -> SendReply:
        """The one place ``server_timing`` is added, to replies and to streamed chunks alike."""
        timing: dict[str, float] = {"infer_ms": (now - job.started_at) * 1000}
        if job.received_at is not None:
            # As the stock server: the previous request's total (frame received -> reply).
            if self._prev_total_ms is not None:
                timing["prev_total_ms"] = self._prev_total_ms
            self._prev_total_ms = (now - job.received_at) * 1000
        # The action contract's fields, only for an observation that asked for them (stock clients never do).
        contract = {} if job.reply is None else reply_fields(self.spec.contract, job.reply, job.frozen_steps)
        return SendReply({**reply.payload, **contract, "server_timing": timing})

    # -- helpers ----------------------------------------------------------------------------------------
    def _close(self) -> list[OpenPIEffect]:
        """Cancel every job still running and end the session."""
        cancels: list[OpenPIEffect] = [CancelPolicy(job) for job in self._jobs]
        self._jobs.clear()
        self.stream = None
        self.state = OpenPIState.CLOSED
        return cancels

    def _expect(self, event: OpenPIEvent, *states: OpenPIState) -> None:
        if self.state not in states:
            allowed = " or ".join(s.name for s in states)
            raise OpenPIStateError(f"{type(event).__name__} in state {self.state.name}; it needs {allowed}")
