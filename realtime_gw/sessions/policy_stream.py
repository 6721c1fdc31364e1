"""Streamed actions on the OpenPI socket: a pure scheduler (no I/O, no torch, time passed in).

After ``{"endpoint": "stream_start", "control_hz": f, "execute_horizon": s}`` the robot sends observations
whenever it has them and the server pushes ``action_chunk`` frames. Time is counted in control steps
from the ``stream_start`` frame: step ``k`` begins at ``t0 + k / f``. Chunk ``c`` covers steps
``[start_step, start_step + H)``: ``actions[i]`` is the action for step ``start_step + i``.

The decisions, all here:

- **which observation**: only the newest one; one that arrives while another is still waiting replaces
  it (counted in ``dropped_observations``). A chunk is computed only from an observation not used before.
- **when to compute the next chunk**: when the current one has executed ``s`` steps (at step
  ``start_step + s``), or as soon as a fresh observation arrives after that; never two at once.
- **which step it starts at**: the step at which its computation begins (its observation is the newest
  at that moment). What remains of the current chunk from there on is the RTC target, with the first
  ``d`` steps frozen: ``d`` is the client's ``inference_delay`` or ceil(the slowest of the last 8
  chunk latencies x f). The robot keeps executing the current chunk until the new one arrives; since
  the new chunk repeats those ``d`` actions exactly, switching at any step up to ``start_step + d`` is
  seamless, and later switches land in the guided overlap.
- a chunk that arrives after the previous one ran out (step >= its start + H) counts as a ``gap``.

``StreamSession`` is the streamed half of ``sessions/openpi.py``'s ``OpenPISession``, which runs the
chunks as policy jobs, feeds their results back here and adds ``server_timing`` to each chunk.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Union

import numpy as np

from realtime_gw.records.policy import PolicyRequest, PolicySpec, RtcGuide
from realtime_gw.sessions.observation import ObservationError, StreamSettings, endpoint_name
from realtime_gw.sessions.policy_request_reply import PolicyConnection, SendError, SendReply

LATENCY_WINDOW = 8


@dataclass(frozen=True, slots=True)
class RunChunk:
    """Compute this chunk; the answer comes back through ``on_chunk`` (or ``on_failure``)."""

    chunk_index: int
    start_step: int
    request: PolicyRequest


@dataclass(frozen=True, slots=True)
class StopStream:
    """Leave streamed mode (after sending the status that precedes this effect)."""


StreamEffect = Union[SendReply, SendError, RunChunk, StopStream]  # noqa: UP007 -- a runtime alias


@dataclass(slots=True)
class _Chunk:
    index: int
    start_step: int
    started_at: float
    delay: int
    actions: np.ndarray | None = None


class StreamScheduler:
    """Timing decisions of one stream; ``now`` is a monotonic time in seconds."""

    def __init__(self, settings: StreamSettings, action_horizon: int, now: float) -> None:
        self.settings = settings
        self.horizon = action_horizon
        self.t0 = now
        self.pending: PolicyRequest | None = None
        self.in_flight: _Chunk | None = None
        self.current: _Chunk | None = None
        self.next_index = 0
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self.dropped = 0
        self.delivered = 0
        self.gaps = 0

    # -- clock ------------------------------------------------------------------------------------------
    def step_at(self, now: float) -> int:
        # A hair of slack so that a wake-up timed for a step boundary lands on that step.
        return math.floor((now - self.t0) * self.settings.control_hz + 1e-6)

    def time_of(self, step: int) -> float:
        return self.t0 + step / self.settings.control_hz

    def wakeup_at(self) -> float | None:
        """When ``on_tick`` has something to decide (None: only a new event can change anything)."""
        if self.in_flight is not None or self.pending is None or self.current is None:
            return None
        return self.time_of(self.current.start_step + self.settings.execute_horizon)

    def estimated_delay(self) -> int:
        if self.settings.inference_delay is not None:
            return self.settings.inference_delay
        if not self.latencies:
            return 0
        return math.ceil(max(self.latencies) * self.settings.control_hz - 1e-9)

    # -- events -----------------------------------------------------------------------------------------
    def on_observation(self, request: PolicyRequest, now: float) -> list[StreamEffect]:
        if self.pending is not None:
            self.dropped += 1  # stale: a newer observation replaces it before any chunk used it
        self.pending = request
        return self._maybe_start(now)

    def on_tick(self, now: float) -> list[StreamEffect]:
        return self._maybe_start(now)

    def on_chunk(self, chunk_index: int, actions: np.ndarray, now: float) -> list[StreamEffect]:
        chunk = self.in_flight
        if chunk is None or chunk.index != chunk_index:
            return []  # from before a reset: nobody is waiting for it
        self.in_flight = None
        self.latencies.append(now - chunk.started_at)
        step = self.step_at(now)
        if self.current is not None and step >= self.current.start_step + self.horizon:
            self.gaps += 1  # the robot ran out of actions before this chunk arrived
        chunk.actions = actions
        self.current = chunk
        self.delivered += 1
        payload = {
            "type": "action_chunk",
            "chunk_index": chunk.index,
            "start_step": chunk.start_step,
            "actions": actions,
            "inference_delay": chunk.delay,
            "step": step,
        }
        return [SendReply(payload), *self._maybe_start(now)]

    def on_failure(self, chunk_index: int, message: str, now: float) -> list[StreamEffect]:
        """The chunk was refused (e.g. the worker was full); the next observation tries again."""
        if self.in_flight is None or self.in_flight.index != chunk_index:
            return []
        self.in_flight = None
        return [SendError(f"chunk {chunk_index} failed: {message}"), *self._maybe_start(now)]

    def reset(self) -> None:
        """Forget the current chunk (the next one starts fresh, without RTC); drop the one computing."""
        self.current = None
        self.in_flight = None
        self.pending = None

    def stats(self, now: float) -> dict[str, Any]:
        return {
            "chunks": self.delivered,
            "dropped_observations": self.dropped,
            "gaps": self.gaps,
            "step": self.step_at(now),
        }

    # -- the decision -------------------------------------------------------------------------------------
    def _maybe_start(self, now: float) -> list[StreamEffect]:
        if self.in_flight is not None or self.pending is None:
            return []
        step = self.step_at(now)
        rtc = None
        if self.current is not None:
            assert self.current.actions is not None
            if step < self.current.start_step + self.settings.execute_horizon:
                return []  # the current chunk is still inside its execute horizon
            remaining = self.current.actions[step - self.current.start_step :]
            if self.settings.rtc and len(remaining):
                delay = min(self.estimated_delay(), len(remaining), self.horizon - 1)
                rtc = RtcGuide(
                    prev_actions=np.ascontiguousarray(remaining, np.float32),
                    inference_delay=delay,
                    execute_horizon=self.settings.execute_horizon,
                )
        request = replace(self.pending, rtc=rtc)
        self.pending = None
        chunk = _Chunk(self.next_index, step, now, 0 if rtc is None else rtc.inference_delay)
        self.next_index += 1
        self.in_flight = chunk
        return [RunChunk(chunk.index, chunk.start_step, request)]


class StreamSession:
    """Streamed mode of one connection: frames in, effects out (observations validated as usual)."""

    def __init__(self, conn: PolicyConnection, settings: StreamSettings, now: float) -> None:
        self.conn = conn
        self.spec: PolicySpec = conn.spec
        self.scheduler = StreamScheduler(settings, conn.spec.action_horizon, now)

    def started(self) -> SendReply:
        s = self.scheduler.settings
        return SendReply(
            {
                "status": "stream started",
                "control_hz": s.control_hz,
                "execute_horizon": s.execute_horizon,
                "inference_delay": s.inference_delay,
                "action_horizon": self.spec.action_horizon,
                "rtc": s.rtc,
                "step": 0,
            }
        )

    def handle(self, msg: Any, now: float) -> list[StreamEffect]:
        try:
            if isinstance(msg, dict) and "endpoint" in msg:
                endpoint = endpoint_name(msg)
                if endpoint == "stream_stop":
                    stats = self.scheduler.stats(now)
                    return [SendReply({"status": "stream stopped", **stats}), StopStream()]
                if endpoint == "reset":
                    self.scheduler.reset()
                    return [*self.conn.reset(msg)]
                raise ObservationError("a stream is already running; send {'endpoint': 'stream_stop'} first")
            request = self.conn.observe(msg)
        except ObservationError as e:
            return [SendError(str(e))]
        return self.scheduler.on_observation(request, now)

    def reject(self, reason: str) -> list[StreamEffect]:
        return [SendError(f"could not decode observation: {reason}")]
