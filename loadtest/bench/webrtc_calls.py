"""WebRTC calls per core: N aiortc callers (in another process) against one gateway, the gateway's CPU
and the calls' audio; the same N as WebSocket sessions, same traffic, as the baseline of the same run;
and the same N calls against a second gateway whose calls' media runs in ``--media-workers`` worker
processes (``webrtc_media_workers``).

Each caller streams its microphone (silence, 20 ms Opus frames; the WebSocket baseline: 80 ms PCM16
appends) for the whole run and asks a typed turn every ``--turn-s`` seconds, answered by the ``tone``
TTS (the gateway's own cost, not a model's). Measured: the gateway's CPU (its process tree, media
workers included), so calls per core, and its main process's alone (the loop that runs the sessions);
reply frames the callers did not receive in time (WebRTC: frames missing between the first
and last of each reply; that is what a browser conceals); the gateway track's frame lateness.

    .venv/bin/python -m loadtest.bench.webrtc_calls                 # 5, 10, 20 calls, 20 s each
    .venv/bin/python -m loadtest.bench.webrtc_calls --calls 10 --seconds 10 --media-workers 2
    .venv/bin/python -m loadtest.bench.webrtc_calls --calls 5 --stall   # the sessions' process stalled

``--stall``: both gateways run their CPU backends in their own process (``--cpu-backends-in-process``)
and, while each measurement runs, a WebSocket session commits 12 s of noise to pocketsphinx over and
over (``loadtest/bench/isolation.py``'s attacker): the GIL-bound decodes stall the gateway's process,
which is where sessions (and, without media workers, calls' media) run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import json
import multiprocessing
import platform
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from loadtest.bench.isolation import Phase, noisy_commits
from loadtest.bench.log import append_run
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from realtime_gw.testing.load_client import open_session
from tests.server.webrtc.caller import Caller, call

ROOT = Path(__file__).resolve().parents[2]
TEXT = "The quick brown fox jumps over the lazy dog near the river bank."


def cpu_seconds(pid: int, tree: bool = True) -> float:
    proc = psutil.Process(pid)
    total = 0.0
    for p in [proc, *(proc.children(recursive=True) if tree else [])]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


class Start:
    """Every client connected (or failed to): the measured window opens for all at once."""

    def __init__(self, count: int, out: Any) -> None:
        self.left, self.out, self.go = count, out, asyncio.Event()

    def connected(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.out.put("go")
            self.go.set()


async def one_call(server: LiveServer, seconds: float, turn_s: float, start: Start) -> dict[str, float]:
    caller = Caller()
    try:
        try:
            resp = await call(server, caller)
            if resp.status_code == 201:
                await caller.wait_for(lambda e: e.type == "session.created", timeout=30)
        finally:
            start.connected()
        if resp.status_code != 201:
            return {"failed": 1}
        await start.go.wait()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            caller.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                         "content": [{"type": "input_text", "text": TEXT}]}})  # fmt: skip
            caller.send({"type": "response.create"})
            await asyncio.sleep(turn_s)
        # frames of replies: between each output_audio_buffer.started and .stopped, 20 ms apart
        expected = received = 0
        starts = [t for t, e in caller.events if e.type == "output_audio_buffer.started"]
        stops = [t for t, e in caller.events if e.type == "output_audio_buffer.stopped"]
        for t0, t1 in zip(starts, stops, strict=False):
            frames = [t for t, s in caller.heard if t0 <= t <= t1 + 0.1 and abs(int(s.max(initial=0))) > 100]
            if len(frames) > 1:
                expected += round((frames[-1] - frames[0]) / 0.02) + 1
                received += len(frames)
        return {"expected": expected, "received": received}
    finally:
        await caller.close()


async def one_socket(server: LiveServer, seconds: float, turn_s: float, start: Start) -> dict[str, float]:
    try:
        ws = await open_session(server.ws, {})
    finally:
        start.connected()
    await start.go.wait()
    silence = base64.b64encode(bytes(3840)).decode()
    frames = 0

    async def reader() -> None:
        nonlocal frames
        async for raw in ws:
            if '"response.output_audio.delta"' in raw:
                frames += 1

    task = asyncio.create_task(reader())
    try:
        start = time.monotonic()
        next_turn = start
        n = 0
        while time.monotonic() < start + seconds:
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": silence}))
            if time.monotonic() >= next_turn:
                item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TEXT}]}
                await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
                await ws.send(json.dumps({"type": "response.create"}))
                next_turn += turn_s
            n += 1
            await asyncio.sleep(max(0.0, start + n * 0.08 - time.monotonic()))
        return {"expected": frames, "received": frames}
    finally:
        task.cancel()
        await ws.close()


def run_clients(kind: str, port: int, count: int, seconds: float, turn_s: float, out: Any) -> None:
    server = LiveServer(port=port, proc=None, log_path=Path("/dev/null"))  # type: ignore[arg-type]
    one = one_call if kind == "webrtc" else one_socket

    async def main() -> list[Any]:
        start = Start(count, out)

        async def staggered(i: int) -> Any:
            await asyncio.sleep(i * 0.05)
            return await one(server, seconds, turn_s, start)

        return await asyncio.gather(*(staggered(i) for i in range(count)), return_exceptions=True)

    results = asyncio.run(main())
    out.put([r if isinstance(r, dict) else {"failed": 1, "error": repr(r)} for r in results])


def late_fraction(server: LiveServer, before: tuple[float, float]) -> float:
    count = server.metric("realtime_gw_call_frame_lateness_seconds_count") - before[0]
    on_time = server.metric("realtime_gw_call_frame_lateness_seconds_bucket", 'le="0.02"') - before[1]
    return (count - on_time) / count if count else 0.0


def stall(server: LiveServer, stop: threading.Event) -> threading.Thread:
    """Noisy commits to the gateway's in-process pocketsphinx, one after another until ``stop``."""

    async def attack() -> None:
        while not stop.is_set():
            await noisy_commits(server, 1, Phase())

    thread = threading.Thread(target=asyncio.run, args=(attack(),), daemon=True)
    thread.start()
    return thread


def measure(
    server: LiveServer, kind: str, count: int, seconds: float, turn_s: float, stalled: bool = False
) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    lateness_before = (
        server.metric("realtime_gw_call_frame_lateness_seconds_count"),
        server.metric("realtime_gw_call_frame_lateness_seconds_bucket", 'le="0.02"'),
    )
    proc = ctx.Process(target=run_clients, args=(kind, server.port, count, seconds, turn_s, out))
    proc.start()
    assert out.get(timeout=120) == "go"
    stop = threading.Event()
    attacker = stall(server, stop) if stalled else None
    cpu0, main0, t0 = cpu_seconds(server.proc.pid), cpu_seconds(server.proc.pid, tree=False), time.monotonic()
    results = out.get(timeout=seconds + 120)
    cpu1, main1, t1 = cpu_seconds(server.proc.pid), cpu_seconds(server.proc.pid, tree=False), time.monotonic()
    proc.join()
    if attacker is not None:
        stop.set()
        attacker.join(timeout=60)
    ok = [r for r in results if not r.get("failed")]
    expected = sum(r["expected"] for r in ok)
    received = sum(r["received"] for r in ok)
    cores = (cpu1 - cpu0) / (t1 - t0)
    return {
        "kind": kind,
        "n": count,
        "failed": len(results) - len(ok),
        "cores": cores,
        "main_cores": (main1 - main0) / (t1 - t0),
        "per_core": count / cores if cores else float("inf"),
        "missing": 1 - received / expected if expected else 0.0,
        "late": late_fraction(server, lateness_before) if kind == "webrtc" else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[5, 10, 20])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--turn-s", type=float, default=5.0)
    parser.add_argument("--media-workers", type=int, default=2, help="0: no media-worker gateway")
    parser.add_argument("--stall", action="store_true", help="stall the gateways' process while measuring")
    args = parser.parse_args()
    flags: tuple[str, ...] = (
        "--policy", "none", "--tts", "tone", "--max-connections-per-client", "0", "--max-sessions", "1024",
    )  # fmt: skip
    if args.stall:
        flags += ("--cpu-backends-in-process",)
    servers = {"loop": start_server(*flags, name="webrtc-bench")}
    if args.media_workers:
        servers["workers"] = start_server(
            *flags, "--webrtc-media-workers", str(args.media_workers), name="webrtc-bench-workers"
        )
    rows: list[dict[str, Any]] = []
    try:
        for n in args.calls:
            for label, server, kind in [
                ("websocket", servers["loop"], "websocket"),
                *[(f"webrtc/{where}", s, "webrtc") for where, s in servers.items()],
            ]:
                result = measure(server, kind, n, args.seconds, args.turn_s, args.stall)
                rows.append({**result, "label": label})
                r = rows[-1]
                late = "-" if r["late"] is None else f"{r['late']:.2%}"
                print(f"{label:15} n={n:3}  gateway {r['cores']:.2f} cores (main process {r['main_cores']:.2f})  "
                      f"{r['per_core']:.1f}/core  failed {r['failed']}  missing {r['missing']:.2%}  late {late}",
                      flush=True)  # fmt: skip
    finally:
        for server in servers.values():
            stop_server(server)
    table = ["| calls | media | WebSocket cores | WebRTC cores (main process) | WebRTC / WebSocket CPU | WebRTC calls per core | failed | missing reply frames | track frames > 20 ms late |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    per_n = len(servers) + 1
    for i in range(0, len(rows), per_n):
        ws_row = rows[i]
        for rtc in rows[i + 1 : i + per_n]:
            ratio = rtc["cores"] / ws_row["cores"] if ws_row["cores"] else float("inf")
            media = "gateway loop" if rtc["label"] == "webrtc/loop" else f"{args.media_workers} workers"
            table.append(f"| {rtc['n']} | {media} | {ws_row['cores']:.2f} | {rtc['cores']:.2f} ({rtc['main_cores']:.2f}) | "
                         f"{ratio:.1f}x | {rtc['per_core']:.1f} | {rtc['failed']} | {rtc['missing']:.2%} | {rtc['late']:.2%} |")  # fmt: skip
    print("\n".join(table))
    load = " ".join(f"{x:.1f}" for x in psutil.getloadavg())
    append_run(
        f"\n## {dt.date.today()} WebRTC calls per core, media on the loop vs in workers "
        f"(`python -m loadtest.bench.webrtc_calls --calls {' '.join(map(str, args.calls))} "
        f"--seconds {args.seconds:g} --media-workers {args.media_workers}{' --stall' if args.stall else ''}`)\n\n"
        f"{platform.processor() or platform.machine()}, {psutil.cpu_count()} cores (shared; load average "
        f"{load} at the end), tone TTS, a turn every {args.turn_s:g} s, callers in another process"
        f"{'; the gateways stalled by noisy pocketsphinx decodes in their process' if args.stall else ''}.\n\n"
        + "\n".join(table) + "\n"
    )


if __name__ == "__main__":
    main()
