"""Streaming vs one-shot ASR: speech stopped -> transcript, and turn latency, at 1 and N sessions.

Starts a gateway from this checkout (pocketsphinx decoding while the user speaks) and one from an
older commit's checkout (``--before``: a git worktree where the utterance is decoded on commit), one
after the other on free loopback ports, with the same flags, and drives each with raw WebSocket
clients that speak a Piper sentence at real time (server VAD, transcription on, echo responder):

    git worktree add /tmp/asr-before 78c2a48
    .venv/bin/python -m loadtest.bench.asr_stream --before /tmp/asr-before --sessions 1,20

Per turn: `input_audio_buffer.speech_stopped` -> `conversation.item.input_audio_transcription.completed`
(the transcript's latency) and `speech_stopped` -> first `response.output_audio.delta` (turn latency),
both on the client's clock. Prints a markdown table (and appends it to docs/benchmarks-log.md with
``--write``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from loadtest.bench.log import append_run
from loadtest.bench.realtime import hardware, pct
from realtime_gw.testing.audio import synthesize
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from realtime_gw.testing.load_client import RATE, PacedMic, open_session

ROOT = Path(__file__).resolve().parents[2]

TEXT = "What is the weather like in Paris today?"
CHUNK_MS = 40
SESSION = {
    "audio": {
        "input": {"transcription": {"model": "pocketsphinx"}, "turn_detection": {"type": "server_vad"}}
    },
}


async def session(
    server: LiveServer, speech: bytes, turns: int, rng: random.Random
) -> list[dict[str, float]]:
    """One user: ``turns`` spoken turns, each answered before the next; per-turn latencies in ms."""
    out: list[dict[str, float]] = []
    ws = await open_session(server.ws, SESSION)
    try:
        # 40 ms appends at real time while the user speaks; nothing between turns
        with PacedMic(ws, CHUNK_MS, idle_silence=False) as mic:
            await asyncio.sleep(rng.uniform(0.0, 2.0))  # users do not start in step
            for _ in range(turns):
                times: dict[str, float] = {}
                mic.say(bytes(RATE * 2 * 3 // 10) + speech + bytes(RATE * 2))
                while "done" not in times:
                    event = json.loads(await asyncio.wait_for(ws.recv(), 120))
                    kind, now = event["type"], time.monotonic()
                    if kind == "input_audio_buffer.speech_stopped":
                        times.setdefault("stopped", now)
                    elif kind == "conversation.item.input_audio_transcription.completed":
                        times.setdefault("transcript", now)
                    elif kind == "response.output_audio.delta":
                        times.setdefault("audio", now)
                    elif kind == "response.done":
                        times["done"] = now
                await mic.drained()
                if {"stopped", "transcript", "audio"} <= times.keys():
                    out.append(
                        {
                            "stt_ms": 1000 * (times["transcript"] - times["stopped"]),
                            "turn_ms": 1000 * (times["audio"] - times["stopped"]),
                        }
                    )
                await asyncio.sleep(rng.uniform(0.5, 1.5))
    finally:
        await ws.close()
    return out


async def load(server: LiveServer, sessions: int, turns: int, speech: bytes) -> list[dict[str, float]]:
    rng = random.Random(sessions)
    results = await asyncio.gather(
        *(session(server, speech, turns, random.Random(rng.random())) for _ in range(sessions))
    )
    return [r for rs in results for r in rs]


def wait_for_spares(server: LiveServer, timeout: float = 300.0) -> None:
    """A gateway that warms spare child processes after /readyz: measure once they are warm, not
    while they take the CPU."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spares = [
            line
            for line in httpx.get(server.http + "/metrics", timeout=5).text.splitlines()
            if line.startswith("realtime_gw_backend_spare_ready{")
        ]
        if all(line.endswith(" 1.0") for line in spares):
            return
        time.sleep(1.0)


def row(label: str, sessions: int, turns: list[dict[str, float]]) -> dict[str, Any]:
    stt = [t["stt_ms"] for t in turns]
    lat = [t["turn_ms"] for t in turns]
    return {
        "label": label,
        "sessions": sessions,
        "turns": len(turns),
        "stt_p50": statistics.median(stt) if stt else float("nan"),
        "stt_p95": pct(stt, 95),
        "turn_p50": statistics.median(lat) if lat else float("nan"),
        "turn_p95": pct(lat, 95),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="checkout of the one-shot gateway (git worktree)")
    ap.add_argument("--sessions", default="1,20")
    ap.add_argument("--turns", type=int, default=3, help="turns per session")
    ap.add_argument("--server-args", default="--policy none --asr-slots 20")
    ap.add_argument("--after-args", default="", help="extra flags for this checkout's gateway only")
    ap.add_argument("--write", action="store_true", help="append the table to docs/benchmarks-log.md")
    args = ap.parse_args()
    speech = synthesize(TEXT, RATE)
    counts = [int(n) for n in args.sessions.split(",")]
    rows: list[dict[str, Any]] = []
    runs = (
        ("before (one-shot on commit)", Path(args.before), ""),
        ("after (streaming)", ROOT, args.after_args),
    )
    for label, root, extra in runs:
        flags = (args.server_args + " " + extra).split()
        server = start_server(*flags, name="bench-asr", code_root=root, timeout=300)
        try:
            wait_for_spares(server)
            for n in counts:
                rows.append(row(label, n, asyncio.run(load(server, n, args.turns, speech))))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            stop_server(server)
    lines = [
        "",
        f"### Streaming ASR: speech stopped -> transcript and turn latency ({dt.date.today().isoformat()})",
        "",
        f"Hardware: {hardware()}. Command: `python -m loadtest.bench.asr_stream --before /tmp/asr-before "
        f"--sessions {args.sessions} --turns {args.turns} --server-args '{args.server_args}'` (before = 78c2a48, "
        "the utterance decoded on commit; after = this commit, decoded while the user speaks; both gateways "
        "run in the same invocation, one after the other). Each session speaks "
        f'"{TEXT}" ({len(speech) / RATE / 2:.1f} s) at real time, server VAD, transcription on, echo responder.',
        "",
        "| gateway | sessions | turns | speech stopped -> transcript p50 / p95 | turn latency p50 / p95 |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['sessions']} | {r['turns']} | {r['stt_p50']:.0f} / {r['stt_p95']:.0f} ms "
            f"| {r['turn_p50']:.0f} / {r['turn_p95']:.0f} ms |"
        )
    for n in counts:
        before = next(r for r in rows if r["sessions"] == n and r["label"].startswith("before"))
        after = next(r for r in rows if r["sessions"] == n and r["label"].startswith("after"))
        lines.append(
            f"\n{n} session(s): transcript p50 {before['stt_p50'] / max(after['stt_p50'], 1e-9):.1f}x sooner, "
            f"turn latency p50 {before['turn_p50'] / max(after['turn_p50'], 1e-9):.1f}x sooner."
        )
    table = "\n".join(lines) + "\n"
    print(table)
    if args.write:
        append_run(table)


if __name__ == "__main__":
    main()
