"""The OpenPI session as one pure object: both modes, policy jobs, timing, idle and illegal events."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from realtime_gw.sessions.openpi import (
    CancelPolicy,
    CloseSocket,
    Disconnected,
    FrameReceived,
    FrameUndecodable,
    IdleTimeout,
    Opened,
    OpenPISession,
    OpenPIState,
    OpenPIStateError,
    PolicyDone,
    PolicyRefused,
    RunPolicy,
    Wakeup,
)
from realtime_gw.sessions.policy_request_reply import SendError, SendReply
from tests.sessions.policy_helpers import A, H, obs, spec


def actions(value: float = 0.0) -> np.ndarray:
    return np.full((H, A), value, np.float32)


def opened(**kw: Any) -> OpenPISession:
    session = OpenPISession(spec(), **kw)
    (meta,) = session.handle(Opened(), 0.0)
    assert isinstance(meta, SendReply) and "policy_server_config" in meta.payload
    return session


def frame(session: OpenPISession, msg: Any, now: float, received_at: float | None = None) -> list[Any]:
    return session.handle(FrameReceived(msg, now if received_at is None else received_at), now)


def test_request_reply_one_job_at_a_time_with_server_timing() -> None:
    s = opened()
    assert s.state is OpenPIState.REQUEST_REPLY and s.takes_frames and s.wakeup_at() is None
    (run,) = frame(s, obs(1), now=1.0, received_at=0.99)
    assert isinstance(run, RunPolicy) and run.request.state[0, 0] == 1.0
    assert s.state is OpenPIState.INFERRING and not s.takes_frames
    with pytest.raises(OpenPIStateError, match="FrameReceived in state INFERRING"):
        frame(s, obs(2), now=1.01)
    assert s.handle(IdleTimeout(0.5), 1.2) == []  # the client waits for us: not idle
    (reply,) = s.handle(PolicyDone(run.job, actions(1)), 1.25)
    assert isinstance(reply, SendReply) and list(reply.payload) == ["actions", "server_timing"]
    assert reply.payload["server_timing"] == {"infer_ms": pytest.approx(250)}  # no previous request yet
    assert s.state is OpenPIState.REQUEST_REPLY
    (run2,) = frame(s, obs(2), now=2.0)
    assert run2.job != run.job
    (reply,) = s.handle(PolicyDone(run2.job, actions(2)), 2.1)
    # The stock contract: the previous request's total, frame received -> reply.
    assert reply.payload["server_timing"] == {
        "infer_ms": pytest.approx(100),
        "prev_total_ms": pytest.approx(260),
    }


def test_refusals_errors_and_resets_in_request_reply_mode() -> None:
    s = opened()
    (run,) = frame(s, obs(1), now=1.0)
    assert s.handle(PolicyRefused(run.job, "no free slot"), 1.1) == [
        SendError("policy busy: no free slot; retry")
    ]
    assert s.state is OpenPIState.REQUEST_REPLY
    (err,) = frame(s, obs(1, **{"observation/state": np.zeros(2)}), now=1.2)
    assert isinstance(err, SendError) and "must have length 3" in err.message
    assert s.handle(FrameUndecodable("not valid msgpack"), 1.3) == [
        SendError("could not decode observation: not valid msgpack")
    ]
    assert frame(s, {"endpoint": "reset"}, now=1.4) == [SendReply({"status": "reset successful"})]
    (err,) = frame(s, {"endpoint": "stream_stop"}, now=1.5)
    assert isinstance(err, SendError) and "no stream is running" in err.message
    (run,) = frame(s, obs(2), now=2.0)
    (reply,) = s.handle(PolicyDone(run.job, actions()), 2.1)
    assert "prev_total_ms" not in reply.payload["server_timing"]  # a refusal is no completed request


def test_streamed_mode_chunks_wakeups_and_stop() -> None:
    s = opened()
    (started,) = frame(s, {"endpoint": "stream_start", "control_hz": 10, "execute_horizon": 4}, now=100.0)
    assert isinstance(started, SendReply) and started.payload["status"] == "stream started"
    assert s.state is OpenPIState.STREAMING and s.takes_frames
    (run,) = frame(s, obs(0), now=100.25)
    assert isinstance(run, RunPolicy) and s.takes_frames  # streamed mode keeps taking frames
    assert frame(s, obs(1), now=100.3) == []  # waits for the chunk in flight
    (chunk,) = s.handle(PolicyDone(run.job, actions()), 100.38)
    assert chunk.payload["type"] == "action_chunk" and chunk.payload["chunk_index"] == 0
    assert chunk.payload["server_timing"] == {"infer_ms": pytest.approx(130)}  # the same one place
    assert s.wakeup_at() == pytest.approx(100.6)
    (run,) = s.handle(Wakeup(), 100.6)
    assert isinstance(run, RunPolicy) and run.request.rtc is not None and run.request.rtc.inference_delay == 2
    (status, cancel) = frame(s, {"endpoint": "stream_stop"}, now=100.7)
    assert status.payload["status"] == "stream stopped" and cancel == CancelPolicy(run.job)
    assert s.state is OpenPIState.REQUEST_REPLY and s.wakeup_at() is None
    with pytest.raises(OpenPIStateError, match="not running"):
        s.handle(PolicyDone(run.job, actions()), 100.8)  # cancelled: the transport never reports it
    with pytest.raises(OpenPIStateError, match="Wakeup in state REQUEST_REPLY; it needs STREAMING"):
        s.handle(Wakeup(), 100.9)
    (run,) = frame(s, obs(3), now=101.0)  # back to request/reply on the same connection
    (reply,) = s.handle(PolicyDone(run.job, actions()), 101.1)
    assert "type" not in reply.payload and "server_timing" in reply.payload


def test_stream_reset_cancels_the_dropped_chunk_and_failures_are_reported() -> None:
    s = opened()
    frame(s, {"endpoint": "stream_start", "control_hz": 10}, now=0.0)
    (run,) = frame(s, obs(0), now=0.0)
    (ok, cancel) = frame(s, {"endpoint": "reset"}, now=0.1)
    assert ok == SendReply({"status": "reset successful"}) and cancel == CancelPolicy(run.job)
    (run,) = frame(s, obs(1), now=0.2)
    (err,) = s.handle(PolicyRefused(run.job, "full"), 0.3)
    assert err == SendError("chunk 1 failed: policy busy: full")
    (err,) = s.handle(FrameUndecodable("bad"), 0.4)
    assert err == SendError("could not decode observation: bad")


def test_idle_disconnect_and_events_after_close() -> None:
    s = opened()
    assert s.handle(IdleTimeout(0.5), 1.0) == [CloseSocket(1000, "idle for 0.5 s")]
    assert s.closed and not s.takes_frames
    with pytest.raises(OpenPIStateError, match="after the session closed"):
        frame(s, obs(), now=1.1)

    streaming = opened()
    frame(streaming, {"endpoint": "stream_start", "control_hz": 10}, now=0.0)
    (run,) = frame(streaming, obs(), now=0.0)
    assert streaming.handle(IdleTimeout(2), 3.0) == [CancelPolicy(run.job), CloseSocket(1000, "idle for 2 s")]

    gone = opened()
    (run,) = frame(gone, obs(), now=0.0)
    assert gone.handle(Disconnected(), 0.1) == [CancelPolicy(run.job)] and gone.closed


def test_metadata_first_and_request_reply_only_sessions() -> None:
    s = OpenPISession(spec())
    with pytest.raises(OpenPIStateError, match="before Opened"):
        frame(s, obs(), now=0.0)
    s.handle(Opened(), 0.0)
    with pytest.raises(OpenPIStateError, match="Opened in state REQUEST_REPLY; it needs OPENING"):
        s.handle(Opened(), 0.0)
    local = opened(streaming=False)
    (err,) = frame(local, {"endpoint": "stream_start", "control_hz": 10}, now=0.0)
    assert isinstance(err, SendError) and "request/reply only" in err.message
    assert local.state is OpenPIState.REQUEST_REPLY
