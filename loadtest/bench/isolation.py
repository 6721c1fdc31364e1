"""CPU isolation benchmark: a noisy 12 s commit decoded by pocketsphinx, in the gateway's process vs in
its child process, measured the same run on the same machine.

For each mode a gateway (Piper TTS, pocketsphinx ASR, no policy) is started; a bystander session loops
text turns the whole time; `/healthz` is probed every 50 ms. First a quiet phase (the baseline), then an
attacker commits 12 s of loud noise (transcription on, no turn detection) a few times in a row. Printed:
`/healthz` latency, the bystander's time to first audio and frame lateness, and how long each noisy
decode took, per phase; then appended to docs/benchmarks-log.md.

    .venv/bin/python -m loadtest.bench.isolation             # ~3 min
    .venv/bin/python -m loadtest.bench.isolation --quick     # one noisy commit per mode
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from loadtest.bench.log import append_run
from loadtest.bench.realtime import TEXT, hardware, pct
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from realtime_gw.testing.load_client import Stats, open_session, text_turn

ROOT = Path(__file__).resolve().parents[2]

NOISE_SECONDS = 12.0
NO_KEEPALIVE = {"ping_interval": None}
"""No client keepalive: an in-process gateway may not answer a ping for longer than its timeout, and
that is what is being measured, not a reason to drop the bystander."""
MODES = {"in-process (threads)": ["--cpu-backends-in-process"], "child process": []}


@dataclass
class Phase:
    healthz_ms: list[float] = field(default_factory=list)
    bystander: Stats = field(default_factory=Stats)
    decode_s: list[float] = field(default_factory=list)


def noise_pcm(seconds: float) -> bytes:
    """Loud white noise, 24 kHz PCM16: the decoder's worst case (every frame is 'speech')."""
    rng = np.random.default_rng(0)
    return (rng.standard_normal(int(24000 * seconds)) * 8000).clip(-32768, 32767).astype("<i2").tobytes()


async def probe_healthz(server: LiveServer, phase: list[Phase], stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(base_url=server.http, timeout=120) as http:
        while not stop.is_set():
            t = time.monotonic()
            await http.get("/healthz")
            phase[0].healthz_ms.append((time.monotonic() - t) * 1000)
            await asyncio.sleep(0.05)


async def bystander(server: LiveServer, phase: list[Phase], stop: asyncio.Event) -> None:
    """Text turns back to back; each TTFA and each frame's lateness counts in the phase it happened in
    (a turn may span both)."""
    ws = await open_session(server.ws, {"audio": {"input": {"turn_detection": None}}}, **NO_KEEPALIVE)
    try:
        while not stop.is_set():
            await text_turn(ws, TEXT, lambda: phase[0].bystander)
    finally:
        await ws.close()


async def noisy_commits(server: LiveServer, count: int, into: Phase) -> None:
    audio = base64.b64encode(noise_pcm(NOISE_SECONDS)).decode()
    session = {"audio": {"input": {"turn_detection": None, "transcription": {"model": "pocketsphinx"}}}}
    ws = await open_session(server.ws, session, **NO_KEEPALIVE)
    try:
        for _ in range(count):
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            t = time.monotonic()
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            while True:
                kind = json.loads(await ws.recv())["type"]
                if kind in (
                    "conversation.item.input_audio_transcription.completed",
                    "conversation.item.input_audio_transcription.failed",
                ):
                    into.decode_s.append(time.monotonic() - t)
                    break
    finally:
        await ws.close()


async def measure(server: LiveServer, quiet_s: float, commits: int) -> tuple[Phase, Phase]:
    quiet, attacked = Phase(), Phase()
    current = [quiet]
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(probe_healthz(server, current, stop)),
        asyncio.create_task(bystander(server, current, stop)),
    ]
    await asyncio.sleep(quiet_s)
    current[0] = attacked
    await noisy_commits(server, commits, attacked)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 120)
    return quiet, attacked


def row(mode: str, name: str, p: Phase) -> str:
    s = p.bystander
    decode = f"{np.mean(p.decode_s):.1f}" if p.decode_s else "-"
    return (
        f"| {mode} | {name} | {pct(p.healthz_ms, 50):.0f} / {pct(p.healthz_ms, 99):.0f} / "
        f"{max(p.healthz_ms, default=float('nan')):.0f} | {s.turns} | {pct(s.ttfa_ms, 50):.0f} / "
        f"{pct(s.ttfa_ms, 95):.0f} | {pct(s.lateness_ms, 95):.0f} / {max(s.lateness_ms, default=0):.0f} | "
        f"{decode} | {s.errors} |"
    )


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    commits, quiet_s = (1, 6.0) if args.quick else (3, 10.0)
    lines: list[str] = []

    def out(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    out(
        "| mode | phase | /healthz p50 / p99 / max ms | bystander turns | TTFA p50 / p95 ms | "
        "frame lateness p95 / max ms | noisy decode s | errors |"
    )
    out("|---|---|---|---|---|---|---|---|")
    results: dict[str, tuple[Phase, Phase]] = {}
    for mode, flags in MODES.items():
        server = start_server("--policy", "none", *flags, name="bench-isolation")
        try:
            results[mode] = await measure(server, quiet_s, commits)
        finally:
            stop_server(server)
        out(row(mode, "quiet", results[mode][0]))
        out(row(mode, f"{commits} x {NOISE_SECONDS:g} s noise", results[mode][1]))
    (_, threads), (_, child) = results.values()
    ratios = (
        f"Under attack, in-process / child process: /healthz max {max(threads.healthz_ms) / max(child.healthz_ms):.0f}x, "
        f"bystander TTFA p95 {pct(threads.bystander.ttfa_ms, 95) / pct(child.bystander.ttfa_ms, 95):.1f}x, "
        f"frame lateness max {max(threads.bystander.lateness_ms, default=0) / max(max(child.bystander.lateness_ms, default=0), 1):.1f}x."
    )
    out("")
    out(ratios)
    if not args.no_write:
        append_run(
            f"\n## CPU isolation: pocketsphinx and Piper in-process vs in a child process "
            f"({dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC)\n\n"
            f"- Hardware: {hardware()}; no GPU; a shared machine (other work ran meanwhile: compare\n"
            "  the two modes of this run, not absolute numbers across runs)\n"
            f"- Command: `.venv/bin/python -m loadtest.bench.isolation{' --quick' if args.quick else ''}`\n"
            "- Gateway: Piper TTS, pocketsphinx ASR (4 slots), echo responder; in-process =\n"
            "  `--cpu-backends-in-process`. A bystander loops text turns (TTFA = `response.create` ->\n"
            "  first audio delta; lateness = arrival after the frame's real-time slot); `/healthz` probed\n"
            f"  every 50 ms; the attacker commits {NOISE_SECONDS:g} s of loud noise (transcription on).\n\n"
            + "\n".join(lines)
            + "\n"
        )


if __name__ == "__main__":
    asyncio.run(main())
