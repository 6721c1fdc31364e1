"""The pure OpenPI session: validation messages, history rings, resets, metadata (no server, no torch)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from realtime_gw.records.policy import PolicyRequest, PolicySpec
from realtime_gw.sessions.policy_request_reply import (
    Infer,
    PolicyConnection,
    SendError,
    SendReply,
    server_metadata,
)
from tests.sessions.policy_helpers import EXT1, WRIST

EXT2 = "observation/exterior_image_2_left"


def spec(**kw: Any) -> PolicySpec:
    return PolicySpec(model="test", action_horizon=4, action_dim=2, state_dim=3, **kw)


def obs(frame: int = 0, **extra: Any) -> dict[str, Any]:
    """Images filled with ``frame`` so history positions can be read back from the request."""
    o: dict[str, Any] = {
        EXT1: np.full((4, 6, 3), frame, np.uint8),
        WRIST: np.full((4, 6, 3), 100 + frame, np.uint8),
        "observation/state": np.full(3, float(frame)),
        "prompt": "fold the towel",
    }
    o.update(extra)
    return o


def infer(conn: PolicyConnection, msg: Any) -> PolicyRequest:
    effects = conn.handle(msg)
    assert len(effects) == 1 and isinstance(effects[0], Infer), effects
    conn.on_actions(np.zeros((4, 2), np.float32))
    return effects[0].request


def error(conn: PolicyConnection, msg: Any) -> str:
    effects = conn.handle(msg)
    assert len(effects) == 1 and isinstance(effects[0], SendError), effects
    return effects[0].message


def frames(req: PolicyRequest, cameras: int = 3) -> list[list[int | None]]:
    """Per camera, the frame number of each history image (None = masked)."""
    per_cam = len(req.images) // cameras
    out = []
    for c in range(cameras):
        imgs = req.images[c * per_cam : (c + 1) * per_cam]
        out.append([None if im is None else int(im[0, 0, 0]) % 100 for im in imgs])
    return out


def test_single_frame_request() -> None:
    conn = PolicyConnection(spec())
    req = infer(conn, obs(5, seed=9, num_inference_steps=3, session_id="r1"))
    assert frames(req) == [[5], [5], [None]]  # the optional third camera is masked
    assert req.state.shape == (1, 3) and req.state.dtype == np.float32
    assert (req.prompt, req.seed, req.num_steps, req.session_id) == ("fold the towel", 9, 3, "r1")
    assert infer(conn, obs(1)).seed is None and infer(conn, obs(1)).session_id == "default"


def test_history_ring_offsets_reset_and_prompt_change() -> None:
    conn = PolicyConnection(spec(image_history=(-2, -1, 0), state_history=(-1, 0)))
    # The first call repeats the only frame for the missing past.
    r = infer(conn, obs(1))
    assert frames(r)[:2] == [[1, 1, 1], [1, 1, 1]] and r.state[:, 0].tolist() == [1, 1]
    r = infer(conn, obs(2))
    assert frames(r)[0] == [1, 1, 2] and r.state[:, 0].tolist() == [1, 2]
    r = infer(conn, obs(3))
    assert frames(r)[0] == [1, 2, 3] and r.state[:, 0].tolist() == [2, 3]
    r = infer(conn, obs(4))
    assert frames(r)[0] == [2, 3, 4]
    # Another robot on the same connection has its own ring.
    assert frames(infer(conn, obs(50, session_id="b")))[0] == [50, 50, 50]
    assert frames(infer(conn, obs(5)))[0] == [3, 4, 5]
    # Reset (of this robot only) and a prompt change both start over.
    assert conn.handle({"endpoint": "reset"}) == [SendReply({"status": "reset successful"})]
    assert frames(infer(conn, obs(6)))[0] == [6, 6, 6]
    assert frames(infer(conn, obs(51, session_id="b")))[0] == [50, 50, 51]
    assert frames(infer(conn, obs(7, prompt="new task")))[0] == [7, 7, 7]
    assert frames(infer(conn, obs(8, prompt="new task")))[0] == [7, 7, 8]


def test_history_survives_the_frame_buffer() -> None:
    conn = PolicyConnection(spec(image_history=(-1, 0)))
    first = obs(1)
    infer(conn, first)
    first[EXT1][:] = 99  # the client (or the frame buffer) reuses its memory
    assert frames(infer(conn, obs(2)))[0] == [1, 2]


def test_max_robots_per_connection() -> None:
    conn = PolicyConnection(spec(), max_robots=2)
    infer(conn, obs(session_id="a"))
    infer(conn, obs(session_id="b"))
    assert "too many session_ids on this connection (limit 2)" in error(conn, obs(session_id="c"))
    conn.handle({"endpoint": "reset", "session_id": "a"})
    infer(conn, obs(session_id="c"))


@pytest.mark.parametrize(
    ("msg", "message"),
    [
        ([1, 2], "an observation must be a msgpack map, got list"),
        (
            {k: v for k, v in obs().items() if k != WRIST},
            f"missing camera key '{WRIST}': required cameras are ['{EXT1}', '{WRIST}'], "
            "each a uint8 array of shape (H, W, 3)",
        ),
        (obs(**{WRIST: None}), f"missing camera key '{WRIST}'"),
        (
            obs(**{EXT1: np.zeros((4, 6, 3), np.float32)}),
            f"'{EXT1}' must have dtype uint8, got float32 (shape (4, 6, 3))",
        ),
        (
            obs(**{EXT1: np.zeros((3, 4, 6), np.uint8)}),
            f"'{EXT1}' must have shape (H, W, 3) (RGB, channels last), got (3, 4, 6)",
        ),
        (
            obs(**{EXT1: np.zeros((0, 6, 3), np.uint8)}),
            f"'{EXT1}' is 0x6; each side must be between 1 and 4096",
        ),
        (obs(**{EXT1: b"jpeg bytes"}), f"'{EXT1}' must be a uint8 array of shape (H, W, 3), got bytes"),
        (
            {k: v for k, v in obs().items() if k != "observation/state"},
            "missing state key 'observation/state': a float array of shape (3,)",
        ),
        (obs(**{"observation/state": np.zeros(7)}), "'observation/state' must have length 3, got length 7"),
        (
            obs(**{"observation/state": np.zeros((1, 3))}),
            "'observation/state' must have length 3, got shape (1, 3)",
        ),
        (
            obs(**{"observation/state": np.array(["a", "b", "c"])}),
            "'observation/state' must have a float (or integer) dtype, got <U1",
        ),
        (
            obs(**{"observation/state": np.array([1.0, np.nan, 0])}),
            "'observation/state' contains NaN or infinity",
        ),
        (
            obs(**{"observation/state": "1,2,3"}),
            "'observation/state' must be a float array of shape (3,), got str",
        ),
        (obs(prompt=3), "'prompt' must be a string, got int"),
        (obs(prompt="x" * 2001), "'prompt' is 2001 characters; the limit is 2000"),
        (obs(seed=1.5), "'seed' must be an integer from 0 to 2**63-1, got 1.5"),
        (obs(seed=True), "'seed' must be an integer from 0 to 2**63-1, got True"),
        (obs(seed=2**63), "'seed' must be an integer from 0 to 2**63-1"),
        (obs(num_inference_steps=101), "'num_inference_steps' must be an integer from 1 to 100, got 101"),
        (obs(session_id=""), "'session_id' must be a string of 1 to 128 characters, got ''"),
        (obs(session_id=7), "'session_id' must be a string of 1 to 128 characters, got 7"),
        (
            {"endpoint": "infer"},
            "unknown endpoint 'infer'; the endpoints are 'reset', 'stream_start', 'stream_stop'",
        ),
    ],
)
def test_validation_messages(msg: Any, message: str) -> None:
    conn = PolicyConnection(spec())
    assert message in error(conn, msg)
    infer(conn, obs())  # the connection carries on


def test_accepts_lists_integers_numpy_scalars_and_any_image_size() -> None:
    conn = PolicyConnection(spec())
    req = infer(
        conn,
        obs(
            **{"observation/state": [1, 2, 3], EXT1: np.zeros((480, 640, 3), np.uint8)},
            seed=np.int64(4),
            num_inference_steps=np.int32(2),
            prompt=np.array("wipe"),
        ),
    )
    assert req.state.tolist() == [[1, 2, 3]] and req.seed == 4 and req.num_steps == 2 and req.prompt == "wipe"
    assert infer(conn, obs(**{"observation/state": np.arange(3, dtype=np.int32)})).state.dtype == np.float32


def test_undecodable_frame_and_action_checks() -> None:
    conn = PolicyConnection(spec())
    assert conn.reject("not valid msgpack") == [SendError("could not decode observation: not valid msgpack")]
    conn.handle(obs())
    with pytest.raises(RuntimeError, match="in flight"):
        conn.handle(obs())
    with pytest.raises(RuntimeError, match=r"expected float32 \(4, 2\)"):
        conn.on_actions(np.zeros((4, 3), np.float32))
    conn.handle(obs())
    assert conn.on_error("policy busy") == [SendError("policy busy")]
    conn.handle(obs())
    (reply,) = conn.on_actions(np.ones((4, 2), np.float32))
    assert isinstance(reply, SendReply) and reply.payload["actions"].shape == (4, 2)


def test_metadata_advertises_the_scheme() -> None:
    meta = server_metadata(spec(state_history=(-2, -1, 0)))["policy_server_config"]
    assert meta["action_horizon"] == 4 and meta["action_dim"] == 2 and meta["state_dim"] == 3
    assert meta["camera_keys"] == [EXT1, WRIST, EXT2] and meta["required_camera_keys"] == [EXT1, WRIST]
    assert (
        meta["image_size"] == [224, 224]
        and meta["image_history"] == [0]
        and meta["state_history"] == [-2, -1, 0]
    )
    assert meta["needs_session_id"] is True and meta["action_keys"] == ["actions"]
    assert server_metadata(spec())["policy_server_config"]["needs_session_id"] is False


@pytest.mark.parametrize("offsets", [(), (-1,), (0, -1), (-1, -1, 0), (1, 0), (0, 1)])
def test_history_offsets_are_checked(offsets: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="strictly increasing frame offsets <= 0 ending in 0"):
        spec(image_history=offsets)


@pytest.mark.parametrize(
    "value",
    [
        np.array(["reset", "reset"]),
        np.zeros(3, np.uint8),
        np.zeros(0),
        np.ndarray(buffer=b"\0" * 8, dtype="<M8", shape=()),  # as decoded; numpy cannot even repr it
        np.datetime64(0, "D"),
        {"nested": "map"},
    ],
)
def test_odd_endpoint_and_field_values_get_a_send_error(value: Any) -> None:
    """Found by fuzzing (tests/fuzz): arrays compared elementwise with 'reset', and reprs that raise."""
    conn = PolicyConnection(spec())
    for msg in ({"endpoint": value}, obs(session_id=value), obs(seed=value), obs(num_inference_steps=value)):
        effects = conn.handle(msg)
        assert len(effects) == 1 and isinstance(effects[0], SendError), (msg, effects)
    assert "must be a list of 3 numbers" in error(conn, obs(**{"observation/state": [1, 2, 10**400]}))
