"""The VAD's window clock, A/B on one box: gateways that differ only in ``--vad-step-ms`` (0: the VAD steps
whenever any stream has new audio; 32: once per 32 ms window, every stream's completed windows in one
call), alternated ``--repeats`` times, each carrying N aiortc WebRTC calls (20 ms Opus frames, one media
worker) and N WebSocket sessions (80 ms appends), one kind after the other (``webrtc_calls.measure``).

Per cell: the gateway's main-process cores (where the VAD and the sessions run), and from its /metrics the
VAD's steps a second, streams per step, network calls (rounds) a second and windows per call. The figure is
the main process's CPU per call-second of each setting as a ratio against the first ``--step-ms`` (the
baseline), averaged over the alternated gateways (the box is shared and noisy).

    .venv/bin/python -m loadtest.bench.vad_clock --calls 10 20 --step-ms 0 32 --repeats 2 --seconds 12
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from loadtest.bench.gateway_metrics import by_label, scrape
from loadtest.bench.log import append_run
from loadtest.bench.webrtc_calls import measure
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server

VAD = "vad-silero"
KINDS = ("webrtc", "websocket")


def vad_figures(server: LiveServer) -> dict[str, float]:
    """The VAD worker's counters, from one scrape of ``/metrics``."""
    sample = scrape(server.port)

    def vad(name: str) -> float:
        return by_label(sample, name, "worker").get(VAD, 0.0)

    return {
        "steps": vad("realtime_gw_worker_batch_size_count"),
        "stepped": vad("realtime_gw_worker_batch_size_sum"),
        "step_s": vad("realtime_gw_worker_step_seconds_sum"),
        "rounds": vad("realtime_gw_vad_rounds_total"),
        "windows": vad("realtime_gw_vad_windows_total"),
    }


def cell(server: LiveServer, kind: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    before = vad_figures(server)
    row = measure(server, kind, n, args)
    after = vad_figures(server)
    d = {k: after[k] - before[k] for k in after}
    s = row["seconds"]
    return row | {
        "main_per_call": row["main_cores"] / n,
        "vad_steps_per_s": d["steps"] / s,
        "vad_streams_per_step": d["stepped"] / d["steps"] if d["steps"] else None,
        "vad_calls_per_s": d["rounds"] / s,
        "vad_windows_per_call": d["windows"] / d["rounds"] if d["rounds"] else None,
        "vad_step_ms_mean": 1000 * d["step_s"] / d["steps"] if d["steps"] else None,
    }


def show(r: dict[str, Any]) -> str:
    def f(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    return (
        f"step {r['step_ms']:g} ms  {r['kind']:9} n={r['n']:3}  main {r['main_cores']:.3f} cores "
        f"({1000 * r['main_per_call']:.1f} mcores/call), tree {r['cores']:.2f}  VAD: "
        f"{r['vad_steps_per_s']:.0f} steps/s of {f(r['vad_streams_per_step'], '.1f')} streams, "
        f"{r['vad_calls_per_s']:.0f} calls/s of {f(r['vad_windows_per_call'], '.1f')} windows, "
        f"step {f(r['vad_step_ms_mean'], '.2f')} ms  failed {r['failed']}  concealed {r['missing']:.2%}  "
        f"box busy {f(r['box_busy'], '.0%')}"
    )


def summary(rows: list[dict[str, Any]], steps: list[float], calls: list[int]) -> list[str]:
    base = steps[0]
    out = [
        "| kind | n | --vad-step-ms | main-process cores (mean of runs) | main CPU per call-second vs "
        f"{base:g} ms | VAD steps/s | streams per step | VAD calls/s | windows per call |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        for n in calls:
            cells = {s: [r for r in rows if r["kind"] == kind and r["n"] == n and r["step_ms"] == s] for s in steps}
            if not cells[base]:
                continue
            base_main = statistics.mean(r["main_cores"] for r in cells[base])
            for s in steps:
                rs = cells[s]
                if not rs:
                    continue
                main = statistics.mean(r["main_cores"] for r in rs)
                runs = ", ".join(f"{r['main_cores']:.3f}" for r in rs)

                def avg(key: str, rs: list[dict[str, Any]] = rs) -> str:
                    xs = [r[key] for r in rs if r[key] is not None]
                    return f"{statistics.mean(xs):.1f}" if xs else "-"

                out.append(
                    f"| {kind} | {n} | {s:g} | {main:.3f} ({runs}) | "
                    f"**{main / base_main:.2f}x** | {avg('vad_steps_per_s')} | {avg('vad_streams_per_step')} | "
                    f"{avg('vad_calls_per_s')} | {avg('vad_windows_per_call')} |"
                )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[10, 20])
    parser.add_argument("--step-ms", type=float, nargs="+", default=[0.0, 32.0], help="the first is the baseline")
    parser.add_argument("--repeats", type=int, default=2, help="gateways per setting, alternated")
    parser.add_argument("--calls-per-proc", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--turn-s", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--budget-s", type=float, default=float("inf"), help="no gateway starts that could end after it")
    args = parser.parse_args()
    args.stall = False  # webrtc_calls.measure reads it
    deadline = time.monotonic() + args.budget_s
    per_gateway = len(KINDS) * sum(args.seconds + 20 + 1.5 * n * 0.05 for n in args.calls) + 15
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for rep in range(args.repeats):
        for step in args.step_ms if rep % 2 == 0 else list(reversed(args.step_ms)):
            if time.monotonic() + per_gateway > deadline:
                skipped.append(f"run {rep + 1} of {step:g} ms: the budget")
                continue
            server = start_server(
                "--policy", "none", "--tts", "tone", "--max-connections-per-client", "0",
                "--webrtc-media-workers", "1", "--vad-step-ms", f"{step:g}", name=f"vad-clock-{step:g}",
            )  # fmt: skip
            try:
                for n in args.calls:
                    for kind in KINDS:
                        rows.append(cell(server, kind, n, args) | {"step_ms": step, "run": rep})
                        print(show(rows[-1]), flush=True)
                        if args.json is not None:
                            args.json.write_text(json.dumps({"argv": vars(args) | {"json": str(args.json)},
                                                             "rows": rows}, indent=1, default=str))  # fmt: skip
            finally:
                stop_server(server)
    lines = summary(rows, args.step_ms, args.calls)
    print("\n".join(lines))
    if skipped:
        print("skipped:", "; ".join(skipped))
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    append_run(
        f"\n## {dt.date.today()} VAD window clock, A/B (`python -m loadtest.bench.vad_clock --calls "
        f"{' '.join(map(str, args.calls))} --step-ms {' '.join(f'{s:g}' for s in args.step_ms)} --repeats "
        f"{args.repeats} --seconds {args.seconds:g}`)\n\n"
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (load average {load} at the end), "
        f"gateways alternated, 1 media worker, tone TTS, a turn every {args.turn_s:g} s, callers in "
        f"{args.calls_per_proc}-call processes on the same box{'; skipped: ' + '; '.join(skipped) if skipped else ''}."
        "\n\n" + "\n".join(lines) + "\n"
    )


if __name__ == "__main__":
    main()
