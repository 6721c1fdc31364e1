"""The whole voice pipeline on one GPU, end to end through the real /v1/realtime socket, with the device
clock on and off (``--clock``; one gateway start each, the same load).

Starts a gateway (Kyutai streaming ASR, Qwen3 TTS and Silero VAD on the GPU; ``--vad-device onnx`` keeps
Silero on onnxruntime's CPU provider, as before; Smart Turn stays on onnxruntime's CPU provider; the echo
responder) and drives it with N concurrent sessions, each a microphone streaming 80 ms PCM16 frames paced at
real time: a recorded utterance (loadtest/data/voice_turn_24k.wav, Piper, ~2 s), then silence, with server VAD;
it listens to the spoken echo reply to its end, thinks 1-3 s (random phase) and speaks again. Per turn:
``input_audio_buffer.speech_stopped`` -> first ``response.output_audio.delta`` (turn latency), and end of the
utterance's audio -> first delta (which adds the VAD's silence wait); per reply frame: lateness against
real-time playback from the reply's first frame. From the gateway's ``/metrics`` (before and after each
level; ``gateway_metrics.py``): step times, the 80 ms deadline miss rate per stage, the clock's waits, and
what tells a GPU-bound gateway from one bound by its own Python: the event loop's lag, the process's CPU,
step CPU vs wall time, how busy the stages keep the device, and nvidia-smi's GPU utilization.

    python3 -m loadtest.bench.voice_gpu --sessions 64 256 --run-s 20 --max-batch 320 --budget-s 540
    python3 -m loadtest.bench.voice_gpu --device cuda --sessions 1 64 256 --search 384 512 --run-s 30 --clock on
    .venv/bin/python -m loadtest.bench.voice_gpu --tiny --device cpu --sessions 2 --run-s 6   # CPU smoke run

The load comes from client processes (``--client-procs``) separate from the gateway's one process, so the client's
JSON and base64 work does not share the gateway's event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import time
import wave
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadtest.bench.gateway_metrics import GpuSampler, scrape, summarize
from realtime_gw.testing.gateway import free_port, start_server, stop_server
from realtime_gw.testing.load_client import (
    FRAME_MS,
    RATE,
    PacedMic,
    open_session,
    percentile,
    read_reply,
    run_sessions,
)

ROOT = Path(__file__).resolve().parents[2]

UTTERANCE = ROOT / "loadtest" / "data" / "voice_turn_24k.wav"
FRAME_BYTES = RATE * 2 * FRAME_MS // 1000
REAL_TIME_LATE_P95_MS = 20.0
GOAL_TURN_P50_MS = 300.0
GOAL_MISS_RATE = 0.001
"""The voice pipeline's goal on one GPU: real time, turn p50 <= 300 ms, < 0.1 % of 80 ms deadlines missed."""


@dataclass
class TurnStats:
    turn_ms: list[float] = field(default_factory=list)
    """speech_stopped event -> first reply audio frame."""
    end_of_audio_ms: list[float] = field(default_factory=list)
    """last utterance frame sent -> first reply audio frame (adds the VAD's silence wait)."""
    lateness_ms: list[float] = field(default_factory=list)
    turns: int = 0
    missed: int = 0
    """utterances that got no reply (no speech_stopped, or no audio) before the next one was due."""
    errors: list[str] = field(default_factory=list)
    mic_late_ms: list[float] = field(default_factory=list)
    """how late the client's own mic frames went out (client-side CPU check)."""


def pct(xs: list[float], q: float) -> float | None:
    p = percentile(xs, q)
    return None if p is None else round(p, 2)


def load_utterance(path: Path) -> bytes:
    with wave.open(str(path), "rb") as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (RATE, 1, 2):
            raise SystemExit(f"{path}: want 24 kHz mono PCM16")
        pcm = w.readframes(w.getnframes())
    return pcm + b"\x00" * (-len(pcm) % FRAME_BYTES)


# ---------------------------------------------------------------- client (one process drives many sessions)


async def session_loop(port: int, pcm: bytes, deadline: float, stats: TurnStats, seed: int) -> None:
    rng = random.Random(seed)
    utterance_s = len(pcm) / (RATE * 2)
    session = {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}}
    ws = await open_session(f"ws://127.0.0.1:{port}", session, ping_interval=None)
    try:
        with PacedMic(ws, late_ms=stats.mic_late_ms) as mic:
            await asyncio.sleep(rng.uniform(0.0, 3.0))  # random phase: sessions do not speak in step
            while time.monotonic() + utterance_s + 2.0 < deadline:
                mic.say(pcm)
                turn_deadline = min(time.monotonic() + utterance_s + 20.0, deadline + 3.0)
                reply = await read_reply(ws, turn_deadline, need_audio=True)
                stats.errors += [message[:120] for message in reply.errors]
                stats.lateness_ms += reply.lateness_ms
                if reply.first is None:
                    stats.missed += 1
                else:
                    if reply.stopped is not None:
                        stats.turn_ms.append((reply.first - reply.stopped) * 1000)
                    if mic.ended is not None and mic.ended <= reply.first:
                        stats.end_of_audio_ms.append((reply.first - mic.ended) * 1000)
                    stats.turns += reply.done
                await asyncio.sleep(rng.uniform(1.0, 3.0))  # the user thinks
    finally:
        await ws.close()


async def client_main(port: int, sessions: int, seconds: float, seed: int) -> TurnStats:
    stats = TurnStats()
    pcm = load_utterance(UTTERANCE)
    deadline = time.monotonic() + seconds

    async def one(i: int) -> None:
        await session_loop(port, pcm, deadline, stats, seed * 100003 + i)

    failed = await run_sessions(sessions, one, ramp_s=0.004)
    stats.errors += [f"session: {r!r}"[:160] for r in failed]
    return stats


def run_client_worker(args: argparse.Namespace) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    stats = asyncio.run(client_main(args.port, args.client_sessions, args.run_s, args.seed))
    # a file, not stdout: the event loop leaves stdout non-blocking, and a large write to a pipe is cut short
    Path(args.result_file).write_text(json.dumps(asdict(stats)))


# ---------------------------------------------------------------- orchestration


def vad_device(args: argparse.Namespace) -> str:
    return args.vad_device or args.device


def clock_flag(args: argparse.Namespace, clock: str) -> list[str]:
    """The gateway's ``device_clock`` for a run: on = the stages' device shares a clock; off = none."""
    device = "cuda" if args.device.startswith("cuda") else args.device
    return ["--device-clock", device if clock == "on" else "[]"]


def gateway_flags(args: argparse.Namespace, clock: str) -> list[str]:
    batch = str(args.max_batch)
    # The gateway warms its CUDA stages one after another (Workers.start), so both may share the GPU.
    flags = ["--policy", "none", *clock_flag(args, clock)]
    # Qwen3-TTS has only the published shapes; the CPU smoke run speaks with the tiny codec LM instead.
    flags += (
        ["--tts", "codec", "--tts-config", "tiny"]
        if args.tiny
        else ["--tts", "qwen3", "--tts-config", args.tts_config]
    )
    flags += ["--asr", "kyutai", "--asr-config", "tiny" if args.tiny else args.asr_config]
    flags += ["--tts-device", args.device, "--asr-device", args.device, "--tts-max-batch", batch]
    if vad_device(args) != "onnx":
        flags += ["--vad-device", vad_device(args)]
    flags += ["--asr-max-batch", batch, "--vad-max-batch", batch]
    flags += ["--max-sessions", str(max(1024, args.max_batch))]
    flags += ["--max-connections-per-client", "0", "--worker-max-active", str(max(1024, args.max_batch))]
    return flags + args.gateway_arg


def run_clients(args: argparse.Namespace, port: int, sessions: int, procs: int) -> TurnStats:
    """``sessions`` talking sessions from ``procs`` client processes for ``--run-s``; their merged stats."""
    shares = [sessions // procs + (1 if i < sessions % procs else 0) for i in range(procs)]
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loadtest.bench.voice_gpu",
                "--client-worker",
                "--port",
                str(port),
                "--client-sessions",
                str(n),
            ]
            + ["--run-s", str(args.run_s), "--seed", str(sessions * 1000 + i)]
            + ["--result-file", str(Path(args.out) / f"client-{sessions}-{i}.json")],
            cwd=ROOT,
        )
        for i, n in enumerate(shares)
    ]
    merged = TurnStats()
    for i, w in enumerate(workers):
        w.wait(timeout=args.run_s + 120)
        result_file = Path(args.out) / f"client-{sessions}-{i}.json"
        ok = w.returncode == 0 and result_file.exists()
        part = json.loads(result_file.read_text()) if ok else {"errors": [f"client exited {w.returncode}"]}
        result_file.unlink(missing_ok=True)
        for key, value in part.items():
            current = getattr(merged, key)
            setattr(merged, key, current + value)
    return merged


def run_level(args: argparse.Namespace, port: int, sessions: int) -> dict[str, Any]:
    procs = max(1, min(args.client_procs, sessions))
    before = scrape(port)
    t0 = time.monotonic()
    with GpuSampler() as gpu:
        merged = run_clients(args, port, sessions, procs)
    wall = time.monotonic() - t0
    inside = summarize(before, scrape(port), wall)
    turn50 = pct(merged.turn_ms, 50)
    miss_rate = inside["deadline_miss_rate"]
    late95 = pct(merged.lateness_ms, 95)
    turn95 = pct(merged.turn_ms, 95)
    real_time = (
        late95 is not None
        and late95 <= REAL_TIME_LATE_P95_MS
        and turn95 is not None
        and turn95 <= args.turn_bound_ms
        and merged.missed <= max(1, merged.turns // 50)
    )
    return {
        "sessions": sessions,
        "client_procs": procs,
        "wall_s": round(wall, 1),
        "turns": merged.turns,
        "replies_started": len(merged.end_of_audio_ms),
        "missed": merged.missed,
        "turn_ms_p50": turn50,
        "turn_ms_p95": turn95,
        "end_of_audio_ms_p50": pct(merged.end_of_audio_ms, 50),
        "end_of_audio_ms_p95": pct(merged.end_of_audio_ms, 95),
        "late_ms_p50": pct(merged.lateness_ms, 50),
        "late_ms_p95": late95,
        "late_ms_max": pct(merged.lateness_ms, 100),
        "frames": len(merged.lateness_ms),
        "client_mic_late_ms_p95": pct(merged.mic_late_ms, 95),
        "gpu_steps": inside["steps"],
        "deadline_miss_rate": miss_rate,
        "deadlines": inside["deadlines"],
        "clock_wait": inside["clock_wait"],
        "clock_handoff": inside["clock_handoff"],
        "event_loop_lag": inside["event_loop_lag"],
        "gateway_cpu_cores": inside["gateway_cpu_cores"],
        "device_busy": inside["device_busy"],
        "gpu_util_mean": gpu.mean,
        "errors": len(merged.errors),
        "error_samples": sorted(set(merged.errors))[:5],
        "real_time": real_time,
        "goal_met": bool(
            real_time
            and turn50 is not None
            and turn50 <= GOAL_TURN_P50_MS
            and miss_rate is not None
            and miss_rate < GOAL_MISS_RATE
        ),
    }


def markdown_table(run: dict[str, Any]) -> str:
    """The docs/benchmarks-log.md table of one gateway's run."""
    rows = [
        "| N | turns (replies started / missed) | turn p50 / p95 (ms) | end of audio -> 1st frame p50 / p95 (ms) "
        "| late p50 / p95 / max (ms) | ASR step p50 / p95 | TTS step p50 / p95 | VAD step p50 / p95 "
        "| 80 ms misses | real time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in run["levels"]:
        steps = lv["gpu_steps"]

        def step(prefix: str, steps: dict[str, Any] = steps) -> str:
            s = next((v for k, v in steps.items() if k.startswith(prefix)), None)
            return f"{s['p50_ms']} / {s['p95_ms']}" if s else "-"

        rows.append(
            f"| {lv['sessions']} | {lv['turns']} ({lv['replies_started']} / {lv['missed']}) "
            f"| {lv['turn_ms_p50']} / {lv['turn_ms_p95']} | {lv['end_of_audio_ms_p50']} / {lv['end_of_audio_ms_p95']} "
            f"| {lv['late_ms_p50']} / {lv['late_ms_p95']} / {lv['late_ms_max']} | {step('asr')} | {step('tts')} "
            f"| {step('vad')} | {percent(lv['deadline_miss_rate'])} | {'yes' if lv['real_time'] else 'no'} |"
        )
    return "\n".join(rows)


def percent(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.2f} %"


def comparison_table(runs: list[dict[str, Any]]) -> str:
    """Clock on vs off, level by level: the user's figures, then where the time went (device or host)."""
    rows = [
        "| N | clock | turn p50 / p95 (ms) | late p95 / max (ms) | 80 ms misses (ASR / TTS / VAD) "
        "| clock wait p95 ASR / TTS / VAD (ms) | handoff p50 / p95 (ms) | device busy | GPU util | event loop lag p95 / p99 (ms) "
        "| gateway CPU (cores) | step CPU / wall (ASR / TTS) | goal |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    sizes = sorted({lv["sessions"] for run in runs for lv in run["levels"]})
    for n in sizes:
        for run in runs:
            lv = next((x for x in run["levels"] if x["sessions"] == n), None)
            if lv is None:
                continue

            def stage(table: dict[str, Any], prefix: str, key: str) -> Any:
                return next((v.get(key) for k, v in table.items() if k.startswith(prefix)), None)

            misses = " / ".join(
                percent(stage(lv["deadlines"], p, "miss_rate")) for p in ("asr", "tts", "vad")
            )
            waits = " / ".join(
                str(stage(lv["clock_wait"], p, "p95_ms") or "-") for p in ("asr", "tts", "vad")
            )
            cpu = " / ".join(str(stage(lv["gpu_steps"], p, "cpu_over_wall")) for p in ("asr", "tts"))
            lag = lv["event_loop_lag"]
            hand = next(iter(lv["clock_handoff"].values()), {})
            handoff = f"{hand.get('p50_ms', '-')} / {hand.get('p95_ms', '-')}"
            rows.append(
                f"| {n} | {run['clock']} | {lv['turn_ms_p50']} / {lv['turn_ms_p95']} "
                f"| {lv['late_ms_p95']} / {lv['late_ms_max']} | {percent(lv['deadline_miss_rate'])} ({misses}) "
                f"| {waits} | {handoff} | {lv['device_busy']} | {lv['gpu_util_mean']} % | {lag['p95_ms']} / {lag['p99_ms']} "
                f"| {lv['gateway_cpu_cores']} | {cpu} | {'met' if lv['goal_met'] else 'no'} |"
            )
    return "\n".join(rows)


def gpu_name() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.used", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "none"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tts-config", default="0.6b")
    p.add_argument("--asr-config", default="1b")
    p.add_argument(
        "--tiny",
        action="store_true",
        help="tiny model shapes, the codec LM for TTS (CPU smoke run, --device cpu)",
    )
    p.add_argument(
        "--vad-device", default=None, help="Silero's torch device (default: --device); onnx = onnxruntime CPU"
    )
    p.add_argument("--sessions", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument(
        "--search", type=int, nargs="*", default=[], help="more N, in order; stops at the first not real time"
    )
    p.add_argument("--max-batch", type=int, default=0, help="ASR/TTS/VAD batch = slots (default: largest N)")
    p.add_argument("--run-s", type=float, default=30.0)
    p.add_argument(
        "--turn-bound-ms", type=float, default=500.0, help="turn latency p95 bound for 'real time'"
    )
    p.add_argument("--client-procs", type=int, default=4)
    p.add_argument(
        "--gateway-arg",
        action="append",
        default=[],
        help="one more gateway flag, repeatable (e.g. --gateway-arg=--asr-flush-s=0.56)",
    )
    p.add_argument(
        "--clock",
        nargs="+",
        choices=["on", "off"],
        default=["on", "off"],
        help="the device clock (--device-clock) in each gateway run, one gateway start each, in order",
    )
    p.add_argument("--ready-timeout-s", type=float, default=400.0)
    p.add_argument(
        "--budget-s", type=float, default=0.0, help="skip levels that would end past this (0: none)"
    )
    p.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "test-artifacts")))
    p.add_argument("--client-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--client-sessions", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--result-file", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client_worker:
        run_client_worker(args)
        return
    t_start = time.monotonic()
    args.max_batch = args.max_batch or max([*args.sessions, *args.search])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "bench": "voice_gpu",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": gpu_name(),
        "python": platform.python_version(),
        "weights": "random-init at the published shapes",
        "tts": "codec tiny" if args.tiny else f"qwen3 {args.tts_config}",
        "asr": f"kyutai {'tiny' if args.tiny else args.asr_config}",
        "vad": "silero onnxruntime CPU" if vad_device(args) == "onnx" else f"silero torch {vad_device(args)}",
        "device": args.device,
        "max_batch": args.max_batch,
        "run_s": args.run_s,
        "runs": [],
    }
    ready_s = 0.0
    for clock in args.clock:
        # A run is a gateway start (its warm-up) and every level; skip it rather than be cut off.
        if args.budget_s and time.monotonic() - t_start + ready_s + args.run_s + 30 > args.budget_s:
            print(f"skip clock {clock}: time budget", flush=True)
            continue
        try:
            run = run_gateway(args, clock, out, t_start)
        except Exception as e:  # one gateway failing (start-up, a crash) leaves the other run's figures
            print(f"clock {clock}: failed: {e!r}"[:4000], flush=True)
            result["runs"].append({"clock": clock, "error": repr(e)[:4000], "levels": []})
            continue
        ready_s = run["ready_s"]
        result["runs"].append(run)
    print(json.dumps(result, indent=1))
    (out / "bench_voice_gpu.json").write_text(json.dumps(result, indent=1))
    for run in result["runs"]:
        print(f"\nclock {run['clock']}:\n" + markdown_table(run))
    if len(result["runs"]) > 1:
        print("\n" + comparison_table(result["runs"]))


def run_gateway(args: argparse.Namespace, clock: str, out: Path, t_start: float) -> dict[str, Any]:
    """One gateway (the device clock on or off) through every load level."""
    port = free_port()
    flags = gateway_flags(args, clock)
    print(f"clock {clock}: gateway: -m realtime_gw serve --port", port, " ".join(flags), flush=True)
    log_path = out / f"gateway-clock-{clock}.log"
    gw = start_server(*flags, log_path=log_path, port=port, timeout=args.ready_timeout_s)
    levels: list[dict[str, Any]] = []
    try:
        print(f"ready in {gw.ready_s:.1f} s", flush=True)
        plan = [(n, False) for n in args.sessions] + [(n, True) for n in args.search]
        for n, searching in plan:
            if args.budget_s and time.monotonic() - t_start + args.run_s + 15 > args.budget_s:
                print(f"skip N={n}: time budget", flush=True)
                continue
            level = run_level(args, port, n)
            levels.append(level)
            print(json.dumps({"clock": clock, **level}), flush=True)
            if searching and not level["real_time"]:
                break
    finally:
        stop_server(gw, timeout=15)
    real = [lv["sessions"] for lv in levels if lv["real_time"]]
    return {
        "clock": clock,
        "gateway_flags": flags,
        "ready_s": round(gw.ready_s, 1),
        "largest_real_time_n": max(real) if real else None,
        "levels": levels,
    }


if __name__ == "__main__":
    main()
