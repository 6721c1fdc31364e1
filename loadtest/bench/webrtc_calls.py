"""WebRTC calls per core: a curve over call counts and media-worker counts. For each ``--media-workers``
M, one gateway (``webrtc_media_workers`` M; 0: media on the gateway's own loop) takes each of
``--calls`` N aiortc callers in turn, the callers spread over caller processes (``--calls-per-proc``
each, so they are not the bottleneck); optionally the same N as WebSocket sessions, same traffic, as the
baseline of the same run (``--baseline``, on the first gateway).

Each caller streams its microphone (silence, 20 ms Opus frames; the WebSocket baseline: 80 ms PCM16
appends) for ``--seconds`` and asks a typed turn every ``--turn-s`` seconds, answered by the ``tone`` TTS
(the gateway's own cost, not a model's). Per cell: the gateway's CPU (its process tree, media workers
included), so calls per core, and its main process's alone (the loop that runs the sessions); the
replies' frames the callers would conceal, playing them as a browser with a fixed 60 ms jitter buffer
would (frames that never came, or came after their playout time); the gateway's own figures: track frames that left > 20 ms late, reply frames it underran,
and, per call, the share of the caller's audio it had to conceal (lost packets); the whole box's busy
share and the callers' CPU (a box near 100 % busy measures the box, not the gateway).

A media-worker count stops at the first N that fails (``--stop-above``: that share of calls failed or of
reply frames concealed); ``--budget-s`` stops the run before a cell could overrun it; ``--json PATH`` is
rewritten after every cell.

    .venv/bin/python -m loadtest.bench.webrtc_calls         # 5, 10, 20 calls: media on the loop, in 2 workers
    .venv/bin/python -m loadtest.bench.webrtc_calls --calls 25 50 100 200 --media-workers 8 4 2 1 \\
        --seconds 12 --no-baseline --json /tmp/calls.json --budget-s 540   # the curve, a 16-core box
    .venv/bin/python -m loadtest.bench.webrtc_calls --calls 5 --stall   # the sessions' process stalled

``--stall``: the gateways run their CPU backends in their own process (``--cpu-backends-in-process``)
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
import math
import multiprocessing
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

from loadtest.bench.log import append_run
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from realtime_gw.testing.load_client import open_session
from tests.server.webrtc.caller import Caller, call

TEXT = "The quick brown fox jumps over the lazy dog near the river bank."
JITTER_BUFFER_S = 0.06
"""The callers play replies as a browser with a fixed 60 ms jitter buffer would (Chromium's adapts)."""
START_EVERY_S = 0.05
"""Calls start this far apart, over all caller processes (20 a second)."""
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- CPU, from /proc (Linux) -------------------------------------------------------------------------------
def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes (those still alive)."""
    total = 0
    for pid in pids:
        if (fields := _stat(pid)) is not None:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLK_TCK


def box_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


# -- the callers ---------------------------------------------------------------------------------------------
def reply_frames(caller: Caller, jitter_buffer_s: float) -> dict[str, float]:
    """The replies' frames as a browser with a fixed ``jitter_buffer_s`` would play them: between each
    reply's first and last loud frame (by their RTP time), those that never came or came after their
    playout time (the first frame's arrival + the buffer + their media time since it) are concealed."""
    expected = concealed = 0
    starts = [t for t, e in caller.events if e.type == "output_audio_buffer.started"]
    stops = [t for t, e in caller.events if e.type == "output_audio_buffer.stopped"]
    heard = list(zip(caller.heard, caller.heard_at_s, strict=False))
    for t0, t1 in zip(starts, stops, strict=False):
        loud = [(t, at) for (t, s), at in heard if t0 <= t <= t1 + 0.5 and abs(int(s.max(initial=0))) > 100]
        if len(loud) < 2:
            continue
        first_t, first_at = loud[0]
        frames = round((loud[-1][1] - first_at) / 0.02) + 1
        on_time = sum(1 for t, at in loud if t <= first_t + jitter_buffer_s + (at - first_at))
        expected += frames
        concealed += max(0, frames - on_time)
    return {"expected": expected, "concealed": concealed}


async def one_call(server: LiveServer, seconds: float, turn_s: float, started: Any) -> dict[str, float]:
    caller = Caller()
    try:
        try:
            resp = await call(server, caller)
            if resp.status_code == 201:
                await caller.wait_for(lambda e: e.type == "session.created", timeout=30)
        finally:
            started.connected()
        if resp.status_code != 201:
            return {"failed": 1}
        await started.go.wait()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            caller.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                         "content": [{"type": "input_text", "text": TEXT}]}})  # fmt: skip
            caller.send({"type": "response.create"})
            await asyncio.sleep(turn_s)
        return reply_frames(caller, JITTER_BUFFER_S)
    finally:
        await caller.close()


async def one_socket(server: LiveServer, seconds: float, turn_s: float, started: Any) -> dict[str, float]:
    try:
        ws = await open_session(server.ws, {})
    finally:
        started.connected()
    await started.go.wait()
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
        return {"expected": frames, "concealed": 0}
    finally:
        task.cancel()
        await ws.close()


class Started:
    """This process's clients connected (or failed to): it says so, and all begin when the parent says."""

    def __init__(self, count: int, out: Any, begin: Any) -> None:
        self.left, self.out, self.begin, self.go = count, out, begin, asyncio.Event()
        self.loop = asyncio.get_running_loop()

    def connected(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.out.put(("connected", os.getpid()))
            self.loop.run_in_executor(None, self._wait_for_the_parent)

    def _wait_for_the_parent(self) -> None:
        self.begin.wait()
        self.loop.call_soon_threadsafe(self.go.set)


def run_clients(kind: str, port: int, slots: list[int], seconds: float, turn_s: float, out: Any, begin: Any) -> None:
    """One caller process: a client for each of ``slots`` (its start order over all processes)."""
    server = LiveServer(port=port, proc=None, log_path=Path("/dev/null"))  # type: ignore[arg-type]
    one = one_call if kind == "webrtc" else one_socket

    async def main() -> list[Any]:
        started = Started(len(slots), out, begin)

        async def staggered(slot: int) -> Any:
            await asyncio.sleep(slot * START_EVERY_S)
            return await one(server, seconds, turn_s, started)

        return await asyncio.gather(*(staggered(s) for s in slots), return_exceptions=True)

    results = asyncio.run(main())
    out.put(("results", [r if isinstance(r, dict) else {"failed": 1, "error": repr(r)} for r in results]))


# -- one cell ----------------------------------------------------------------------------------------------
END_OF_CALL = {
    "input_concealed": ("realtime_gw_call_concealed_ratio", 'direction="input"'),
    "output_concealed": ("realtime_gw_call_concealed_ratio", 'direction="output"'),
    "late_frames": ("realtime_gw_call_late_frames_ratio", ""),
}


def gateway_figures(server: LiveServer) -> dict[str, float]:
    f = {
        "frames": server.metric("realtime_gw_call_frame_lateness_seconds_count"),
        "on_time": server.metric("realtime_gw_call_frame_lateness_seconds_bucket", 'le="0.02"'),
        "reply_frames": server.metric("realtime_gw_call_reply_frames_total"),
        "underruns": server.metric("realtime_gw_call_reply_underrun_frames_total"),
        "packets_in": server.metric("realtime_gw_call_input_packets_total"),
        "packets_lost": server.metric("realtime_gw_call_input_packets_lost_total"),
    }
    for name, (metric, labels) in END_OF_CALL.items():
        f[name + "_sum"] = server.metric(metric + "_sum", labels)
        f[name + "_count"] = server.metric(metric + "_count", labels)
    return f


def ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def stall(server: LiveServer, stop: threading.Event) -> threading.Thread:
    """Noisy commits to the gateway's in-process pocketsphinx, one after another until ``stop``."""
    from loadtest.bench.isolation import Phase, noisy_commits

    async def attack() -> None:
        while not stop.is_set():
            await noisy_commits(server, 1, Phase())

    thread = threading.Thread(target=asyncio.run, args=(attack(),), daemon=True)
    thread.start()
    return thread


def measure(server: LiveServer, kind: str, count: int, args: argparse.Namespace) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    out, begin = ctx.Queue(), ctx.Event()
    procs_n = max(1, math.ceil(count / args.calls_per_proc))
    before = gateway_figures(server)
    procs = [
        ctx.Process(
            target=run_clients,
            args=(kind, server.port, list(range(i, count, procs_n)), args.seconds, args.turn_s, out, begin),
        )
        for i in range(procs_n)
    ]
    for p in procs:
        p.start()
    caller_pids: list[int] = []
    while len(caller_pids) < procs_n:  # every caller process connected its clients (or failed to)
        what, pid = out.get(timeout=120 + count * START_EVERY_S)
        assert what == "connected", what
        caller_pids.append(pid)
    stop = threading.Event()
    attacker = stall(server, stop) if args.stall else None
    gateway = process_tree(server.proc.pid)
    cpu0, main0, callers0, box0, t0 = (
        cpu_seconds(gateway), cpu_seconds(gateway[:1]), cpu_seconds(caller_pids), box_ticks(), time.monotonic()
    )  # fmt: skip
    begin.set()
    results: list[dict[str, Any]] = []
    for _ in procs:
        what, part = out.get(timeout=args.seconds + 180)
        results += part
    t1 = time.monotonic()
    gateway = process_tree(server.proc.pid)  # a worker started meanwhile counts from here on
    cpu1, main1, callers1, box1 = cpu_seconds(gateway), cpu_seconds(gateway[:1]), cpu_seconds(caller_pids), box_ticks()
    for p in procs:
        p.join(timeout=60)
    if attacker is not None:
        stop.set()
        attacker.join(timeout=60)
    for _ in range(300):  # the calls ended: their end-of-call figures are in
        if server.metric("realtime_gw_calls") == 0:
            break
        time.sleep(0.1)
    after = gateway_figures(server)
    d = {k: after[k] - before[k] for k in after}
    ok = [r for r in results if not r.get("failed")]
    expected = sum(r["expected"] for r in ok)
    concealed = sum(r["concealed"] for r in ok)
    window = t1 - t0
    cores = (cpu1 - cpu0) / window
    row: dict[str, Any] = {
        "kind": kind,
        "n": count,
        "caller_procs": procs_n,
        "failed": len(results) - len(ok),
        "errors": sorted({r["error"] for r in results if "error" in r})[:3],
        "seconds": window,
        "cores": cores,
        "main_cores": (main1 - main0) / window,
        "per_core": count / cores if cores else None,
        "missing": concealed / expected if expected else 0.0,
        "callers_cores": (callers1 - callers0) / window,
        "box_busy": (box1[0] - box0[0]) / (box1[1] - box0[1]) if box1[1] > box0[1] else None,
    }
    if kind == "webrtc":
        row |= {
            "late": ratio(d["frames"] - d["on_time"], d["frames"]),
            "reply_underruns": ratio(d["underruns"], d["reply_frames"]),
            "input_packet_loss": ratio(d["packets_lost"], d["packets_in"]),
            **{f"{k}_per_call": ratio(d[k + "_sum"], d[k + "_count"]) for k in END_OF_CALL},
        }
    return row


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.2%}"


def show(r: dict[str, Any]) -> str:
    per_core = "-" if r["per_core"] is None else f"{r['per_core']:.1f}"
    line = (
        f"{r['label']:14} n={r['n']:4} procs={r['caller_procs']:2}  gateway {r['cores']:.2f} cores "
        f"(main {r['main_cores']:.2f})  {per_core}/core  failed {r['failed']}  concealed {pct(r['missing'])}  "
        f"box busy {pct(r['box_busy'])}  callers {r['callers_cores']:.2f} cores"
    )
    if r["kind"] == "webrtc":
        line += (
            f"  late {pct(r['late'])}  underruns {pct(r['reply_underruns'])}  "
            f"input concealed/call {pct(r['input_concealed_per_call'])}"
        )
    return line + (f"  errors {r['errors']}" if r["errors"] else "")


def table(rows: list[dict[str, Any]]) -> list[str]:
    baseline = {r["n"]: r for r in rows if r["kind"] == "websocket"}
    out = [
        "| media workers | calls | caller procs | failed | gateway cores (main process) | calls per core | WebSocket cores, same n | reply frames concealed at the callers (60 ms buffer) | track frames > 20 ms late | reply frames underrun | caller audio concealed per call (mean) | box busy | callers' cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        if r["kind"] != "webrtc":
            continue
        ws = baseline.get(r["n"])
        ws_cores = "-" if ws is None else f"{ws['cores']:.2f}"
        per_core = "-" if r["per_core"] is None else f"{r['per_core']:.1f}"
        out.append(
            f"| {r['media_workers'] or 'loop'} | {r['n']} | {r['caller_procs']} | {r['failed']} | {r['cores']:.2f} "
            f"({r['main_cores']:.2f}) | {per_core} | {ws_cores} | "
            f"{pct(r['missing'])} | {pct(r['late'])} | {pct(r['reply_underruns'])} | "
            f"{pct(r['input_concealed_per_call'])} | {pct(r['box_busy'])} | {r['callers_cores']:.2f} |"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[5, 10, 20])
    parser.add_argument("--media-workers", type=int, nargs="+", default=[0, 2], help="0: media on the gateway's loop")
    parser.add_argument("--calls-per-proc", type=int, default=20, help="callers in each caller process")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--turn-s", type=float, default=5.0)
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="the same N as WebSocket sessions, on the first gateway")  # fmt: skip
    parser.add_argument("--stop-above", type=float, default=0.05,
                        help="a media-worker count stops at the first N with more calls failed or reply frames concealed")  # fmt: skip
    parser.add_argument("--stall", action="store_true", help="stall the gateways' process while measuring")
    parser.add_argument("--json", type=Path, help="rows written here after every cell")
    parser.add_argument("--gateway-arg", action="append", default=[],
                        help="one more gateway flag, repeatable (e.g. --gateway-arg=--no-warmup)")
    parser.add_argument("--budget-s", type=float, default=float("inf"), help="no cell starts that could end after it")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    flags: tuple[str, ...] = (
        "--policy", "none", "--tts", "tone", "--max-connections-per-client", "0",
        "--max-sessions", str(max(1024, 2 * max(args.calls))),
    )  # fmt: skip
    if args.stall:
        flags += ("--cpu-backends-in-process",)
    flags += tuple(args.gateway_arg)
    meta = {"argv": vars(args) | {"json": str(args.json), "budget_s": args.budget_s}, "cores": os.cpu_count(),
            "machine": platform.processor() or platform.machine(), "python": platform.python_version(),
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "skipped": []}  # fmt: skip
    rows: list[dict[str, Any]] = []

    def save() -> None:
        if args.json is not None:
            args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))

    def cell_fits(n: int, kinds: int) -> bool:
        needed = kinds * (args.seconds + 1.5 * n * START_EVERY_S + 20)  # connect, measure, hang up
        if time.monotonic() + needed <= deadline:
            return True
        meta["skipped"].append(f"{n} calls: the budget")
        return False

    for i, workers in enumerate(args.media_workers):
        if not cell_fits(min(args.calls), 1) or time.monotonic() + 60 > deadline:
            meta["skipped"].append(f"media workers {workers}: the budget")
            continue
        server = start_server(*flags, "--webrtc-media-workers", str(workers), name=f"webrtc-bench-m{workers}")
        try:
            for n in args.calls:
                kinds = ["websocket", "webrtc"] if args.baseline and i == 0 else ["webrtc"]
                if not cell_fits(n, len(kinds)):
                    break
                try:
                    for kind in kinds:
                        label = "websocket" if kind == "websocket" else f"webrtc/m{workers}"
                        rows.append({**measure(server, kind, n, args), "label": label, "media_workers": workers})
                        print(show(rows[-1]), flush=True)
                        save()
                except Exception as e:  # a cell that could not be measured (callers hung): said, and the next count
                    meta["skipped"].append(f"media workers {workers}, {n} calls: {type(e).__name__}: {e}")
                    save()
                    break
                last = rows[-1]
                if last["failed"] > args.stop_above * n or last["missing"] > args.stop_above:
                    meta["skipped"].append(f"media workers {workers}: past {n} calls (saturated)")
                    break
        finally:
            stop_server(server)
    meta["ended"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    save()
    lines = table(rows)
    print("\n".join(lines))
    if meta["skipped"]:
        print("skipped:", "; ".join(meta["skipped"]))
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    append_run(
        f"\n## {dt.date.today()} WebRTC calls per core, by calls and media workers "
        f"(`python -m loadtest.bench.webrtc_calls --calls {' '.join(map(str, args.calls))} --media-workers "
        f"{' '.join(map(str, args.media_workers))} --calls-per-proc {args.calls_per_proc} --seconds {args.seconds:g}"
        f"{'' if args.baseline else ' --no-baseline'}{' --stall' if args.stall else ''}`)\n\n"
        f"{meta['machine']}, {os.cpu_count()} cores (load average {load} at the end), tone TTS, a turn every "
        f"{args.turn_s:g} s, callers in {args.calls_per_proc}-call processes on the same box"
        f"{'; the gateways stalled by noisy pocketsphinx decodes in their process' if args.stall else ''}"
        f"{'; skipped: ' + '; '.join(meta['skipped']) if meta['skipped'] else ''}.\n\n" + "\n".join(lines) + "\n"
    )


if __name__ == "__main__":
    main()
