"""The load scripts' realtime voice client: open a configured /v1/realtime session, speak PCM16 into it
at real time, and time the reply (first frame, frame lateness, speech_stopped -> first frame).

Raw ``websockets`` and ``json`` on purpose: hundreds of sessions run in one client process, so there is
no per-event decoding into structs and no playback task (``realtime_gw.client.RealtimeClient`` is the
full client). The pacing rule is that client's (``pace_delay``: an absolute schedule, no drift).

Used by the load scripts (loadtest/bench, loadtest/abuse) and the bystander; anything that holds a
gateway's ``ws://`` base URL can use it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import websockets

from realtime_gw.client.protocol import pace_delay

RATE = 24000
"""The gateway's PCM16 rate, in and out."""
FRAME_MS = 80
"""One reply audio frame (``response.output_audio.delta``), as the gateway sends them."""


def percentile(xs: list[float], q: float) -> float | None:
    """Nearest-rank ``q``-th percentile (``q`` in 0..100); None for no samples."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


@dataclass
class Stats:
    """Text or spoken turns of many sessions, counted together."""

    ttfa_ms: list[float] = field(default_factory=list)
    lateness_ms: list[float] = field(default_factory=list)
    barge_in_ms: list[float] = field(default_factory=list)
    turns: int = 0
    errors: int = 0


async def run_sessions(
    count: int, session: Callable[[int], Awaitable[None]], ramp_s: float
) -> list[BaseException]:
    """``session(i)`` for i in 0..count-1 at once, the i-th started ``i x ramp_s`` later (a ramp, not one
    burst of handshakes); returns the exceptions that ended any of them."""

    async def one(i: int) -> None:
        await asyncio.sleep(i * ramp_s)
        await session(i)

    results = await asyncio.gather(*(one(i) for i in range(count)), return_exceptions=True)
    return [r for r in results if isinstance(r, BaseException)]


async def open_session(base_ws: str, session: dict[str, Any], **connect: Any) -> Any:
    """Connect to ``base_ws``/v1/realtime, apply ``session`` (session.update) and wait until it is
    applied; ``connect``: more ``websockets.connect`` options (e.g. ``ping_interval=None``)."""
    ws = await websockets.connect(base_ws + "/v1/realtime", max_size=None, **connect)
    first = json.loads(await ws.recv())
    if first["type"] != "session.created":
        await ws.close()
        raise RuntimeError(f"first event {first['type']}, not session.created")
    await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", **session}}))
    while json.loads(await ws.recv())["type"] != "session.updated":
        pass
    return ws


async def send_text(ws: Any, text: str) -> float:
    """A text turn: the user's message, then ``response.create``; returns when the latter went out."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
    sent = time.monotonic()
    await ws.send(json.dumps({"type": "response.create"}))
    return sent


@dataclass
class ReplyTimes:
    """Client-clock times of one reply, fed event by event (``see``)."""

    stopped: float | None = None
    """The last ``speech_stopped`` before the reply's first frame."""
    first: float | None = None
    last: float | None = None
    lateness_ms: list[float] = field(default_factory=list)
    """Per frame: arrival after its real-time playback slot (first frame's arrival + seq x 80 ms)."""
    status: str | None = None
    """``response.done``'s status once it came."""
    errors: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.status is not None

    def see(self, ev: dict[str, Any], now: float) -> float | None:
        """Take one event that arrived at ``now``; returns the frame's lateness for an audio frame."""
        kind = ev["type"]
        if kind == "response.output_audio.delta":
            if self.first is None:
                self.first = now
            self.last = now
            late = max(0.0, (now - self.first - ev.get("seq", 0) * FRAME_MS / 1000) * 1000)
            self.lateness_ms.append(late)
            return late
        if kind == "input_audio_buffer.speech_stopped" and self.first is None:
            self.stopped = now
        elif kind == "response.done":
            self.status = ev["response"]["status"]
        elif kind == "error":
            self.errors.append(ev.get("error", {}).get("message", "?"))
        return None


async def read_reply(
    ws: Any,
    deadline: float | None = None,
    need_audio: bool = False,
    on_event: Callable[[ReplyTimes, float], None] | None = None,
) -> ReplyTimes:
    """Events into a ``ReplyTimes`` until ``response.done`` (with ``need_audio``: the first one after
    some reply audio) or ``deadline`` (monotonic; the reply is then not ``done``). ``on_event(times,
    now)`` runs after each event (e.g. to start speaking mid-reply)."""
    times = ReplyTimes()
    while deadline is None or time.monotonic() < deadline:
        try:
            raw = await asyncio.wait_for(
                ws.recv(), None if deadline is None else max(0.01, deadline - time.monotonic())
            )
        except TimeoutError:
            break
        now = time.monotonic()
        times.see(json.loads(raw), now)
        if on_event is not None:
            on_event(times, now)
        if times.done:
            if not need_audio or times.first is not None:
                return times
            times.status = None  # a response without audio does not answer the utterance
    return times


async def text_turn(ws: Any, text: str, count_into: Callable[[], Stats]) -> None:
    """One text turn to its ``response.done``: TTFA (``response.create`` -> first frame), each frame's
    lateness, errors. ``count_into()`` is asked at each measurement, so a caller that switches phases
    mid-turn counts each measurement in the phase it was taken in."""
    sent = await send_text(ws, text)
    times = ReplyTimes()
    while not times.done:
        ev = json.loads(await ws.recv())
        now = time.monotonic()
        late = times.see(ev, now)
        stats = count_into()
        if late is not None:
            if len(times.lateness_ms) == 1:
                stats.ttfa_ms.append((now - sent) * 1000)
            stats.lateness_ms.append(late)
        elif ev["type"] == "error":
            stats.errors += 1
    stats = count_into()
    stats.turns += 1
    stats.errors += times.status != "completed"


class PacedMic:
    """A microphone on an open session: one ``chunk_ms`` append at a time on a real-time schedule.
    What ``say`` queues goes out in order (the last chunk padded with silence); with nothing queued it
    sends silence (``idle_silence``, as a live microphone does) or waits for the next ``say``.

    ``started``/``ended``: when the current utterance's first chunk was about to go out and when its last
    one had gone; ``late_ms`` (a list to append to may be given): how late each chunk went out against
    its slot (a client CPU check)."""

    def __init__(
        self,
        ws: Any,
        chunk_ms: int = FRAME_MS,
        rate: int = RATE,
        idle_silence: bool = True,
        late_ms: list[float] | None = None,
        append_type: str = "input_audio_buffer.append",
    ) -> None:
        self.ws = ws
        self.append_type = append_type
        """The append event's type (GPT-Live's is ``session.input_audio.append``)."""
        self.chunk_ms = chunk_ms
        self.chunk_bytes = rate * 2 * chunk_ms // 1000
        self.idle_silence = idle_silence
        self.started: float | None = None
        self.ended: float | None = None
        self.late_ms: list[float] = [] if late_ms is None else late_ms
        self._queue: list[bytes] = []
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._task: asyncio.Task[None] | None = None

    def say(self, pcm: bytes) -> None:
        """Queue an utterance (PCM16 mono at the session's rate)."""
        n = self.chunk_bytes
        pcm += b"\x00" * (-len(pcm) % n)
        self._queue += [pcm[i : i + n] for i in range(0, len(pcm), n)]
        self.started = self.ended = None
        self._drained.clear()
        self._wake.set()

    async def drained(self) -> None:
        """Until everything said has gone out."""
        await self._drained.wait()

    def __enter__(self) -> PacedMic:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        silence = b"\x00" * self.chunk_bytes
        start, sent = time.monotonic(), 0
        while True:
            if not self._queue and not self.idle_silence:
                self._wake.clear()
                await self._wake.wait()
                start, sent = time.monotonic(), 0  # a new schedule from the utterance's first chunk
            now = time.monotonic()
            self.late_ms.append(max(0.0, (now - (start + sent * self.chunk_ms / 1000)) * 1000))
            speech = bool(self._queue)
            if speech and self.started is None:
                self.started = now
            chunk = self._queue.pop(0) if speech else silence
            await self.ws.send(
                json.dumps({"type": self.append_type, "audio": base64.b64encode(chunk).decode()})
            )
            if speech and not self._queue:
                self.ended = time.monotonic()
                self._drained.set()
            sent += 1
            await asyncio.sleep(pace_delay(start, sent, self.chunk_ms, 1.0, time.monotonic()))
