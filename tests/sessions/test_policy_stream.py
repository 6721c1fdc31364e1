"""Streamed actions and the ``rtc`` field, as pure state machines: events in, effects out (no server)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from realtime_gw.records.policy import PolicyRequest
from realtime_gw.sessions.observation import StreamSettings
from realtime_gw.sessions.policy_request_reply import (
    Infer,
    PolicyConnection,
    SendError,
    SendReply,
    StartStream,
)
from realtime_gw.sessions.policy_stream import RunChunk, StopStream, StreamScheduler, StreamSession
from tests.sessions.policy_helpers import A, H, obs, spec


def req(i: int) -> PolicyRequest:
    return PolicyConnection(spec()).observe(obs(i))


def chunk(value: float) -> np.ndarray:
    return (np.arange(H, dtype=np.float32)[:, None] + value).repeat(A, 1)


# -- the rtc field and stream_start in the request/reply session -------------------------------------------
def test_rtc_field_is_parsed_with_defaults() -> None:
    conn = PolicyConnection(spec())
    prev = np.ones((6, A), np.float64)
    (effect,) = conn.handle(obs(rtc={"prev_actions": prev, "inference_delay": 2}))
    assert isinstance(effect, Infer) and effect.request.rtc is not None
    rtc = effect.request.rtc
    assert rtc.prev_actions.dtype == np.float32 and rtc.prev_actions.shape == (6, A)
    assert rtc.inference_delay == 2 and rtc.execute_horizon == H - 6  # the remainder of a chunk
    conn.on_actions(np.zeros((H, A), np.float32))
    (effect,) = conn.handle(
        obs(rtc={"prev_actions": [[0, 1]] * 3, "inference_delay": 0, "execute_horizon": 7})
    )
    assert (
        isinstance(effect, Infer)
        and effect.request.rtc is not None
        and effect.request.rtc.execute_horizon == 7
    )


@pytest.mark.parametrize(
    ("rtc", "message"),
    [
        ([1, 2], "'rtc' must be a map {prev_actions, inference_delay, execute_horizon}, got list"),
        ({"inference_delay": 1}, "'rtc.prev_actions' must be a float array of shape (K, 2), got NoneType"),
        ({"prev_actions": np.zeros((11, A)), "inference_delay": 1}, "with 1 <= K <= 10"),
        ({"prev_actions": np.zeros((4, 3)), "inference_delay": 1}, "must have shape (K, 2)"),
        (
            {"prev_actions": np.zeros((4, A)), "inference_delay": 5},
            "'inference_delay' must be an integer from 0 to 4",
        ),
        ({"prev_actions": np.zeros((4, A))}, "'inference_delay' must be an integer from 0 to 4, got None"),
        (
            {"prev_actions": np.zeros((4, A)), "inference_delay": 1, "execute_horizon": 0},
            "'execute_horizon' must be an integer from 1 to 10",
        ),
        ({"prev_actions": np.full((4, A), np.nan), "inference_delay": 1}, "contains NaN or infinity"),
        ({"prev_actions": np.array([["a", "b"]]), "inference_delay": 0}, "must be a float array"),
    ],
)
def test_rtc_field_errors(rtc: Any, message: str) -> None:
    conn = PolicyConnection(spec())
    (effect,) = conn.handle(obs(rtc=rtc))
    assert isinstance(effect, SendError) and message in effect.message, effect


def test_stream_start_is_checked() -> None:
    conn = PolicyConnection(spec())
    (effect,) = conn.handle({"endpoint": "stream_start", "control_hz": 50})
    assert effect == StartStream(StreamSettings(control_hz=50.0, execute_horizon=H // 2))
    (effect,) = conn.handle(
        {
            "endpoint": "stream_start",
            "control_hz": 10.5,
            "execute_horizon": 3,
            "inference_delay": 2,
            "rtc": False,
        }
    )
    assert effect == StartStream(StreamSettings(10.5, 3, 2, rtc=False))
    for msg, message in [
        ({"endpoint": "stream_start"}, "stream_start needs 'control_hz'"),
        ({"endpoint": "stream_start", "control_hz": 0}, "'control_hz' must be > 0 and <= 1000"),
        ({"endpoint": "stream_start", "control_hz": True}, "needs 'control_hz'"),
        ({"endpoint": "stream_start", "control_hz": 5, "execute_horizon": 11}, "from 1 to 10"),
        (
            {"endpoint": "stream_start", "control_hz": 5, "execute_horizon": 8, "inference_delay": 3},
            "must be <= action_horizon - execute_horizon (2)",
        ),
        ({"endpoint": "stream_start", "control_hz": 5, "rtc": "yes"}, "'rtc' must be true or false"),
        ({"endpoint": "stream_stop"}, "no stream is running"),
    ]:
        (effect,) = conn.handle(msg)
        assert isinstance(effect, SendError) and message in effect.message, (msg, effect)


# -- the scheduler ------------------------------------------------------------------------------------------
def test_first_chunk_then_one_every_execute_horizon() -> None:
    s = StreamScheduler(StreamSettings(control_hz=10, execute_horizon=4), H, now=100.0)
    assert s.wakeup_at() is None
    (run,) = s.on_observation(req(0), now=100.25)  # step 2
    assert isinstance(run, RunChunk) and (run.chunk_index, run.start_step, run.request.rtc) == (0, 2, None)
    assert s.on_observation(req(1), now=100.3) == []  # one chunk at a time; this one waits
    assert s.on_observation(req(2), now=100.32) == [] and s.dropped == 1  # ...and replaces the older one
    (sent,) = s.on_chunk(0, chunk(0), now=100.38)  # 130 ms latency
    assert isinstance(sent, SendReply) and sent.payload["type"] == "action_chunk"
    assert sent.payload["start_step"] == 2 and sent.payload["chunk_index"] == 0 and sent.payload["step"] == 3
    assert s.wakeup_at() == pytest.approx(100.6)  # step 2 + 4
    assert s.on_tick(100.59) == []
    (run,) = s.on_tick(100.6)
    assert isinstance(run, RunChunk) and run.start_step == 6 and run.chunk_index == 1
    assert run.request.state[0, 0] == 2.0  # the newest observation
    rtc = run.request.rtc
    assert rtc is not None and rtc.execute_horizon == 4
    np.testing.assert_array_equal(rtc.prev_actions, chunk(0)[4:])  # aligned to step 6
    assert rtc.inference_delay == 2  # ceil(0.13 s * 10 Hz)


def test_a_chunk_needs_a_fresh_observation() -> None:
    s = StreamScheduler(StreamSettings(control_hz=10, execute_horizon=4), H, now=0.0)
    s.on_observation(req(0), now=0.0)
    s.on_chunk(0, chunk(0), now=0.05)
    assert s.wakeup_at() is None and s.on_tick(0.4) == []  # due at step 4, but nothing new to act on
    (run,) = s.on_observation(req(1), now=0.62)  # arrives at step 6: the chunk starts there
    assert isinstance(run, RunChunk) and run.start_step == 6
    assert run.request.rtc is not None and len(run.request.rtc.prev_actions) == H - 6


def test_fixed_delay_no_rtc_late_chunks_and_reset() -> None:
    s = StreamScheduler(StreamSettings(control_hz=10, execute_horizon=5, inference_delay=3), H, now=0.0)
    s.on_observation(req(0), now=0.0)
    s.on_observation(req(1), now=0.01)
    (_, run) = s.on_chunk(0, chunk(0), now=0.55)  # late: step 5 is already due
    assert isinstance(run, RunChunk) and run.request.rtc is not None and run.request.rtc.inference_delay == 3
    s.on_observation(req(2), now=0.6)
    (_, run) = s.on_chunk(1, chunk(1), now=1.6)  # step 16 >= 5 + 10: the robot ran out before it arrived
    assert s.gaps == 1 and isinstance(run, RunChunk) and run.chunk_index == 2  # from the waiting req(2)
    s.reset()
    assert s.on_chunk(2, chunk(2), now=1.7) == []  # computing before the reset: nobody waits for it
    (run,) = s.on_observation(req(3), now=1.8)
    assert isinstance(run, RunChunk) and run.request.rtc is None and run.chunk_index == 3
    assert s.on_chunk(1, chunk(1), now=1.9) == []  # stale index
    plain = StreamScheduler(StreamSettings(control_hz=10, execute_horizon=5, rtc=False), H, now=0.0)
    plain.on_observation(req(0), now=0.0)
    plain.on_chunk(0, chunk(0), now=0.1)
    (run,) = plain.on_observation(req(1), now=0.5)
    assert isinstance(run, RunChunk) and run.request.rtc is None
    (err, _) = plain.on_failure(1, "policy busy", now=0.6) + [None]
    assert isinstance(err, SendError) and "chunk 1 failed: policy busy" in err.message


@pytest.mark.parametrize("latency_steps", [0.5, 1.7, 3.2])
def test_simulated_stream_has_contiguous_chunks(latency_steps: float) -> None:
    """A robot sending observations at 3x the control rate, chunks taking ``latency_steps`` steps: chunks
    come in order, each starts s steps after the last, none arrives after the previous one ran out."""
    hz, s_steps = 20.0, 4
    sched = StreamScheduler(StreamSettings(control_hz=hz, execute_horizon=s_steps), H, now=0.0)
    events: list[tuple[float, str, Any]] = [(k / (3 * hz), "obs", k) for k in range(300)]
    delivered: list[dict[str, Any]] = []
    t = 0.0
    while events:
        events.sort(key=lambda e: e[0])
        wake = sched.wakeup_at()
        if wake is not None and wake < events[0][0]:
            t, kind, item = wake, "tick", None
        else:
            t, kind, item = events.pop(0)
        if kind == "obs":
            effects = sched.on_observation(req(item), t)
        elif kind == "done":
            effects = sched.on_chunk(item[0], item[1], t)
        else:
            effects = sched.on_tick(t)
        for e in effects:
            if isinstance(e, RunChunk):
                events.append((t + latency_steps / hz, "done", (e.chunk_index, chunk(float(e.chunk_index)))))
            elif isinstance(e, SendReply):
                delivered.append(e.payload)
    starts = [p["start_step"] for p in delivered]
    assert [p["chunk_index"] for p in delivered] == list(range(len(delivered))) and len(delivered) > 20
    assert set(np.diff(starts).tolist()) == {s_steps}
    assert sched.gaps == 0
    expected_delay = int(np.ceil(latency_steps - 1e-9))
    assert {p["inference_delay"] for p in delivered[2:]} == {expected_delay}


# -- the streamed session ------------------------------------------------------------------------------------
def test_stream_session_routes_frames() -> None:
    conn = PolicyConnection(spec())
    session = StreamSession(conn, StreamSettings(control_hz=10, execute_horizon=5), now=0.0)
    assert session.started().payload["status"] == "stream started"
    assert session.started().payload["action_horizon"] == H
    (run,) = session.handle(obs(1), now=0.0)
    assert isinstance(run, RunChunk)
    (err,) = session.handle(obs(1, **{"observation/state": np.zeros(2)}), now=0.01)
    assert isinstance(err, SendError) and "must have length 3" in err.message
    (err,) = session.handle({"endpoint": "stream_start", "control_hz": 5}, now=0.02)
    assert isinstance(err, SendError) and "already running" in err.message
    (err,) = session.handle({"endpoint": "launch"}, now=0.02)
    assert isinstance(err, SendError) and "unknown endpoint 'launch'" in err.message
    (ok,) = session.handle({"endpoint": "reset"}, now=0.03)
    assert ok == SendReply({"status": "reset successful"}) and session.scheduler.in_flight is None
    assert session.reject("bad") == [SendError("could not decode observation: bad")]
    status, stop = session.handle({"endpoint": "stream_stop"}, now=0.5)
    assert isinstance(stop, StopStream) and isinstance(status, SendReply)
    assert status.payload == {
        "status": "stream stopped",
        "chunks": 0,
        "dropped_observations": 0,
        "gaps": 0,
        "step": 5,
    }
