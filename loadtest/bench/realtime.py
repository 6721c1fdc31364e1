"""Realtime voice benchmark: time to first audio, frame lateness, sustained sessions, barge-in latency.

Starts its own gateways on free loopback ports (Piper, and the cheap `tone` TTS for gateway overhead),
drives them with raw WebSocket clients, prints a table and appends it to docs/benchmarks-log.md.

    .venv/bin/python -m loadtest.bench.realtime            # full run (~3 min)
    .venv/bin/python -m loadtest.bench.realtime --quick    # smoke run

CPU numbers are noisy on shared machines, so the Piper TTFA is also given as a ratio to the time the
same machine takes to synthesize the first sentence with Piper directly, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import statistics
import time
from pathlib import Path

from loadtest.bench.log import BENCHMARKS_LOG
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from realtime_gw.testing.load_client import (
    PacedMic,
    ReplyTimes,
    Stats,
    open_session,
    percentile,
    read_reply,
    run_sessions,
    send_text,
    text_turn,
)

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["TEXT", "Stats", "hardware", "pct", "turns_load"]  # what other scripts import

ONE_ADDRESS = ("--max-connections-per-client", "0")
"""Every session of the load comes from 127.0.0.1: lift the per-address connection cap."""

TEXT = "Please open the door for me. I would like a cup of coffee."


def pct(xs: list[float], q: float) -> float:
    p = percentile(xs, q)
    return float("nan") if p is None else p


async def turns_load(server: LiveServer, sessions: int, seconds: float) -> Stats:
    stats = Stats()
    deadline = time.monotonic() + seconds

    async def one(i: int) -> None:
        ws = await open_session(server.ws, {"audio": {"input": {"turn_detection": None}}})
        try:
            while time.monotonic() < deadline:
                await text_turn(ws, TEXT, lambda: stats)
        finally:
            await ws.close()

    stats.errors += len(await run_sessions(sessions, one, ramp_s=0.05))
    return stats


async def barge_in(server: LiveServer, sessions: int, speech_pcm: bytes) -> Stats:
    """User speech onset -> last audio frame of the cancelled response received (server VAD)."""
    stats = Stats()
    session = {"audio": {"input": {"turn_detection": {"type": "server_vad", "create_response": False}}}}

    async def one(i: int) -> None:
        ws = await open_session(server.ws, session)
        try:
            with PacedMic(ws) as mic:
                spoke: list[float] = []

                def speak_over_reply(reply: ReplyTimes, now: float) -> None:
                    # 1.5 s into the reply, the user talks over it (once)
                    if reply.first is not None and now - reply.first > 1.5 and not spoke:
                        spoke.append(now)
                        mic.say(speech_pcm)

                await send_text(ws, TEXT * 3)
                reply = await read_reply(ws, on_event=speak_over_reply)
                if reply.status == "cancelled" and mic.started is not None and reply.last is not None:
                    stats.barge_in_ms.append((reply.last - mic.started) * 1000)
                else:
                    stats.errors += 1
        finally:
            await ws.close()

    stats.errors += len(await run_sessions(sessions, one, ramp_s=0.05))
    return stats


def piper_baseline_ms(repeats: int = 5) -> float:
    """Synthesis time of TEXT's first sentence with Piper directly (no gateway), same machine, same run."""
    from realtime_gw.testing.audio import synthesize

    synthesize("Warm up.")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        synthesize(TEXT.split(". ")[0] + ".")
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def hardware() -> str:
    model = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    seconds = 6.0 if args.quick else args.seconds
    levels = [1, 4] if args.quick else [1, 4, 16]
    tone_levels = [16, 64] if args.quick else [16, 32, 64, 128, 192, 256]
    lines: list[str] = []

    def out(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    baseline = piper_baseline_ms()
    from realtime_gw.testing.audio import synthesize

    stop_speech = synthesize("Hold on, please stop talking now.", 24000)
    piper = start_server(
        "--policy", "none", "--max-sessions", "512", *ONE_ADDRESS, name="bench-piper"
    )  # fmt: skip
    try:
        out(f"Piper first-sentence synthesis, direct (baseline): {baseline:.0f} ms")
        out("")
        out(
            "| TTS | sessions | turns | TTFA p50 ms | TTFA p95 ms | TTFA p50 / baseline | lateness p95 ms | lateness max ms | errors |"
        )
        out("|---|---|---|---|---|---|---|---|---|")
        for n in levels:
            s = await turns_load(piper, n, seconds)
            out(
                f"| piper | {n} | {s.turns} | {pct(s.ttfa_ms, 50):.0f} | {pct(s.ttfa_ms, 95):.0f} | "
                f"{pct(s.ttfa_ms, 50) / baseline:.2f} | {pct(s.lateness_ms, 95):.1f} | "
                f"{max(s.lateness_ms, default=0):.1f} | {s.errors} |"
            )
        out("")
        out("| barge-in (server VAD, interrupt_response) | sessions | p50 ms | p95 ms | errors |")
        out("|---|---|---|---|---|")
        for n in [1, 4] if args.quick else [1, 16]:
            s = await barge_in(piper, n, stop_speech)
            out(
                f"| onset -> last frame of cancelled response | {n} | {pct(s.barge_in_ms, 50):.0f} | {pct(s.barge_in_ms, 95):.0f} | {s.errors} |"
            )
    finally:
        stop_server(piper)

    tone = start_server(
        "--policy", "none", "--tts", "tone", "--max-sessions", "1024", *ONE_ADDRESS, name="bench-tone"
    )  # fmt: skip
    sustained = 0
    try:
        out("")
        out("| TTS | sessions | turns | TTFA p50 ms | TTFA p95 ms | lateness p95 ms | errors |")
        out("|---|---|---|---|---|---|---|")
        for n in tone_levels:
            s = await turns_load(tone, n, max(seconds / 2, 5.0))
            late = pct(s.lateness_ms, 95)
            out(
                f"| tone | {n} | {s.turns} | {pct(s.ttfa_ms, 50):.0f} | {pct(s.ttfa_ms, 95):.0f} | {late:.1f} | {s.errors} |"
            )
            if late <= 20.0 and s.errors == 0:
                sustained = n
            else:
                break
        out("")
        out(
            f"Sessions sustained by the gateway itself (tone TTS, p95 frame lateness <= 20 ms, no errors; "
            f"client and server share this machine): {sustained}"
        )
    finally:
        stop_server(tone)

    if not args.no_write:
        doc = BENCHMARKS_LOG
        header = "" if doc.exists() else "# Benchmarks\n"
        with doc.open("a") as f:
            f.write(
                f"{header}\n## Realtime voice ({dt.date.today().isoformat()})\n\n"
                f"- Hardware: {hardware()}; no GPU\n"
                f"- Command: `.venv/bin/python -m loadtest.bench.realtime{' --quick' if args.quick else ''}`\n"
                "- Each session loops text turns (two sentences, ~3.5 s of audio, paced at real time with a 400 ms lead);\n"
                "  TTFA = `response.create` sent -> first audio delta received; lateness = arrival after the frame's\n"
                "  real-time playback slot. Client and server share the machine.\n\n"
                + "\n".join(lines)
                + "\n"
            )


if __name__ == "__main__":
    asyncio.run(main())
