"""Property fuzzing of the OpenPI connection state machine (``PolicyConnection``): random sequences of
valid, defective and fuzzed observations, resets and bogus endpoints, for several robots on one
connection. Checked against a model of the history rings: every frame gets exactly one answer, never
an exception; requests carry exactly the frames the offsets name; resets and prompt changes start a
ring over; errors leave every ring untouched; the robot limit holds. The whole ``OpenPISession`` (both
modes) is driven with random events the way the transport drives it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from realtime_gw.protocols.openpi import DecodeError, packb, unpackb
from realtime_gw.records.policy import PolicySpec
from realtime_gw.sessions.observation import ObservationError, parse_observation
from realtime_gw.sessions.openpi import (
    CancelPolicy,
    CloseSocket,
    Disconnected,
    FrameReceived,
    FrameUndecodable,
    IdleTimeout,
    Opened,
    OpenPIEvent,
    OpenPISession,
    OpenPIState,
    PolicyDone,
    PolicyRefused,
    RunPolicy,
    Wakeup,
)
from realtime_gw.sessions.policy_request_reply import (
    Infer,
    PolicyConnection,
    SendError,
    SendReply,
)
from tests.fuzz.strategies import frame_mutations, fuzz, msgpack_values

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

EXT1, WRIST, EXT2 = (
    "observation/exterior_image_1_left",
    "observation/wrist_image_left",
    "observation/exterior_image_2_left",
)
STATE_DIM, HORIZON, ACTION_DIM = 3, 4, 2
SIDS = [None, "a", "b", "c", "d", "e"]
PROMPTS = ["fold the towel", "wipe", ""]
HISTORIES = [(0,), (-1, 0), (-2, -1, 0), (-4, -2, 0)]
DEFECTS = [
    "no_wrist", "float_image", "chw_image", "empty_image", "state_len", "state_nan", "state_str", "prompt_int",
    "prompt_long", "seed_neg", "seed_float", "steps_zero", "sid_empty", "sid_int", "not_a_map",
]  # fmt: skip


@dataclass
class Model:
    """What each robot's ring should hold: (prompt, [(images, state), ...] oldest first)."""

    spec: PolicySpec
    max_robots: int
    robots: dict[str, tuple[str, list[tuple[tuple[np.ndarray | None, ...], np.ndarray]]]] = field(
        default_factory=dict
    )

    def accepts_new(self, sid: str, prompt: str) -> bool:
        return sid in self.robots or len(self.robots) < self.max_robots

    def push(self, sid: str, prompt: str, images: tuple[np.ndarray | None, ...], state: np.ndarray) -> None:
        if sid not in self.robots or self.robots[sid][0] != prompt:
            self.robots[sid] = (prompt, [])
        ring = self.robots[sid][1]
        ring.append((tuple(None if i is None else i.copy() for i in images), state.astype(np.float32).copy()))
        del ring[: -self.spec.history_depth]


def valid_obs(draw: st.DrawFn, spec: PolicySpec) -> dict[str, Any]:
    side = st.integers(min_value=1, max_value=4)
    h, w = draw(side), draw(side)
    msg: dict[str, Any] = {
        EXT1: draw(st.binary(min_size=h * w * 3, max_size=h * w * 3).map(lambda b: np.frombuffer(b, np.uint8).reshape(h, w, 3).copy())),
        WRIST: np.full((draw(side), draw(side), 3), draw(st.integers(0, 255)), np.uint8),
    }
    state = draw(st.lists(st.integers(-1000, 1000), min_size=STATE_DIM, max_size=STATE_DIM))
    as_array = draw(st.sampled_from([None, np.float32, np.float64, np.int16]))
    msg["observation/state"] = state if as_array is None else np.array(state, as_array)
    ext2 = draw(st.sampled_from(["absent", "none", "image"]))
    if ext2 == "none":
        msg[EXT2] = None
    elif ext2 == "image":
        msg[EXT2] = np.full((2, 3, 3), 7, np.uint8)
    prompt = draw(st.sampled_from(PROMPTS + [None]))
    if prompt is not None:
        msg["prompt"] = prompt
    sid = draw(st.sampled_from(SIDS))
    if sid is not None:
        msg["session_id"] = sid
    if draw(st.booleans()):
        msg["seed"] = draw(st.integers(0, 2**63 - 1))
    if draw(st.booleans()):
        msg["num_inference_steps"] = draw(st.integers(1, spec.max_inference_steps))
    return msg


def defective(msg: dict[str, Any], defect: str) -> Any:
    msg = dict(msg)
    replacements: dict[str, tuple[str, Any]] = {
        "float_image": (EXT1, np.zeros((2, 2, 3), np.float32)),
        "chw_image": (EXT1, np.zeros((3, 2, 2), np.uint8)),
        "empty_image": (WRIST, np.zeros((0, 2, 3), np.uint8)),
        "state_len": ("observation/state", np.zeros(STATE_DIM + 1)),
        "state_nan": ("observation/state", np.array([np.nan] * STATE_DIM)),
        "state_str": ("observation/state", "1,2,3"),
        "prompt_int": ("prompt", 3),
        "prompt_long": ("prompt", "x" * 2001),
        "seed_neg": ("seed", -1),
        "seed_float": ("seed", 1.5),
        "steps_zero": ("num_inference_steps", 0),
        "sid_empty": ("session_id", ""),
        "sid_int": ("session_id", 7),
    }
    if defect == "no_wrist":
        del msg[WRIST]
    elif defect == "not_a_map":
        return list(msg)
    else:
        key, value = replacements[defect]
        msg[key] = value
    return msg


def check_request(model: Model, sid: str, msg: dict[str, Any], effects: list[Any]) -> None:
    spec = model.spec
    assert len(effects) == 1 and isinstance(effects[0], Infer), effects
    req = effects[0].request
    prompt, ring = model.robots[sid]
    assert (req.session_id, req.prompt) == (sid, prompt)
    assert req.seed == msg.get("seed") and req.num_steps == msg.get("num_inference_steps")
    assert len(req.images) == spec.image_slots
    newest = len(ring) - 1
    per_cam = len(spec.image_history)
    for c in range(len(spec.camera_keys)):
        for j, offset in enumerate(spec.image_history):
            want = ring[max(0, newest + offset)][0][c]
            got = req.images[c * per_cam + j]
            assert (got is None) == (want is None)
            if want is not None:
                assert np.array_equal(got, want), (c, offset)
    assert req.state.dtype == np.float32 and req.state.shape == (len(spec.state_history), spec.state_dim)
    for j, offset in enumerate(spec.state_history):
        assert np.array_equal(req.state[j], ring[max(0, newest + offset)][1])


def expected_images(spec: PolicySpec, msg: dict[str, Any]) -> tuple[np.ndarray | None, ...]:
    return tuple(msg.get(k) for k in spec.camera_keys)


def snapshot(conn: PolicyConnection) -> dict[str, tuple[str, int, list[int]]]:
    return {sid: (r.prompt, len(r), [id(f) for f in r._frames]) for sid, r in conn.robots.items()}


def answer(conn: PolicyConnection, effects: list[Any], busy: bool) -> None:
    """Play the worker: actions (or a busy refusal) for an ``Infer``."""
    if effects and isinstance(effects[0], Infer):
        if busy:
            assert conn.on_error("policy busy") == [SendError("policy busy")]
        else:
            (reply,) = conn.on_actions(np.zeros((HORIZON, ACTION_DIM), np.float32))
            assert isinstance(reply, SendReply) and reply.payload["actions"].shape == (HORIZON, ACTION_DIM)


def feed_fuzzed(conn: PolicyConnection, model: Model, value: Any) -> list[Any]:
    """A frame whose validity is not known in advance: the model follows ``parse_observation``."""
    before = snapshot(conn)
    effects = conn.handle(value)
    assert len(effects) == 1
    if isinstance(value, dict) and "endpoint" in value:
        return effects
    try:
        obs = parse_observation(model.spec, value)
    except ObservationError:
        assert isinstance(effects[0], SendError) and snapshot(conn) == before
        return effects
    if isinstance(effects[0], SendError):
        assert "too many session_ids" in effects[0].message and not model.accepts_new(obs.session_id, obs.prompt)
        return effects
    model.push(obs.session_id, obs.prompt, obs.frame.images, obs.frame.state)
    return effects


@fuzz(150)
@given(
    st.sampled_from(HISTORIES),
    st.sampled_from(HISTORIES),
    st.integers(min_value=1, max_value=4),
    st.lists(st.sampled_from(["obs"] * 6 + ["bad", "reset", "endpoint", "fuzzed", "junk"]), min_size=1, max_size=40),
    st.data(),
)
def test_random_sequences_keep_history_and_reset_invariants(
    image_history: tuple[int, ...], state_history: tuple[int, ...], max_robots: int, steps: list[str], data: st.DataObject
) -> None:
    spec = PolicySpec(
        model="fuzz", action_horizon=HORIZON, action_dim=ACTION_DIM, state_dim=STATE_DIM,
        image_history=image_history, state_history=state_history,
    )  # fmt: skip
    conn = PolicyConnection(spec, max_robots=max_robots)
    model = Model(spec, max_robots)
    for step in steps:
        before = snapshot(conn)
        if step == "obs":
            msg = valid_obs(data.draw, spec)
            sid, prompt = msg.get("session_id", "default"), msg.get("prompt", "")
            effects = conn.handle(msg)
            if model.accepts_new(sid, prompt):
                model.push(sid, prompt, expected_images(spec, msg), np.asarray(msg["observation/state"]))
                check_request(model, sid, msg, effects)
            else:
                assert effects == [SendError(effects[0].message)] and "too many session_ids" in effects[0].message
                assert snapshot(conn) == before
            # The client reuses its buffers: history must not change with them.
            for key in (EXT1, WRIST):
                msg[key][...] = 255 - msg[key]
        elif step == "bad":
            defect = data.draw(st.sampled_from(DEFECTS))
            effects = conn.handle(defective(valid_obs(data.draw, spec), defect))
            assert len(effects) == 1 and isinstance(effects[0], SendError), (defect, effects)
            assert effects[0].message and snapshot(conn) == before
        elif step == "reset":
            sid = data.draw(st.sampled_from(SIDS))
            effects = conn.handle({"endpoint": "reset"} | ({} if sid is None else {"session_id": sid}))
            assert effects == [SendReply({"status": "reset successful"})]
            model.robots.pop(sid or "default", None)
        elif step == "endpoint":
            value = data.draw(st.sampled_from(["infer", "RESET", "", 0, None, [1], {"a": 1}, b"reset"]))
            effects = conn.handle({"endpoint": value})
            assert len(effects) == 1 and isinstance(effects[0], SendError) and snapshot(conn) == before
        elif step == "fuzzed":
            frame = data.draw(frame_mutations(packb(valid_obs(data.draw, spec))))
            try:
                value = unpackb(frame)
            except DecodeError as e:
                effects = conn.reject(str(e))
                assert len(effects) == 1 and isinstance(effects[0], SendError)
            else:
                effects = feed_fuzzed(conn, model, value)
        else:  # junk: any msgpack value the decoder lets through
            value = data.draw(msgpack_values)
            try:
                decoded = unpackb(packb(value))
            except DecodeError:
                continue
            effects = feed_fuzzed(conn, model, decoded)
        answer(conn, effects, busy=data.draw(st.booleans()))
        # invariants after every step
        assert len(conn.robots) <= max_robots
        assert set(conn.robots) == set(model.robots), (set(conn.robots), set(model.robots))
        for sid, robot in conn.robots.items():
            assert robot.prompt == model.robots[sid][0]
            assert len(robot) == len(model.robots[sid][1]) <= spec.history_depth


@fuzz(300)
@given(msgpack_values)
def test_any_decoded_frame_gets_exactly_one_answer(value: Any) -> None:
    """Whatever the decoder lets through, ``handle`` answers it with one effect, never an exception."""
    spec = PolicySpec(model="fuzz", action_horizon=HORIZON, action_dim=ACTION_DIM, state_dim=STATE_DIM)
    conn = PolicyConnection(spec)
    for candidate in (value, {"endpoint": value}, {EXT1: value, WRIST: value, "observation/state": value}):
        try:
            decoded = unpackb(packb(candidate))
        except DecodeError:
            continue
        effects = conn.handle(decoded)
        assert len(effects) == 1 and isinstance(effects[0], (Infer, SendError, SendReply)), effects
        answer(conn, effects, busy=False)


# -- found by fuzzing, fixed (regression) ----------------------------------------------------------------
@pytest.mark.parametrize("endpoint", [np.array(["a", "b"]), np.zeros(3, np.uint8), np.array([]), np.array(["reset"])])
def test_regression_array_endpoint_is_a_send_error(endpoint: np.ndarray) -> None:
    """An array 'endpoint' raised ValueError ('truth value of an array is ambiguous') out of handle():
    over the socket an internal error (text frame + close 1011); an empty one compared as 'reset'."""
    conn = PolicyConnection(PolicySpec(model="fuzz", action_horizon=HORIZON, action_dim=ACTION_DIM, state_dim=STATE_DIM))
    effects = conn.handle(unpackb(packb({"endpoint": endpoint})))
    assert len(effects) == 1 and isinstance(effects[0], SendError) and "unknown endpoint" in effects[0].message


# -- the whole session, both modes ------------------------------------------------------------------------
FRAME_STEPS = ("obs", "bad", "undecodable", "reset", "start", "stop")
SESSION_STEPS = ["obs"] * 6 + ["done"] * 6 + ["wake"] * 3 + ["start"] * 3 + ["bad", "undecodable", "reset", "stop"]
SESSION_STEPS += ["refused", "idle", "gone"]


def session_frame(draw: st.DrawFn, spec: PolicySpec, step: str, now: float) -> OpenPIEvent:
    if step == "undecodable":
        return FrameUndecodable("not valid msgpack")
    messages: dict[str, Any] = {
        "obs": lambda: valid_obs(draw, spec),
        "bad": lambda: defective(valid_obs(draw, spec), draw(st.sampled_from(DEFECTS))),
        "reset": lambda: {"endpoint": "reset"},
        "start": lambda: {
            "endpoint": "stream_start", "control_hz": draw(st.floats(1, 100)), "rtc": draw(st.booleans())
        },
        "stop": lambda: {"endpoint": "stream_stop"},
    }
    return FrameReceived(messages[step](), now)


@fuzz(150)
@given(st.lists(st.sampled_from(SESSION_STEPS), min_size=1, max_size=80), st.data())
def test_openpi_session_keeps_modes_and_jobs_consistent(steps: list[str], data: st.DataObject) -> None:
    """Only events the transport can send in each state (frames while the session takes them, results of
    running jobs, wake-ups once due): the session never raises, runs at most one policy job, answers
    each request/reply frame once, times every action reply, and ends on silence unless a reply is due."""
    spec = PolicySpec(model="fuzz", action_horizon=HORIZON, action_dim=ACTION_DIM, state_dim=STATE_DIM)
    session = OpenPISession(spec, max_robots=len(SIDS))
    running: set[int] = set()
    now = 0.0
    session.handle(Opened(), now)
    for step in steps:
        now += data.draw(st.floats(0, 0.3))
        before = session.state
        event: OpenPIEvent
        if step in FRAME_STEPS:
            if not session.takes_frames:
                continue
            event = session_frame(data.draw, spec, step, now)
        elif step in ("done", "refused"):
            if not running:
                continue
            job = data.draw(st.sampled_from(sorted(running)))
            running.remove(job)
            zeros = np.zeros((HORIZON, ACTION_DIM), np.float32)
            event = PolicyDone(job, zeros) if step == "done" else PolicyRefused(job, "no free slot")
        elif step == "wake":
            wake = session.wakeup_at()
            if wake is None:
                continue
            now = max(now, wake)
            event = Wakeup()
        else:
            event = IdleTimeout(1.0) if step == "idle" else Disconnected()
        effects = session.handle(event, now)
        for effect in effects:
            if isinstance(effect, RunPolicy):
                assert effect.job not in running
                running.add(effect.job)
            elif isinstance(effect, CancelPolicy):
                running.remove(effect.job)
            elif isinstance(effect, SendReply) and "actions" in effect.payload:
                assert effect.payload["server_timing"]["infer_ms"] >= 0
        if before is OpenPIState.REQUEST_REPLY and isinstance(event, (FrameReceived, FrameUndecodable)):
            assert len(effects) == 1, effects
        if isinstance(event, IdleTimeout):
            assert (effects == []) == (before is OpenPIState.INFERRING)
            assert session.closed or before is OpenPIState.INFERRING
            assert session.closed == (bool(effects) and effects[-1] == CloseSocket(1000, "idle for 1 s"))
        assert len(running) <= 1
        request_reply_job = session.state is not OpenPIState.STREAMING and bool(running)
        assert (session.state is OpenPIState.INFERRING) == request_reply_job
        if session.closed:
            assert not running
            break
