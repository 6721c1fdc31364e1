"""GPT-Live benchmark: voice-to-voice latency next to ``/v1/realtime``, and sessions carried in real time.

Starts its own gateways on free loopback ports and drives them with raw WebSocket clients:

1. Voice to voice on the CPU default (Piper TTS, pocketsphinx, Silero VAD, Smart Turn; echo responder):
   one GPT-Live session and one ``/v1/realtime`` session configured as the GPT-Live face configures
   its realtime session (server VAD that answers and interrupts, streaming transcription) on the same
   gateway, each fed the same Piper sentence at real time by a paced microphone that keeps sending
   silence, turns alternating between the two. Per turn: the user's speech ends (its last chunk sent)
   -> the first non-silent output audio received (``session.output_audio.delta`` /
   ``response.output_audio.delta``), on the client's clock. p50/p95 of each and their ratio.
2. Sessions one process carries (tone TTS): N GPT-Live sessions at once, each with a microphone
   sending silence and the voice asked to speak (``commentary.append``) every few seconds, reading
   the continuous output stream. Frame lateness: how long after its slot on a real-time schedule
   anchored at the session's first frame each ``session.output_audio.delta`` arrives (its ``end_ms``
   on the session clock). The largest N with p95 lateness <= 20 ms and no errors is carried.

    .venv/bin/python -m loadtest.bench.live                 # full run (~4 min)
    .venv/bin/python -m loadtest.bench.live --quick         # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import json
import random
import statistics
import time
from typing import Any

import msgspec
import websockets

from loadtest.bench.log import append_run
from loadtest.bench.realtime import hardware, pct
from realtime_gw.protocols import live
from realtime_gw.sessions.live import realtime_update
from realtime_gw.testing.audio import synthesize
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from realtime_gw.testing.load_client import RATE, PacedMic, open_session, run_sessions

TEXT = "Please open the door."
REALTIME_SESSION: dict[str, Any] = msgspec.to_builtins(
    realtime_update(live.SessionConfig(model="gpt-live-1"), frozenset({"default"})).session
)
"""The realtime session the GPT-Live face configures (server VAD that answers and interrupts, the
gateway's streaming transcription): the same turns on both protocols."""
ONE_ADDRESS = ("--max-connections-per-client", "0")
LATE_OK_MS = 20.0


async def open_live(server: LiveServer) -> Any:
    ws = await websockets.connect(server.ws + "/v1/live/sessions", max_size=None)
    await ws.send(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
    while json.loads(await ws.recv())["type"] != "session.started":
        pass
    return ws


def audible(event: dict[str, Any]) -> bool:
    return any(base64.b64decode(event["delta"]))


async def live_turn(ws: Any, mic: PacedMic, speech: bytes) -> float | None:
    """Speak; returns speech end -> first non-silent output audio (ms), after the reply has ended."""
    mic.say(speech)
    first: float | None = None
    quiet_since: float | None = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        event = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if event["type"] != "session.output_audio.delta":
            continue
        now = time.monotonic()
        if audible(event):
            if first is None and mic.ended is not None:
                first = now
            quiet_since = None
        elif first is not None:
            quiet_since = quiet_since or now
            if now - quiet_since > 0.8:  # the reply is over
                break
    if first is None or mic.ended is None:
        return None
    return (first - mic.ended) * 1000


async def realtime_turn(ws: Any, mic: PacedMic, speech: bytes) -> float | None:
    mic.say(speech)
    first: float | None = None
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if event["type"] == "response.output_audio.delta" and first is None and audible(event):
            first = time.monotonic()
        elif event["type"] == "response.done":
            break
    if first is None or mic.ended is None:
        return None
    return (first - mic.ended) * 1000


async def voice_to_voice(server: LiveServer, turns: int) -> tuple[list[float], list[float], int]:
    speech = synthesize(TEXT, RATE)
    live_ws, rt_ws = await open_live(server), await open_session(server.ws, REALTIME_SESSION)
    live_ms: list[float] = []
    rt_ms: list[float] = []
    failed = 0
    try:
        with (
            PacedMic(live_ws, 40, append_type="session.input_audio.append") as live_mic,
            PacedMic(rt_ws, 40) as rt_mic,
        ):
            both = [(live_ws, live_mic, live_turn, live_ms), (rt_ws, rt_mic, realtime_turn, rt_ms)]
            for i in range(turns):
                for ws, mic, turn, into in both if i % 2 == 0 else both[::-1]:  # alternate which goes first
                    ms = await turn(ws, mic, speech)
                    failed += ms is None
                    if ms is not None:
                        into.append(ms)
                    await asyncio.sleep(0.5)
    finally:
        await live_ws.close()
        await rt_ws.close()
    return live_ms, rt_ms, failed


async def carried(server: LiveServer, sessions: int, seconds: float) -> tuple[list[float], int]:
    """``sessions`` GPT-Live sessions at once for ``seconds``: their output frames' lateness (ms)."""
    late: list[float] = []

    async def one(i: int) -> None:
        rng = random.Random(i)
        ws = await open_live(server)
        try:
            with PacedMic(ws, 80, append_type="session.input_audio.append"):
                start = time.monotonic()
                anchor: float | None = None
                next_ask = start + rng.uniform(0.5, 2.0)
                while time.monotonic() - start < seconds:
                    if time.monotonic() >= next_ask:
                        ask = {"type": "session.commentary.append", "content": "Your order has shipped today."}
                        await ws.send(json.dumps(ask))
                        next_ask += 4.0
                    try:
                        event = json.loads(await asyncio.wait_for(ws.recv(), 0.5))
                    except TimeoutError:
                        continue
                    if event["type"] == "error":
                        raise RuntimeError(event["error"]["message"])
                    if event["type"] != "session.output_audio.delta":
                        continue
                    now = time.monotonic()
                    if anchor is None:
                        anchor = now - event["end_ms"] / 1000
                    late.append(max(0.0, (now - (anchor + event["end_ms"] / 1000)) * 1000))
        finally:
            await ws.close()

    errors = len(await run_sessions(sessions, one, ramp_s=0.05))
    return late, errors


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--levels", default="4,8,16,32,64")
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    turns = 4 if args.quick else args.turns
    levels = [4, 8] if args.quick else [int(n) for n in args.levels.split(",")]
    seconds = 6.0 if args.quick else args.seconds
    lines: list[str] = []

    def out(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    server = start_server("--policy", "none", *ONE_ADDRESS, name="bench-live")
    try:
        live_ms, rt_ms, failed = await voice_to_voice(server, turns)
    finally:
        stop_server(server)
    out("| voice to voice (speech end -> first non-silent output audio) | turns | p50 ms | p95 ms |")
    out("|---|---|---|---|")
    out(f"| GPT-Live `/v1/live/sessions` | {len(live_ms)} | {statistics.median(live_ms):.0f} | {pct(live_ms, 95):.0f} |")
    out(f"| `/v1/realtime` (the same session config, gateway and turns) | {len(rt_ms)} | {statistics.median(rt_ms):.0f} | {pct(rt_ms, 95):.0f} |")
    ratio50 = statistics.median(live_ms) / statistics.median(rt_ms)
    out(f"| GPT-Live / realtime | | {ratio50:.2f} | {pct(live_ms, 95) / pct(rt_ms, 95):.2f} |")
    out(f"\nTurns without a measurable answer: {failed}")

    tone = start_server("--policy", "none", "--tts", "tone", "--max-sessions", "512", *ONE_ADDRESS, name="bench-live-tone")
    sustained = 0
    try:
        out("")
        out("| GPT-Live sessions (tone TTS, mic silence, commentary every 4 s) | output frames | lateness p50 ms | p95 ms | max ms | errors |")
        out("|---|---|---|---|---|---|")
        for n in levels:
            late, errors = await carried(tone, n, seconds)
            p95 = pct(late, 95)
            out(f"| {n} | {len(late)} | {pct(late, 50):.1f} | {p95:.1f} | {max(late, default=0):.1f} | {errors} |")
            if p95 <= LATE_OK_MS and errors == 0:
                sustained = n
            else:
                break
    finally:
        stop_server(tone)
    out("")
    out(f"GPT-Live sessions carried by one process (p95 frame lateness <= {LATE_OK_MS:.0f} ms, no errors; clients on the same machine): {sustained}")

    if not args.no_write:
        append_run(
            f"\n## {dt.date.today().isoformat()} GPT-Live (`python -m loadtest.bench.live{' --quick' if args.quick else ''}`)\n\n"
            f"- Hardware: {hardware()}; no GPU; client and server share the machine\n"
            f"- Voice to voice: one GPT-Live and one `/v1/realtime` session on one gateway (Piper, pocketsphinx,\n"
            f"  Silero, Smart Turn, echo responder), '{TEXT}' spoken at real time in 40 ms chunks, turns alternating;\n"
            "  speech end = the last speech chunk sent, answer = the first non-silent output audio received.\n"
            "- Sessions: each reads GPT-Live's continuous output; lateness = arrival after the frame's end on a\n"
            "  real-time schedule anchored at the session's first frame.\n\n" + "\n".join(lines) + "\n"
        )


if __name__ == "__main__":
    asyncio.run(main())
