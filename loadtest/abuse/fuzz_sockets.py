"""Live-socket fuzzer: mutated frames at both WebSockets of a running gateway, many connections at once,
while well-behaved sessions keep working. Every load goes to 127.0.0.1 only.

    python -m loadtest.abuse.fuzz_sockets --frames 3000 --concurrency 6            # short (the pytest)
    python -m loadtest.abuse.fuzz_sockets --frames 100000 --concurrency 12 --duration 900 --report out.json
    python -m loadtest.abuse.fuzz_sockets --url ws://127.0.0.1:8000 --frame-limit 16777216 --frames 20000

Without ``--url`` it starts its own server (tone TTS, no-op policy, 256 KiB frame limit, no warm-up).

Frames, per socket (``/v1/realtime`` as text; ``/`` and ``/v1/realtime/robot/openpi`` as binary):
bit flips, truncations, byte insertions/deletions, structure-aware type confusion (a JSON / msgpack node
replaced, removed, wrapped), valid-then-garbage, random bytes, binary on the text socket and text on the
binary one, frames over the size limit, invalid UTF-8 in a text frame, deep nesting, huge declared sizes.

Each frame's answer is predicted locally by the gateway's own pure code (``decode_client_event``;
``unpackb`` + a mirror ``PolicyConnection``) and checked exactly:

- realtime: one ``error`` event (``invalid_request_error``, same code, message, param and event_id) per
  bad frame, in order; ``invalid_frame`` for a binary frame; for a frame over the limit a
  ``message_too_large`` error (or close 1009 where the server's WebSocket layer caps it), close 1007 for
  invalid UTF-8. Frames that decode to valid events are not sent (they would start real work).
- openpi: the exact text frame ``could not decode observation: ...`` / the validation message for a bad
  frame (the connection stays open), actions for a valid observation, the reset reply for a reset;
  over the limit "frame is N bytes, over the limit" (or close 1009), invalid UTF-8 close 1007.

Meanwhile ``--good`` realtime clients run text and audio turns and ``--good-robots`` robots run infer
loops: every turn must complete and every step return actions. At the end the server process must be
alive and ``realtime_gw_sessions`` back to 0. Frames that trip a bug the local oracle already knows
(``known bugs``: the oracle itself raises) are counted apart; any other mismatch is a violation, saved
with the frame (base64) in the report. Exit 0 only with no violation, no crash, sessions back to 0, the
good sessions healthy, and (unless ``--allow-known-bugs``) no known-bug hit.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import websockets
from websockets.exceptions import ConnectionClosed

from loadtest.abuse.fuzz_decoders import POOL, REALTIME_SEEDS, mutate_tree
from realtime_gw.protocols import realtime as rt
from realtime_gw.protocols.openpi import DecodeError, FrameLimits, packb, unpackb
from realtime_gw.records.policy import PolicySpec
from realtime_gw.sessions.policy_request_reply import Infer, PolicyConnection, SendError, SendReply
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from realtime_gw.testing.load_client import open_session, send_text

ROOT = Path(__file__).resolve().parents[2]

RECV_TIMEOUT_S = 20.0
BAD_JSON_FRAME = '{"type": "response.create",'  # always invalid_json
UNUSED_BYTE = b"\xc1"  # never valid msgpack


# -- expectations -----------------------------------------------------------------------------------------
@dataclass
class Expect:
    kind: str
    """error (realtime error event) | text (exact text frame) | actions | reset | close (that code) |
    any_close (a known bug) | oversized (close 1009, or an in-band refusal: a realtime ``message_too_large``
    error / an OpenPI "frame is N bytes, over the limit" text, when the server caps frames above its limit)"""
    mutation: str
    frame: bytes | str
    detail: Any = None
    known_bug: str | None = None


@dataclass
class Report:
    frames: Counter[str] = field(default_factory=Counter)
    """socket -> frames sent"""
    mutations: Counter[str] = field(default_factory=Counter)
    """socket:mutation -> frames sent"""
    answers: Counter[str] = field(default_factory=Counter)
    violations: list[dict[str, Any]] = field(default_factory=list)
    violation_count: int = 0
    known_bugs: Counter[str] = field(default_factory=Counter)
    known_bug_samples: list[dict[str, Any]] = field(default_factory=list)
    skipped_valid: int = 0
    connections: Counter[str] = field(default_factory=Counter)
    good: Counter[str] = field(default_factory=Counter)
    good_failures: list[str] = field(default_factory=list)
    fuzzer_errors: list[str] = field(default_factory=list)

    def violation(self, socket_name: str, exp: Expect, got: str) -> None:
        self.violation_count += 1
        if len(self.violations) < 50:
            frame = exp.frame.encode("utf-8", "surrogatepass") if isinstance(exp.frame, str) else exp.frame
            self.violations.append(
                {
                    "socket": socket_name,
                    "mutation": exp.mutation,
                    "expected": f"{exp.kind}: {str(exp.detail)[:300]}",
                    "got": got[:500],
                    "frame_b64": base64.b64encode(frame[:4096]).decode(),
                    "frame_len": len(frame),
                    "text_frame": isinstance(exp.frame, str),
                }
            )

    def known(self, socket_name: str, exp: Expect, got: str) -> None:
        assert exp.known_bug is not None
        self.known_bugs[exp.known_bug] += 1
        if len(self.known_bug_samples) < 10:
            frame = exp.frame.encode() if isinstance(exp.frame, str) else exp.frame
            self.known_bug_samples.append(
                {
                    "socket": socket_name,
                    "bug": exp.known_bug,
                    "got": got[:300],
                    "frame_b64": base64.b64encode(frame[:2048]).decode(),
                }
            )


# -- realtime frames ---------------------------------------------------------------------------------------
def realtime_frame(rng: random.Random, limit: int | None) -> tuple[str, bytes | str, bool]:
    """(mutation, frame, as_text) before the oracle looks at it."""
    base = json.dumps(rng.choice(REALTIME_SEEDS))
    r = rng.random()
    if r < 0.25:
        tree = json.loads(base)
        for _ in range(rng.randint(1, 3)):
            tree = mutate_tree(tree, rng, POOL)
        return "type_confusion", json.dumps(tree, ensure_ascii=rng.random() < 0.5), True
    if r < 0.45:
        data = bytearray(base.encode())
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        if rng.random() < 0.02:
            return "invalid_utf8", bytes(data), True  # sent raw as a text frame if it is not UTF-8
        return "bit_flip", bytes(data).decode("utf-8", "replace"), True
    if r < 0.58:
        return "truncation", base[: rng.randrange(len(base))], True
    if r < 0.68:
        junk = "".join(chr(rng.randrange(32, 0x3000)) for _ in range(rng.randint(1, 12)))
        return "valid_then_garbage", base + junk, True
    if r < 0.76:
        return "random_bytes", rng.randbytes(rng.randint(0, 300)).decode("utf-8", "replace"), True
    if r < 0.86:
        return "binary_on_text_socket", rng.choice([base.encode(), rng.randbytes(rng.randint(0, 200))]), False
    if r < 0.92:
        n = rng.randint(10_000, 120_000)
        big = rng.choice(
            [
                json.dumps({"type": "input_audio_buffer.append", "audio": "!" * n}),
                json.dumps(
                    {
                        "type": "conversation.item.create",
                        "item": {"type": "message", "content": [7] * (n // 3)},
                    }
                ),
                json.dumps({"type": "session.update", "session": {"instructions": 5, "tools": ["x" * n]}}),
            ]
        )
        return "large", big, True
    if r < 0.93 and limit is not None:
        return "oversized", "x" * (limit + rng.randint(1, 4096)), True
    if r < 0.95:
        depth = rng.randint(50, 800)
        return "deep_nesting", "[" * depth + "]" * (depth - rng.randint(0, 1)), True
    if r < 0.96:
        depth = rng.randint(1000, 3000)  # msgspec raises RecursionError around Python's recursion limit
        return "very_deep_nesting", rng.choice(["[", '{"a":']) * depth, True
    return "empty_or_blank", rng.choice(["", " ", "\n", "{}", "[]", "null", '""']), True


def realtime_expect(mutation: str, frame: bytes | str, as_text: bool, limit: int | None) -> Expect | None:
    """The answer the gateway must give; None for frames that decode to a valid event (not sent)."""
    if limit is not None and len(frame.encode() if isinstance(frame, str) else frame) > limit:
        return Expect("oversized", mutation, frame, "message_too_large")
    if not as_text:
        return Expect("error", mutation, frame, ("invalid_frame", None, None, None))
    if isinstance(frame, bytes):
        try:
            frame = frame.decode("utf-8")
        except UnicodeDecodeError:
            return Expect("close", mutation, frame, 1007)
    try:
        out = rt.decode_client_event(frame)
    except RecursionError:
        return Expect(
            "any_close", mutation, frame, None, "deep JSON nesting: RecursionError in decode_client_event"
        )
    if not isinstance(out, rt.ErrorEvent):
        return None
    return Expect(
        "error", mutation, frame, (out.error.code, out.error.message, out.error.param, out.error.event_id)
    )


# -- openpi frames -----------------------------------------------------------------------------------------
def droid_obs(spec: PolicySpec, rng: random.Random) -> dict[str, Any]:
    side = rng.choice([4, 8, 16])
    obs: dict[str, Any] = {
        k: np.full((side, side, 3), rng.randrange(256), np.uint8) for k in spec.required_cameras
    }
    obs[spec.state_key] = np.full(spec.state_dim, rng.random(), np.float32)
    obs[spec.prompt_key] = rng.choice(["pick up the cup", "wipe the table"])
    if rng.random() < 0.5:
        obs["session_id"] = rng.choice(["r1", "r2", "r3"])
    return obs


def openpi_frame(spec: PolicySpec, rng: random.Random, limit: int | None) -> tuple[str, bytes | str, bool]:
    obs = droid_obs(spec, rng)
    base = packb(obs)
    r = rng.random()
    if r < 0.25:
        tree = msgpack.unpackb(base, raw=False)
        for _ in range(rng.randint(1, 3)):
            tree = mutate_tree(tree, rng, POOL)
        try:
            return "type_confusion", msgpack.packb(tree), False
        except (TypeError, ValueError, OverflowError):
            return "type_confusion", base[:-1], False
    if r < 0.40:
        data = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return "bit_flip", bytes(data), False
    if r < 0.50:
        return "truncation", base[: rng.randrange(len(base))], False
    if r < 0.56:
        data = bytearray(base)
        pos = rng.randrange(len(data))
        if rng.random() < 0.5:
            data[pos:pos] = rng.randbytes(rng.randint(1, 8))
        else:
            del data[pos : pos + rng.randint(1, 8)]
        return "insert_delete", bytes(data), False
    if r < 0.63:
        return "valid_then_garbage", base + rng.randbytes(rng.randint(1, 16)), False
    if r < 0.69:
        return "random_bytes", rng.randbytes(rng.randint(0, 300)), False
    if r < 0.75:
        return (
            "text_on_binary_socket",
            rng.choice(["hello", json.dumps({"type": "response.create"}), ""]),
            True,
        )
    if r < 0.81:
        header = rng.choice([b"\xdd", b"\xdf", b"\xc6", b"\xdb", b"\xc9"])  # array32 map32 bin32 str32 ext32
        return (
            "huge_declared_size",
            header + rng.choice([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff"]) + rng.randbytes(4),
            False,
        )
    if r < 0.84:
        dims = rng.choice([[2**63, 0], [0, 2**62], [2**31, 2**31, 2**31, 0], [True], [1] * 17, [-1], [2**40]])
        marker = {
            b"__ndarray__": True,
            b"data": b"",
            b"dtype": rng.choice(["<f4", "S0", "|O", "<c8"]),
            b"shape": dims,
        }
        return "bad_shape_or_dtype", msgpack.packb({**obs, "x": marker}, default=_np_default), False
    if r < 0.86:
        return "deep_nesting", rng.choice([b"\x91", b"\x81\xa1k"]) * rng.randint(30, 3000) + b"\xc0", False
    if r < 0.87 and limit is not None:
        return "oversized", rng.randbytes(limit + rng.randint(1, 4096)), False
    if r < 0.88:
        return "invalid_utf8", b'{"prompt": "\xff\xfe"}', True
    if r < 0.90:
        reset: dict[str, Any] = {"endpoint": rng.choice(["reset", "infer", 3, None, [1]])}
        if rng.random() < 0.5:
            reset["session_id"] = rng.choice(["r1", "", 7])
        return "endpoint", packb(reset), False
    return "valid_observation", base, False


def _np_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    return obj


def openpi_expect(
    mirror: PolicyConnection,
    mutation: str,
    frame: bytes | str,
    as_text: bool,
    limit: int | None,
    dec: FrameLimits,
) -> Expect:
    size = len(frame.encode()) if isinstance(frame, str) else len(frame)
    if limit is not None and size > limit:
        return Expect("oversized", mutation, frame, "could not decode observation: frame is ")
    if as_text:
        if isinstance(frame, bytes):
            try:
                frame.decode("utf-8")
            except UnicodeDecodeError:
                return Expect("close", mutation, frame, 1007)
        return Expect(
            "text",
            mutation,
            frame,
            "could not decode observation: expected a binary msgpack-numpy frame, got a text frame",
        )
    assert isinstance(frame, bytes)
    try:
        try:
            value = unpackb(frame, dec)
        except DecodeError as e:
            return Expect("text", mutation, frame, f"could not decode observation: {e}")
        effects = mirror.handle(value)
    except Exception as e:  # the gateway's own code fails on it: a bug, answered by an internal error
        return Expect(
            "any_close", mutation, frame, None, f"{type(e).__name__} in the decoder/session: {str(e)[:80]}"
        )
    (effect,) = effects
    if isinstance(effect, SendError):
        return Expect("text", mutation, frame, effect.message)
    if isinstance(effect, SendReply):
        return Expect("reset", mutation, frame, effect.payload)
    assert isinstance(effect, Infer)
    mirror.on_actions(np.zeros((mirror.spec.action_horizon, mirror.spec.action_dim), np.float32))
    return Expect("actions", mutation, frame, (mirror.spec.action_horizon, mirror.spec.action_dim))


def spec_from_metadata(meta: dict[str, Any]) -> PolicySpec:
    c = meta["policy_server_config"]
    return PolicySpec(
        model=c["model"], action_horizon=c["action_horizon"], action_dim=c["action_dim"], state_dim=c["state_dim"],
        camera_keys=tuple(c["camera_keys"]),
        optional_cameras=tuple(k for k in c["camera_keys"] if k not in c["required_camera_keys"]),
        image_history=tuple(c["image_history"]), state_history=tuple(c["state_history"]),
        state_key=c["state_key"], prompt_key=c["prompt_key"], action_key=c["action_key"],
        max_inference_steps=c["max_inference_steps"],
    )  # fmt: skip


# -- the fuzzing connections -------------------------------------------------------------------------------
class Budget:
    def __init__(self, frames: int, deadline: float) -> None:
        self.frames = frames
        self.deadline = deadline
        self.sent: Counter[str] = Counter()

    def left(self, name: str) -> bool:
        return self.sent[name] < self.frames and time.monotonic() < self.deadline


async def _send(ws: Any, frame: bytes | str, as_text: bool) -> None:
    if as_text and isinstance(frame, bytes):
        await ws.send(frame, text=True)  # raw bytes in a text frame (invalid UTF-8 on purpose)
    else:
        await ws.send(frame)


async def _answer(ws: Any) -> tuple[str, Any]:
    """('msg', data) or ('close', (code, reason)) or ('timeout', None)."""
    try:
        return "msg", await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S)
    except ConnectionClosed as e:
        rcvd = e.rcvd
        return "close", (rcvd.code if rcvd else None, rcvd.reason if rcvd else "")
    except asyncio.TimeoutError:
        return "timeout", None


def _check(report: Report, name: str, exp: Expect, kind: str, data: Any) -> bool:
    """Record the answer; returns False when the connection is over."""
    got = f"{kind}: {data!r}"[:500]
    if kind == "close":
        code, reason = data
        report.answers[f"{name}:close {code}"] += 1
        if exp.known_bug is not None:
            report.known(name, exp, got)
        elif not ((exp.kind == "close" and code == exp.detail) or (exp.kind == "oversized" and code == 1009)):
            report.violation(name, exp, got)
        return False
    if kind == "timeout":
        report.violation(name, exp, "no answer within the timeout")
        return False
    if exp.known_bug is not None:
        report.known(name, exp, got)  # answered instead of closing; either way the oracle's bug is hit
        return True
    if exp.kind == "oversized":
        report.answers[f"{name}:oversized refused in band"] += 1
        if name == "realtime":
            with contextlib.suppress(TypeError, ValueError):
                err = json.loads(data).get("error") or {}
                if (
                    err.get("code") == exp.detail
                    and err.get("type") == "invalid_request_error"
                    and err.get("message")
                ):
                    return True
        elif isinstance(data, str) and data.startswith(exp.detail) and "over the limit" in data:
            return True
        report.violation(name, exp, got)
        return True
    if exp.kind in ("close", "any_close"):
        report.violation(name, exp, got)
        return False
    if exp.kind == "error":
        try:
            ev = json.loads(data)
            err = ev["error"]
        except (TypeError, ValueError, KeyError):
            report.violation(name, exp, got)
            return True
        code, message, param, event_id = exp.detail
        report.answers[f"{name}:error {err.get('code')}"] += 1
        ok = (
            ev.get("type") == "error"
            and err.get("type") == "invalid_request_error"
            and err.get("code") == code
        )
        if message is not None:
            ok = (
                ok
                and err.get("message") == message
                and err.get("param") == param
                and err.get("event_id") == event_id
            )
        if not ok:
            report.violation(name, exp, got)
        return True
    if exp.kind == "text":
        report.answers[f"{name}:text"] += 1
        if data != exp.detail:
            report.violation(name, exp, got)
        return True
    if not isinstance(data, bytes):
        report.violation(name, exp, got)
        return True
    reply = unpackb(data)
    report.answers[f"{name}:{exp.kind}"] += 1
    if exp.kind == "reset":
        if reply != exp.detail:
            report.violation(name, exp, f"msg: {reply!r}")
    elif np.asarray(reply.get("actions")).shape != exp.detail:
        report.violation(name, exp, f"msg: {reply!r}")
    return True


CLOSING = ("close", "any_close", "oversized")


Maker = Callable[[], tuple[str, bytes | str, bool, Expect]]
"""One mutated frame and what the server must answer to it."""


async def exchange(
    ws: Any, name: str, report: Report, budget: Budget, rng: random.Random, size: int, make: Maker
) -> bool:
    """Send up to ``size`` frames back to back, then check their answers in order. A frame that ends the
    connection (oversized, invalid UTF-8, a known bug) goes alone, after the others are answered: a
    protocol error closes the socket at once, and answers still queued for earlier frames may be lost.
    Returns False once the connection is over."""
    window: list[Expect] = []
    last: tuple[bytes | str, bool, Expect] | None = None
    for _ in range(size):
        if not budget.left(name):
            break
        try:
            mutation, frame, as_text, exp = make()
        except Exception as e:  # a bug of this fuzzer, not of the gateway: note it, send a plain bad frame
            report.fuzzer_errors.append(repr(e)[:200])
            mutation, frame, as_text = (
                "fallback",
                (BAD_JSON_FRAME if name == "realtime" else UNUSED_BYTE),
                False,
            )
            exp = Expect(
                "text", mutation, frame, "could not decode observation: " + _decode_error(UNUSED_BYTE)
            )
            if name == "realtime":
                as_text = True
                exp = realtime_expect(mutation, frame, True, None) or exp
        report.mutations[f"{name}:{mutation}"] += 1
        if exp.kind in CLOSING:
            last = (frame, as_text, exp)
            break
        await _send(ws, frame, as_text)
        budget.sent[name] += 1
        report.frames[name] += 1
        window.append(exp)
    for exp in window:
        kind, data = await _answer(ws)
        if not _check(report, name, exp, kind, data):
            return False
    if last is not None:
        frame, as_text, exp = last
        await _send(ws, frame, as_text)
        budget.sent[name] += 1
        report.frames[name] += 1
        kind, data = await _answer(ws)
        return _check(report, name, exp, kind, data)
    return True


def _decode_error(frame: bytes) -> str:
    try:
        unpackb(frame)
    except DecodeError as e:
        return str(e)
    raise AssertionError("expected a DecodeError")


async def hang_up(ws: Any, rng: random.Random) -> None:
    if rng.random() < 0.2:
        ws.transport.abort()  # an abrupt disconnect, no close frame
    else:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(), 10)
    ws.transport.abort()  # no-op when closed; never leave a socket behind


async def fuzz_socket(
    name: str,
    url: str,
    paths: list[str],
    report: Report,
    budget: Budget,
    rng: random.Random,
    max_burst: int,
    start: Callable[[Any], Awaitable[Maker]],
) -> None:
    """Connection after connection: ``start`` reads the greeting and returns the frame maker, then
    bursts of mutated frames until the budget is spent or the server (rightly) closes."""
    while budget.left(name):
        report.connections[name] += 1
        path = paths[0] if len(paths) == 1 else rng.choice(paths)
        try:
            ws = await websockets.connect(url + path, max_size=None, open_timeout=20)
        except Exception as e:
            report.violation(name, Expect("connect", "connect", b""), f"connect failed: {e!r}")
            await asyncio.sleep(0.5)
            continue
        alive = True
        try:
            make = await start(ws)
            for _ in range(rng.randint(5, 60)):
                if not (alive and budget.left(name)):
                    break
                alive = await exchange(ws, name, report, budget, rng, rng.randint(1, max_burst), make)
        except ConnectionClosed as e:
            if alive:
                report.violation(name, Expect("open", "session", b""), f"closed unexpectedly: {e!r}")
        finally:
            await hang_up(ws, rng)


async def fuzz_realtime(
    url: str, report: Report, budget: Budget, rng: random.Random, limit: int | None
) -> None:
    async def start(ws: Any) -> Maker:
        first = json.loads(await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S))
        assert first["type"] == "session.created", first

        def make() -> tuple[str, bytes | str, bool, Expect]:
            for _ in range(8):  # re-mutate frames that happen to be valid events
                mutation, frame, as_text = realtime_frame(rng, limit)
                exp = realtime_expect(mutation, frame, as_text, limit)
                if exp is not None:
                    return mutation, frame, as_text, exp
                report.skipped_valid += 1
            exp = realtime_expect("truncation", BAD_JSON_FRAME, True, limit)
            assert exp is not None
            return "truncation", BAD_JSON_FRAME, True, exp

        return make

    await fuzz_socket("realtime", url, ["/v1/realtime"], report, budget, rng, 12, start)


async def fuzz_openpi(
    url: str, report: Report, budget: Budget, rng: random.Random, limit: int | None
) -> None:
    async def start(ws: Any) -> Maker:
        spec = spec_from_metadata(unpackb(await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S)))
        mirror = PolicyConnection(spec, max_robots=64)
        dec = FrameLimits(max_frame_bytes=limit or 64 * 2**20, max_array_bytes=limit or 64 * 2**20)

        def make() -> tuple[str, bytes | str, bool, Expect]:
            mutation, frame, as_text = openpi_frame(spec, rng, limit)
            return mutation, frame, as_text, openpi_expect(mirror, mutation, frame, as_text, limit, dec)

        return make

    await fuzz_socket("openpi", url, ["/", "/v1/realtime/robot/openpi"], report, budget, rng, 8, start)


async def good_voice(url: str, report: Report, stop: asyncio.Event, audio: bool) -> None:
    label = "audio_turns" if audio else "text_turns"
    while not stop.is_set():
        try:
            session = {
                "output_modalities": ["audio" if audio else "text"],
                "audio": {"input": {"turn_detection": None}},
            }
            async with await open_session(url, session, open_timeout=20) as ws:
                for i in range(20):
                    if stop.is_set():
                        break
                    await send_text(ws, f"Turn {i}, fine.")
                    seq = 0
                    while True:
                        ev = json.loads(await asyncio.wait_for(ws.recv(), 30))
                        if ev["type"] == "error":
                            raise AssertionError(f"error event: {ev}")
                        if ev["type"] == "response.output_audio.delta":
                            assert ev["seq"] == seq, f"audio seq {ev['seq']} after {seq - 1}"
                            seq += 1
                        if ev["type"] == "response.done":
                            assert ev["response"]["status"] == "completed", ev["response"]
                            assert not audio or seq > 0, "an audio turn without audio"
                            break
                    report.good[label] += 1
                    await asyncio.sleep(0.2)  # a person between turns; leaves the CPU to the fuzzers
        except Exception as e:
            report.good_failures.append(f"{label}: {e!r}"[:300])
            await asyncio.sleep(0.5)


async def good_robot(url: str, report: Report, stop: asyncio.Event, rng: random.Random) -> None:
    while not stop.is_set():
        try:
            path = rng.choice(["/", "/v1/realtime/robot/openpi"])
            async with websockets.connect(url + path, max_size=None, open_timeout=20) as ws:
                spec = spec_from_metadata(unpackb(await ws.recv()))
                for _ in range(100):
                    if stop.is_set():
                        break
                    await ws.send(packb(droid_obs(spec, rng)))
                    reply = await asyncio.wait_for(ws.recv(), 30)
                    assert isinstance(reply, bytes), f"robot got {reply!r}"
                    actions = unpackb(reply)["actions"]
                    assert actions.shape == (spec.action_horizon, spec.action_dim), actions.shape
                    report.good["robot_steps"] += 1
                    await asyncio.sleep(0.05)  # a 20 Hz control loop
        except Exception as e:
            report.good_failures.append(f"robot: {e!r}"[:300])
            await asyncio.sleep(0.5)


# -- server ------------------------------------------------------------------------------------------------
def start_fuzzed_gateway(limit: int, log_path: Path, extra: list[str]) -> tuple[LiveServer, str]:
    flags = [
        "--host", "127.0.0.1", "--policy", "noop", "--tts", "tone", "--audio-lead-ms", "0", "--no-warmup",
        "--log-level", "warning", "--max-frame-bytes", str(limit), "--openpi-max-frame-bytes", str(limit),
        "--max-sessions", "512", "--openpi-max-sessions", "256", *extra,
    ]  # fmt: skip
    server = start_server(*flags, log_path=log_path, timeout=180)
    return server, server.ws


def sessions_gauge(http: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(http + "/metrics", timeout=5).text.splitlines():
        if line.startswith("realtime_gw_sessions{"):
            key, value = line.rsplit(" ", 1)
            out[key[len("realtime_gw_sessions") :]] = float(value)
    return out


async def robot_socket_answers(url: str) -> bool:
    try:
        async with websockets.connect(url + "/v1/realtime/robot/openpi", open_timeout=10) as ws:
            return isinstance(await asyncio.wait_for(ws.recv(), 10), bytes)
    except Exception:
        return False


def rss_mib(pid: int) -> float | None:
    try:
        import psutil

        return round(psutil.Process(pid).memory_info().rss / 2**20, 1)
    except Exception:
        return None


async def run(args: argparse.Namespace, url: str, report: Report) -> None:
    rng = random.Random(args.seed)
    budget = Budget(args.frames, time.monotonic() + args.duration)
    stop = asyncio.Event()
    good = [asyncio.create_task(good_voice(url, report, stop, audio=i % 2 == 1)) for i in range(args.good)]
    if not args.no_openpi:
        good += [
            asyncio.create_task(good_robot(url, report, stop, random.Random(rng.random())))
            for _ in range(args.good_robots)
        ]
    fuzzers = [
        asyncio.create_task(fuzz_realtime(url, report, budget, random.Random(rng.random()), args.frame_limit))
        for _ in range(args.concurrency)
    ]
    if not args.no_openpi:
        fuzzers += [
            asyncio.create_task(
                fuzz_openpi(url, report, budget, random.Random(rng.random()), args.frame_limit)
            )
            for _ in range(args.concurrency)
        ]
    t0 = time.monotonic()
    last = t0
    while not all(f.done() for f in fuzzers):
        await asyncio.sleep(0.5)
        if time.monotonic() - last >= args.progress_s:
            last = time.monotonic()
            print(
                f"[fuzz_sockets] {last - t0:.0f} s: frames {dict(report.frames)}, violations {report.violation_count}, "
                f"known bugs {sum(report.known_bugs.values())}, good {dict(report.good)}",
                flush=True,
            )
    for f in fuzzers:
        f.result()  # surface a fuzzer's own crash
    stop.set()
    await asyncio.wait(good, timeout=40)
    for g in good:
        g.cancel()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--url", default=None, help="ws://127.0.0.1:PORT of a running gateway (else start one)"
    )
    parser.add_argument("--frames", type=int, default=3000, help="mutated frames per socket")
    parser.add_argument("--duration", type=float, default=600, help="stop sending after this many seconds")
    parser.add_argument("--concurrency", type=int, default=6, help="fuzzing connections per socket at once")
    parser.add_argument(
        "--good", type=int, default=2, help="well-behaved voice sessions (text and audio turns)"
    )
    parser.add_argument("--good-robots", type=int, default=1, help="well-behaved OpenPI infer loops")
    parser.add_argument(
        "--frame-limit",
        type=int,
        default=None,
        help="the server's frame limit (default: 256 KiB for a started server)",
    )
    parser.add_argument("--no-openpi", action="store_true", help="fuzz /v1/realtime only")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--allow-known-bugs", action="store_true", help="known-bug hits do not fail the run")
    parser.add_argument("--report", default=None, help="JSON report path")
    parser.add_argument("--progress-s", type=float, default=15.0)
    parser.add_argument("--server-arg", action="append", default=[], help="extra flag for a started server")
    args = parser.parse_args()
    args.seed = args.seed if args.seed is not None else random.randrange(2**32)
    server: LiveServer | None = None
    proc = None
    log_path = ROOT / "test-artifacts" / f"fuzz-sockets-server-{os.getpid()}.log"
    if args.url is None:
        args.frame_limit = args.frame_limit or 256 * 1024
        server, url = start_fuzzed_gateway(args.frame_limit, log_path, args.server_arg)
        proc = server.proc
    else:
        url = args.url.rstrip("/")
        assert url.startswith(("ws://127.0.0.1", "ws://localhost")), "loopback only"
    http = "http" + url[2:]
    if not args.no_openpi and not asyncio.run(robot_socket_answers(url)):
        print("[fuzz_sockets] the robot socket does not answer (policy=none?): fuzzing /v1/realtime only")
        args.no_openpi = True
    report = Report()
    t0 = time.monotonic()
    rss_before = rss_mib(proc.pid) if proc else None
    try:
        asyncio.run(run(args, url, report))
        elapsed = time.monotonic() - t0
        crashed = proc is not None and proc.poll() is not None
        healthy = False
        with contextlib.suppress(httpx.HTTPError):
            healthy = httpx.get(http + "/healthz", timeout=5).status_code == 200
        gauge: dict[str, float] = {}
        deadline = time.monotonic() + 15
        while not crashed and time.monotonic() < deadline:
            gauge = sessions_gauge(http)
            if sum(gauge.values()) == 0:
                break
            time.sleep(0.25)
        rss_after = rss_mib(proc.pid) if proc else None
    finally:
        if server is not None:
            returncode = stop_server(server, timeout=10)
    log = log_path.read_text(errors="replace") if proc is not None else ""
    summary = {
        "seed": args.seed,
        "url": url,
        "seconds": round(elapsed, 1),
        "frames": dict(report.frames),
        "frames_per_s": round(sum(report.frames.values()) / max(elapsed, 1e-9), 1),
        "connections": dict(report.connections),
        "mutations": dict(sorted(report.mutations.items())),
        "answers": dict(sorted(report.answers.items())),
        "skipped_valid_frames": report.skipped_valid,
        "violations": report.violation_count,
        "violation_samples": report.violations,
        "known_bugs": dict(report.known_bugs),
        "known_bug_samples": report.known_bug_samples,
        "good_sessions": dict(report.good),
        "good_failures": report.good_failures[:20],
        "fuzzer_errors": report.fuzzer_errors[:20],
        "server_crashed": crashed,
        "server_returncode_before_stop": returncode if proc is not None else None,
        "healthz_after": healthy,
        "sessions_after": gauge,
        "server_rss_mib": {"before": rss_before, "after": rss_after},
        "server_log_internal_errors": log.count("openpi connection failed") + log.count("failed on"),
        "server_log": str(log_path) if proc is not None else None,
    }
    ok = (
        report.violation_count == 0
        and not crashed
        and healthy
        and sum(gauge.values()) == 0
        and not report.good_failures
        and report.good.get("text_turns", 0) + report.good.get("audio_turns", 0) > 0
        and (args.no_openpi or args.good_robots == 0 or report.good.get("robot_steps", 0) > 0)
        and (args.allow_known_bugs or not report.known_bugs)
    )
    summary["passed"] = ok
    text = json.dumps(summary, indent=2)
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(text)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
