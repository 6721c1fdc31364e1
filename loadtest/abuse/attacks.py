"""Attacks against a live gateway, each measured by a bystander: the table in docs/reliability.md.

For every attack: a fresh gateway (tone TTS, no-op policy) on a free loopback port; the bystander alone
(baseline: realtime text->audio turns, /healthz every 50 ms, a robot); then the same bystander while
the attack runs in a child process from 127.0.0.2 (and a short tail after it); then whether /readyz is
200 again, the server's RSS peak (children included), and the attack's own outcome.

    .venv/bin/python -m loadtest.abuse.attacks                                   # CI sizes, every attack
    .venv/bin/python -m loadtest.abuse.attacks --full --repeats 2 --attacks noisy_commit,bursts
    git worktree add /tmp/attack-before 78c2a48                            # the code before the fixes
    .venv/bin/python -m loadtest.abuse.attacks --full --repeats 2 --code-root /tmp/attack-before --label before --write-docs

Results go to test-artifacts/attacks-LABEL.json; ``--write-docs`` replaces the LABEL block of the
section "Attacks and what a bystander sees" in docs/reliability.md and, when the JSON of both
``before`` and ``after`` exist, the before -> after table. Numbers are medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from loadtest.abuse.attack_kinds import ATTACKS, Sizes
from realtime_gw.testing.bystander import Bystander, measure
from realtime_gw.testing.gateway import ARTIFACTS, LiveServer, start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]

SERVER_ARGS = ("--policy", "noop", "--tts", "tone")
DOC = ROOT / "docs" / "reliability.md"
SECTION = "## Attacks and what a bystander sees"


async def run_attack_process(name: str, port: int, sizes: Sizes, timeout: float) -> dict[str, Any]:
    """The attack in its own process: its CPU work must not delay the bystander's event loop."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.abuse.attacks", "--one", name, "--port", str(port), "--sizes", sizes.to_json(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return {"outcome": f"attack still running after {timeout:.0f} s (stopped)"}
    lines = out.decode().strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"outcome": f"attack client failed: {err.decode()[-400:]}"}
    return json.loads(lines[-1])


class RssSampler:
    """Peak RSS of the server process and its children (model worker processes), every 100 ms."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> int:
        total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):  # a child that just exited
                total += p.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.peak = max(self.peak, self.now())
            except psutil.Error:
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def seconds_until_ready(server: LiveServer, timeout: float) -> float | None:
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() - t0 < timeout:
            if server.proc.poll() is not None:
                return None
            try:
                if (await client.get(server.http + "/readyz")).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    return None


async def attack_row(
    server: LiveServer,
    name: str,
    sizes: Sizes,
    *,
    baseline_s: float = 6.0,
    tail_s: float = 2.0,
    robot: bool = True,
    attack_timeout_s: float = 240.0,
    turn_timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Baseline, then the bystander through the attack (and ``tail_s`` after), then recovery."""
    base = await measure(server.port, baseline_s, robot=robot, turn_timeout_s=turn_timeout_s)
    with RssSampler(server.proc.pid) as rss:
        rss_before = rss.peak
        async with Bystander(server.port, robot=robot, turn_timeout_s=turn_timeout_s) as bystander:
            t0 = time.monotonic()
            outcome = await run_attack_process(name, server.port, sizes, attack_timeout_s)
            attack_s = time.monotonic() - t0
            await asyncio.sleep(tail_s)
    ready_s = await seconds_until_ready(server, 10.0)
    if "canary" in outcome:
        outcome["outcome"] += "; key in server log: " + (
            "yes" if outcome["canary"] in server.logs() else "no"
        )
    return {
        "attack": name,
        "size": ATTACKS[name][1](sizes),
        "baseline": base.summary(),
        "under_attack": bystander.report.summary(),
        "attack_s": attack_s,
        "outcome": outcome["outcome"],
        "details": outcome,
        "server_alive": server.proc.poll() is None,
        "ready_after_s": ready_s,
        "rss_before_mb": rss_before / 1e6,
        "rss_peak_mb": rss.peak / 1e6,
    }


# -- aggregation and tables -----------------------------------------------------------------------------


def median(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the repeats of one attack (outcomes listed as seen, once each)."""
    first = rows[0]

    def med(part: str, key: str) -> float:
        return median([r[part][key] for r in rows])

    return {
        "attack": first["attack"],
        "size": first["size"],
        "repeats": len(rows),
        "baseline_ttfa_p95_ms": med("baseline", "ttfa_p95_ms"),
        "baseline_healthz_max_ms": med("baseline", "healthz_max_ms"),
        "baseline_robot_p95_ms": med("baseline", "robot_p95_ms"),
        "ttfa_p50_ms": med("under_attack", "ttfa_p50_ms"),
        "ttfa_p95_ms": med("under_attack", "ttfa_p95_ms"),
        "late_max_ms": med("under_attack", "late_max_ms"),
        "healthz_max_ms": med("under_attack", "healthz_max_ms"),
        "robot_p95_ms": med("under_attack", "robot_p95_ms"),
        "bystander_errors": median([r["under_attack"]["errors"] for r in rows]),
        "recovered": sum(1 for r in rows if r["ready_after_s"] is not None),
        "rss_growth_mb": median([r["rss_peak_mb"] - r["rss_before_mb"] for r in rows]),
        "outcomes": list(dict.fromkeys(r["outcome"] for r in rows)),
    }


def ms(x: float) -> str:
    if x is None or math.isnan(x):
        return "–"
    return f"{x / 1000:.1f} s" if x >= 10_000 else f"{x:.0f}"


def results_table(summary: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| attack | size | bystander TTFA p50 / p95 ms (baseline p95) | worst frame lateness ms | /healthz max ms "
        "(baseline) | robot infer p95 ms (baseline) | bystander errors | /readyz 200 after | RSS growth MB | the attack's outcome |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in summary:
        lines.append(
            f"| {a['attack']} | {a['size']} | {ms(a['ttfa_p50_ms'])} / {ms(a['ttfa_p95_ms'])} ({ms(a['baseline_ttfa_p95_ms'])}) "
            f"| {ms(a['late_max_ms'])} | {ms(a['healthz_max_ms'])} ({ms(a['baseline_healthz_max_ms'])}) "
            f"| {ms(a['robot_p95_ms'])} ({ms(a['baseline_robot_p95_ms'])}) | {a['bystander_errors']:g} "
            f"| {a['recovered']}/{a['repeats']} | {a['rss_growth_mb']:.0f} | {' / '.join(a['outcomes'])} |"
        )
    return lines


def compare_table(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    by_name = {a["attack"]: a for a in after["summary"]}
    lines = [
        "| attack | size | bystander TTFA p95 ms before → after | worst frame lateness ms before → after "
        "| /healthz max ms before → after | recovered (/readyz 200) before → after |",
        "|---|---|---|---|---|---|",
    ]
    for b in before["summary"]:
        a = by_name.get(b["attack"])
        if a is None:
            continue
        lines.append(
            f"| {b['attack']} | {b['size']} | {ms(b['ttfa_p95_ms'])} → {ms(a['ttfa_p95_ms'])} "
            f"| {ms(b['late_max_ms'])} → {ms(a['late_max_ms'])} | {ms(b['healthz_max_ms'])} → {ms(a['healthz_max_ms'])} "
            f"| {b['recovered']}/{b['repeats']} → {a['recovered']}/{a['repeats']} |"
        )
    return lines


def hardware() -> str:
    model = platform.processor() or "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = psutil.virtual_memory().total / 2**30
    return f"{model}, {os.cpu_count()} cores, {mem:.0f} GiB, Python {platform.python_version()}"


def commit_of(code_root: Path) -> str:
    rev = subprocess.run(
        ["git", "-C", str(code_root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(code_root), "status", "--porcelain", "--", "realtime_gw"],
        capture_output=True,
        text=True,
    )
    return rev.stdout.strip() + (" + uncommitted changes to realtime_gw/" if dirty.stdout.strip() else "")


def replace_block(doc: str, tag: str, body: str) -> str:
    start, end = f"<!-- attacks:{tag} -->", f"<!-- /attacks:{tag} -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in doc:
        head, rest = doc.split(start, 1)
        return head + block + rest.split(end, 1)[1]
    if SECTION not in doc:
        doc = doc.rstrip() + f"\n\n{SECTION}\n"
    head, rest = doc.split(SECTION, 1)
    nxt = rest.find("\n## ")
    if nxt < 0:
        return head + SECTION + rest.rstrip() + "\n\n" + block + "\n"
    return head + SECTION + rest[:nxt].rstrip() + "\n\n" + block + "\n" + rest[nxt:]


def write_docs(run: dict[str, Any]) -> None:
    doc = DOC.read_text()
    body = (
        f"**{run['label']}**: code at `{run['commit']}`, {run['date']}, {run['hardware']}; load average at "
        f"start {run['load']}. Command: `{run['command']}`. Medians of {run['repeats']} run(s) per attack."
        + (f" {run['note']}." if run.get("note") else "")
        + "\n\n"
        + "\n".join(results_table(run["summary"]))
    )
    doc = replace_block(doc, run["label"], body)
    paths = {label: ARTIFACTS / f"attacks-{label}.json" for label in ("before", "after")}
    if all(p.exists() for p in paths.values()):
        before, after = (json.loads(p.read_text()) for p in paths.values())
        note = (
            f"Before: `{before['commit']}` ({before['date']}); after: `{after['commit']}` ({after['date']}); "
            "same harness, same sizes, same machine.\n\n"
        )
        doc = replace_block(doc, "compare", note + "\n".join(compare_table(before, after)))
    DOC.write_text(doc)


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    sizes = Sizes.full() if args.full else Sizes()
    names = args.attacks.split(",") if args.attacks else list(ATTACKS)
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    summary = []
    for name in names:
        rows = []
        for _ in range(args.repeats):
            server = start_server(
                *SERVER_ARGS, name=f"attack-{name}", code_root=Path(args.code_root).resolve()
            )
            try:
                row = await attack_row(
                    server, name, sizes, baseline_s=args.baseline_s, robot=not args.no_robot
                )
            finally:
                stop_server(server)
            print(json.dumps(row), flush=True)
            rows.append(row)
        summary.append(aggregate(rows))
        print("\n".join(results_table(summary[-1:])[2:]), flush=True)
    return {
        "label": args.label,
        "commit": commit_of(Path(args.code_root)),
        "date": started,
        "hardware": hardware(),
        "load": load,
        "command": "python -m loadtest.abuse.attacks "
        + " ".join(a for a in sys.argv[1:] if a != "--write-docs"),
        "repeats": args.repeats,
        "sizes": json.loads(sizes.to_json()),
        "summary": summary,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attacks", default="", help=f"comma-separated, of: {', '.join(ATTACKS)} (default: all)")
    ap.add_argument("--full", action="store_true", help="the issue's sizes (default: CI sizes)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--baseline-s", type=float, default=6.0)
    ap.add_argument("--no-robot", action="store_true")
    ap.add_argument("--code-root", default=str(ROOT), help="checkout whose realtime_gw the gateway runs")
    ap.add_argument("--label", default="run", help="'before' / 'after' name the docs blocks")
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument(
        "--docs-only", action="store_true", help="rewrite the docs from test-artifacts/attacks-LABEL.json"
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one attack (the child process)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        fn = ATTACKS[args.one][0]
        print(json.dumps(asyncio.run(fn(args.port, Sizes.from_json(args.sizes)))), flush=True)
        return
    if args.docs_only:
        write_docs(json.loads((ARTIFACTS / f"attacks-{args.label}.json").read_text()))
        return
    run = asyncio.run(run_all(args))
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"attacks-{args.label}.json").write_text(json.dumps(run, indent=1))
    print("\n".join(results_table(run["summary"])))
    if args.write_docs:
        write_docs(run)


if __name__ == "__main__":
    main()
