"""Soak test: start a local gateway, run locust headless against it for a set time, judge the outcome.

    python -m loadtest.load.soak --duration 60 --users 20 --robots 4
    python -m loadtest.load.soak --duration 600 --users 200 --robots 20 --think 180,300 --start-jitter  # `make soak`

Fails (exit 1) on any of:
- memory growth: the server's RSS in the last quarter of the run (median) is more than
  ``--max-rss-growth-mb`` above its level in the second quarter (after ramp-up, caches and worker
  slots warm);
- leaked sessions: ``realtime_gw_sessions`` (every kind) is not back to 0 within 15 s of the end;
- any lost or duplicated frame ``seq`` in any reply;
- nothing done (no reply, or no robot step while robots were asked for and the socket exists), or more
  than ``--max-failure-ratio`` of turns without a reply.

Robot users run only when the server's robot socket answers (not with ``--policy none``). Every load
goes to 127.0.0.1 only. A JSON summary goes to ``--report``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from realtime_gw.testing.gateway import start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]

DEFAULT_TEXT = "Please open the door for me."


def metric(base: str, name: str) -> dict[str, float]:
    """Samples of one Prometheus metric, keyed by their label string."""
    out: dict[str, float] = {}
    for line in httpx.get(base + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            if key.split("{")[0] == name:
                out[key[len(name) :]] = float(value)
    return out


def synthesize_wav(path: Path, text: str) -> None:
    """The utterance the voice users speak, made with the embedded Piper voice (no server needed)."""
    from realtime_gw.client.audio import write_wav
    from realtime_gw.models.speech.tts_piper import PiperTtsBackend

    write_wav(path, PiperTtsBackend().synthesize(text), 24000)


def robot_socket_answers(base: str, api_key: str | None) -> bool:
    from realtime_gw.client.openpi import OpenPIClient

    try:
        with OpenPIClient(base, api_key, open_timeout=5):
            return True
    except Exception:
        return False


class RssSampler(threading.Thread):
    def __init__(self, pid: int, period_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.period_s = period_s
        self.samples: list[tuple[float, float]] = []  # (seconds since start, RSS MiB)
        self.stop_flag = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self.stop_flag.is_set():
            try:
                self.samples.append((time.monotonic() - t0, self.proc.memory_info().rss / 2**20))
            except psutil.Error:
                return
            self.stop_flag.wait(self.period_s)


def rss_growth(samples: list[tuple[float, float]], duration: float) -> tuple[float, float, float]:
    """(baseline MiB, final MiB, growth MiB): median over the 2nd quarter vs the last quarter."""
    q2 = [r for t, r in samples if duration * 0.25 <= t < duration * 0.5] or [r for _, r in samples]
    q4 = [r for t, r in samples if duration * 0.75 <= t <= duration] or [samples[-1][1]]
    base, final = statistics.median(q2), statistics.median(q4)
    return base, final, final - base


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(p / 100 * len(xs)))], 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=60, help="seconds of load")
    ap.add_argument("--users", type=int, default=20, help="realtime (voice) users")
    ap.add_argument("--robots", type=int, default=4, help="robot users (only if the robot socket answers)")
    ap.add_argument("--spawn-rate", type=float, default=10)
    ap.add_argument("--think", default="1,3", help="pause between turns, 'min,max' seconds")
    ap.add_argument("--turns", type=int, default=3, help="max turns per connection (then reconnect)")
    ap.add_argument("--start-jitter", action="store_true", help="stagger each user's first turn over --think")
    ap.add_argument("--robot-hz", type=float, default=10)
    ap.add_argument(
        "--server-args",
        # the load comes from one address: the per-address connection cap would stop it at 64
        default="--policy noop --max-connections-per-client 0",
        help="extra `realtime-gw serve` flags",
    )
    ap.add_argument("--api-key", default="soak-key")
    ap.add_argument("--wav", default=None, help="utterance to speak (default: Piper says --text)")
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--max-rss-growth-mb", type=float, default=64)
    ap.add_argument("--max-failure-ratio", type=float, default=0.2)
    ap.add_argument("--out-dir", default=str(ROOT / "test-artifacts" / "soak"))
    ap.add_argument("--report", default=None, help="JSON summary (default: <out-dir>/soak-report.json)")
    args = ap.parse_args(argv)

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report_path = Path(args.report) if args.report else out / "soak-report.json"
    wav = Path(args.wav) if args.wav else out / "utterance.wav"
    if not args.wav:
        synthesize_wav(wav, args.text)

    flags = ["--log-level", "warning", *shlex.split(args.server_args)]
    flags += ["--api-key", args.api_key] if args.api_key else []
    server = start_server(*flags, log_path=out / "server.log", timeout=180)
    ready_s = server.ready_s
    base = server.http
    print(f"soak: server ready on {base} in {ready_s:.1f} s (pid {server.proc.pid})", flush=True)
    try:
        robots = args.robots if args.robots and robot_socket_answers(base, args.api_key) else 0
        if args.robots and not robots:
            print("soak: the robot socket does not answer (policy none?): voice users only", flush=True)
        result = run_load(args, base, wav, robots, server.proc.pid, out)
        result.update(judge(args, base, result, robots))
    finally:
        stop_server(server, timeout=15)
    report_path.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k not in ("rss_samples", "load")}, indent=2))
    print(f"soak: {'PASS' if result['passed'] else 'FAIL'} (report {report_path})", flush=True)
    return 0 if result["passed"] else 1


def run_load(
    args: argparse.Namespace, base: str, wav: Path, robots: int, pid: int, out: Path
) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False, dir=out) as f:
        load_report = Path(f.name)
    env = {
        **os.environ,
        "REALTIME_GW_API_KEY": args.api_key or "",
        "LOAD_WAV": str(wav),
        "LOAD_REPORT": str(load_report),
        "LOAD_TURNS": str(args.turns),
        "LOAD_THINK_S": args.think,
        "LOAD_START_JITTER": "1" if args.start_jitter else "0",
        "LOAD_ROBOT_HZ": str(args.robot_hz),
        "LOAD_ROBOT_USERS": str(robots),
        "PYTHONPATH": str(ROOT),
    }
    classes = ["RealtimeUser"] + (["RobotUser"] if robots else [])
    cmd = [
        sys.executable, "-m", "locust", "-f", str(ROOT / "loadtest" / "load" / "locustfile.py"), "--headless",
        "-u", str(args.users + robots), "-r", str(args.spawn_rate), "-t", f"{int(args.duration)}s",
        "--host", base, "--stop-timeout", "20", "--only-summary", "--csv", str(out / "locust"),
        "--loglevel", "WARNING", *classes,
    ]  # fmt: skip
    sampler = RssSampler(pid)
    sampler.start()
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd, env=env, cwd=ROOT, stdout=(out / "locust.log").open("wb"), stderr=subprocess.STDOUT
    )
    elapsed = time.monotonic() - t0
    sampler.stop_flag.set()
    sampler.join()
    load = json.loads(load_report.read_text()) if load_report.exists() and load_report.stat().st_size else {}
    load_report.unlink(missing_ok=True)
    return {
        "locust_exit": proc.returncode,
        "elapsed_s": round(elapsed, 1),
        "rss_samples": sampler.samples,
        "load": load,
    }


def judge(args: argparse.Namespace, base: str, result: dict[str, Any], robots: int) -> dict[str, Any]:
    load: dict[str, Any] = result["load"]
    failures: list[str] = []
    # Sessions must drain once the users are gone.
    deadline = time.monotonic() + 15
    while True:
        sessions = metric(base, "realtime_gw_sessions")
        if sum(sessions.values()) == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    if sum(sessions.values()) != 0:
        failures.append(f"leaked sessions after the run: {sessions}")
    samples = result["rss_samples"]
    base_mb, final_mb, growth = rss_growth(samples, float(args.duration)) if samples else (0.0, 0.0, 0.0)
    if growth > args.max_rss_growth_mb:
        failures.append(
            f"server RSS grew {growth:.0f} MiB ({base_mb:.0f} -> {final_mb:.0f}), limit {args.max_rss_growth_mb:g}"
        )
    if not load:
        failures.append(f"locust wrote no report (exit {result['locust_exit']}); see locust.log")
    lost, dup = load.get("frames_lost", 0), load.get("frames_duplicated", 0)
    if lost or dup:
        failures.append(f"{lost} lost and {dup} duplicated frames: {load.get('bad_replies', [])[:5]}")
    if load and not load.get("responses"):
        failures.append("no reply was received")
    turns = load.get("turns", 0)
    ratio = load.get("turn_failures", 0) / turns if turns else 0.0
    if ratio > args.max_failure_ratio:
        failures.append(
            f"{ratio:.0%} of turns got no reply (limit {args.max_failure_ratio:.0%}): {load.get('errors')}"
        )
    if robots and not load.get("robot_steps"):
        failures.append("robot users made no step")
    return {
        "passed": not failures,
        "failures": failures,
        "users": args.users,
        "robots": robots,
        "duration_s": args.duration,
        "rss_mib": {
            "baseline": round(base_mb, 1),
            "final": round(final_mb, 1),
            "growth": round(growth, 1),
            "max": round(max((r for _, r in samples), default=0.0), 1),
        },
        "sessions_after": sessions,
        "sessions_opened": load.get("sessions"),
        "turns": turns,
        "turn_failures": load.get("turn_failures"),
        "responses": load.get("responses"),
        "responses_cancelled": load.get("responses_cancelled"),
        "frames": load.get("frames"),
        "frames_lost": lost,
        "frames_duplicated": dup,
        "errors": load.get("errors"),
        "ttfa_ms": {"p50": pct(load.get("ttfa_ms", []), 50), "p95": pct(load.get("ttfa_ms", []), 95)},
        "turn_latency_ms": {
            "p50": pct(load.get("turn_latency_ms", []), 50),
            "p95": pct(load.get("turn_latency_ms", []), 95),
        },
        "frame_lateness_max_ms": {
            "p50": pct(load.get("lateness_ms", []), 50),
            "p95": pct(load.get("lateness_ms", []), 95),
            "max": pct(load.get("lateness_ms", []), 100),
        },
        "robot_steps": load.get("robot_steps"),
        "robot_sessions": load.get("robot_sessions"),
        "robot_errors": load.get("robot_errors"),
        "action_latency_ms": {
            "p50": pct(load.get("action_ms", []), 50),
            "p95": pct(load.get("action_ms", []), 95),
        },
    }


if __name__ == "__main__":
    sys.exit(main())
