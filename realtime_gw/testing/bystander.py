"""A well-behaved neighbour that measures what an attack costs everyone else.

The bystander runs, all at once, while something else happens to the gateway:
- a realtime session doing text -> audio turns back to back: time to first audio (``response.create``
  sent -> first ``response.output_audio.delta``) per turn, and each audio frame's lateness against
  real-time playback (frame ``seq`` is due ``seq`` x 80 ms after the first frame arrived; arriving
  earlier is the server's lead and counts as 0);
- a ``/healthz`` prober, one request every 50 ms (the next one starts when the last answered), timing each;
- optionally a robot on the OpenPI socket timing each ``infer`` (~10 Hz).

Used by ``loadtest/abuse/attacks.py`` (the attack table in docs/reliability.md) and
``tests/server/test_isolation.py``. A turn that fails, times out or loses its socket is counted in
``errors``, and its wait carries over: the TTFA of the next turn that brings audio (or, at the end, the
wait so far) runs from when the failed turn asked, reconnecting included; a frame that never came after
a time-out counts as late as the wait for it. So a gateway that stops answering cannot look fast.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import websockets

from realtime_gw.testing import load_client

FRAME_S = 0.080
TURN_TEXT = "Please open the door for me."
PROBE_INTERVAL_S = 0.050


def percentile(xs: list[float], q: float) -> float:
    """The load clients' nearest-rank percentile; NaN for no samples, as these reports have it."""
    p = load_client.percentile(xs, q)
    return float("nan") if p is None else p


@dataclass
class BystanderReport:
    ttfa_ms: list[float] = field(default_factory=list)
    lateness_ms: list[float] = field(default_factory=list)
    health_ms: list[float] = field(default_factory=list)
    robot_ms: list[float] = field(default_factory=list)
    turns: int = 0
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "ttfa_p50_ms": percentile(self.ttfa_ms, 50),
            "ttfa_p95_ms": percentile(self.ttfa_ms, 95),
            "late_max_ms": max(self.lateness_ms, default=0.0),
            "frames": len(self.lateness_ms),
            "healthz_max_ms": max(self.health_ms, default=float("nan")),
            "healthz_probes": len(self.health_ms),
            "robot_p95_ms": percentile(self.robot_ms, 95),
            "robot_steps": len(self.robot_ms),
            "errors": len(self.errors),
            "first_errors": self.errors[:3],
        }


class Bystander:
    """``async with Bystander(port) as b: ...``; then ``b.report``. Everything stops on exit."""

    def __init__(
        self, port: int, *, robot: bool = False, turn_timeout_s: float = 30.0, text: str = TURN_TEXT
    ) -> None:
        self.http = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}"
        self.robot = robot
        self.turn_timeout_s = turn_timeout_s
        self.text = text
        self.report = BystanderReport()
        self._stop = asyncio.Event()
        self._waiting_since: float | None = None
        """When the voice user asked for a turn that has not brought audio yet; a turn that fails keeps it,
        so the next turn's TTFA counts the whole wait (reconnecting included)."""
        self._robot_stop = threading.Event()
        self._tasks: list[asyncio.Future[Any]] = []

    async def __aenter__(self) -> Bystander:
        self._tasks = [asyncio.create_task(self._voice()), asyncio.create_task(self._prober())]
        if self.robot:
            self._tasks.append(asyncio.ensure_future(asyncio.to_thread(self._robot_loop)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        self._robot_stop.set()
        # A turn in progress may be stuck behind the attack; give it its time-out, then stop.
        done, pending = await asyncio.wait(self._tasks, timeout=self.turn_timeout_s + 5)
        for task in pending:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._waiting_since is not None:  # never answered: the wait so far is its TTFA
            self.report.ttfa_ms.append((time.monotonic() - self._waiting_since) * 1000)

    async def _prober(self) -> None:
        async with httpx.AsyncClient(timeout=60.0) as client:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    r = await client.get(self.http + "/healthz")
                    if r.status_code != 200:
                        self.report.errors.append(f"healthz {r.status_code}")
                except httpx.HTTPError as e:
                    self.report.errors.append(f"healthz {type(e).__name__}")
                self.report.health_ms.append((time.monotonic() - t0) * 1000)
                await asyncio.sleep(max(0.0, t0 + PROBE_INTERVAL_S - time.monotonic()))

    async def _voice(self) -> None:
        while not self._stop.is_set():
            try:
                async with websockets.connect(
                    self.ws_url + "/v1/realtime",
                    max_size=None,
                    compression=None,
                    open_timeout=self.turn_timeout_s,
                ) as ws:
                    await self._expect(ws, "session.created")
                    session = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
                    await ws.send(json.dumps({"type": "session.update", "session": session}))
                    await self._expect(ws, "session.updated")
                    while not self._stop.is_set():
                        await self._turn(ws)
            except (OSError, TimeoutError, websockets.WebSocketException, _TurnFailed) as e:
                self.report.errors.append(f"voice: {type(e).__name__}: {e}"[:200])
                await asyncio.sleep(0.2)

    async def _expect(self, ws: Any, kind: str) -> None:
        async with asyncio.timeout(self.turn_timeout_s):
            while json.loads(await ws.recv())["type"] != kind:
                pass

    async def _turn(self, ws: Any) -> None:
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": self.text}]}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        sent = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = sent
        await ws.send(json.dumps({"type": "response.create"}))
        first: float | None = None
        next_seq = 0
        deadline = sent + self.turn_timeout_s
        while True:
            try:
                raw = await asyncio.wait_for(ws.recv(), max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                if first is not None:  # the frame that never came is at least this late
                    late = time.monotonic() - (first + next_seq * FRAME_S)
                    self.report.lateness_ms.append(max(0.0, late * 1000))
                raise _TurnFailed(f"no response.done within {self.turn_timeout_s} s") from None
            ev = json.loads(raw)
            now = time.monotonic()
            if ev["type"] == "response.output_audio.delta":
                if first is None:
                    first = now
                    self.report.ttfa_ms.append((now - self._waiting_since) * 1000)
                    self._waiting_since = None
                next_seq = ev["seq"] + 1
                self.report.lateness_ms.append(max(0.0, (now - (first + ev["seq"] * FRAME_S)) * 1000))
            elif ev["type"] == "error":
                self.report.errors.append(
                    f"error event: {ev['error'].get('code')}: {ev['error'].get('message')}"[:200]
                )
            elif ev["type"] == "response.done":
                self.report.turns += 1
                status = ev["response"]["status"]
                if status != "completed" or first is None:
                    self.report.errors.append(f"response {status}, audio={first is not None}")
                return

    def _robot_loop(self) -> None:
        """Blocking, like a robot's control loop (openpi-client is blocking too); its own thread."""
        from realtime_gw.client.openpi import OpenPIClient, PolicyServerError, sample_observation

        while not self._robot_stop.is_set():
            try:
                with OpenPIClient(self.ws_url, open_timeout=self.turn_timeout_s) as robot:
                    obs = sample_observation(robot.metadata, seed=0)
                    while not self._robot_stop.is_set():
                        t0 = time.monotonic()
                        robot.infer(obs, timeout=self.turn_timeout_s)
                        self.report.robot_ms.append((time.monotonic() - t0) * 1000)
                        self._robot_stop.wait(max(0.0, t0 + 0.1 - time.monotonic()))
            except (OSError, TimeoutError, PolicyServerError, websockets.WebSocketException) as e:
                self.report.errors.append(f"robot: {type(e).__name__}: {e}"[:200])
                self._robot_stop.wait(0.2)


class _TurnFailed(Exception):
    """A bystander turn did not finish in time; the session is abandoned and a new one opened."""


async def measure(
    port: int, seconds: float, *, robot: bool = False, turn_timeout_s: float = 30.0
) -> BystanderReport:
    """The bystander alone for ``seconds`` (a baseline)."""
    async with Bystander(port, robot=robot, turn_timeout_s=turn_timeout_s) as b:
        await asyncio.sleep(seconds)
    return b.report
