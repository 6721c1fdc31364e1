"""OpenPI policy socket: our gateway vs openpi's stock ``WebsocketPolicyServer``, same policy, one run.

For each policy (``noop``: zeros, measures the server itself; ``tiny``: the tiny random-init PI0) and each
number of concurrent robots, every robot is a stock ``WebsocketClientPolicy`` sending a DROID-like
observation (2 cameras 224x224x3 uint8, 8-dim state, a prompt) in a closed loop. Round-trip latency
p50/p99 and throughput are printed as a table and appended to ``docs/benchmarks-log.md``.

Both servers run as child processes of this script (``--serve ours|stock``) with the same policy
object type: ours through ``create_app`` with only the policy worker, stock through
``realtime_gw.server.openpi_local.LocalPolicy``. The stock server runs one inference at a time on its
event loop; ours batches concurrent robots into one forward per step.

    .venv/bin/python -m loadtest.bench.openpi                      # full run (~2-3 min on 2 cores)
    .venv/bin/python -m loadtest.bench.openpi --seconds 3 --robots 1,4,16
    .venv/bin/python -m loadtest.bench.openpi --policies tiny --policy-impl fast --phase-steps 1   # ours phased

``--policy-impl fast`` serves PI0 through the fast sampler (both servers); ours then advances chunks in
phases (``--phase-steps``, the server's ``policy_phase_steps``; 0 = one-shot chunks).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.bench.log import BENCHMARKS_LOG

ROOT = Path(__file__).resolve().parents[2]

BENCHMARKS_MD = BENCHMARKS_LOG


# -- servers (child processes) ----------------------------------------------------------------------------
def _config(
    policy: str, port: int, max_wait_ms: float | None = None, impl: str = "auto", phase_steps: int = 1
) -> Any:
    from realtime_gw.config import GatewayConfig

    config = GatewayConfig(
        policy="noop" if policy == "noop" else "pi0",
        policy_config="tiny",
        policy_impl=impl,  # type: ignore[arg-type]
        policy_phase_steps=phase_steps,
        port=port,
        openpi_idle_timeout_s=0,
        log_level="warning",
    )
    if max_wait_ms is not None:
        config.policy_max_wait_ms = max_wait_ms
    return config


def serve_ours(policy: str, port: int, max_wait_ms: float | None, impl: str, phase_steps: int) -> None:
    import uvicorn

    from realtime_gw.app import create_app
    from realtime_gw.models.policy.factory import build_policy_backend, worker_max_wait_ms
    from realtime_gw.models.registry import Workers
    from realtime_gw.models.runtime import StageWorker

    config = _config(policy, port, max_wait_ms, impl, phase_steps)
    worker = StageWorker(
        build_policy_backend(config),
        device=config.policy_device,
        max_batch=config.policy_max_batch,
        max_wait_ms=worker_max_wait_ms(config),
        max_active=config.openpi_max_sessions * 2,
    )
    # Only the policy worker runs: the voice fields hold the (never started) policy worker itself.
    workers = Workers(tts=worker, asr=worker, vad=worker, policy=worker, all=[worker])
    app = create_app(config, workers=workers)
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", ws_max_size=config.openpi_max_frame_bytes
    )


def serve_stock(policy: str, port: int, impl: str) -> None:
    from openpi_server import WebsocketPolicyServer

    from realtime_gw.models.policy.factory import TINY_CHUNK, build_pi0_runner, policy_spec
    from realtime_gw.models.policy.noop import NoopRunner
    from realtime_gw.server.openpi_local import LocalPolicy

    config = _config(policy, port, impl=impl)
    if policy == "noop":
        runner: Any = NoopRunner(policy_spec(config, model="noop (zeros)", action_horizon=TINY_CHUNK))
    else:
        runner = build_pi0_runner(config)
    local = LocalPolicy(runner)
    local.infer(_observation(0))  # warm-up, as our worker does
    WebsocketPolicyServer(local, host="127.0.0.1", port=port, metadata=local.metadata).serve_forever()


# -- load -------------------------------------------------------------------------------------------------
def _observation(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {
        "observation/exterior_image_1_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": rng.standard_normal(8),
        "prompt": "pick up the red cup and put it in the bin",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _connect(port: int, timeout: float = 120.0) -> Any:
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    deadline = time.monotonic() + timeout
    while True:
        try:
            return WebsocketClientPolicy(host="127.0.0.1", port=port)
        except Exception:  # refused (not listening yet) or 503 (warming up)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@dataclass
class Cell:
    server: str
    policy: str
    robots: int
    latencies_ms: list[float]
    wall_s: float
    errors: int

    def pct(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    @property
    def throughput(self) -> float:
        return len(self.latencies_ms) / self.wall_s if self.wall_s else 0.0


def run_cell(server: str, policy: str, port: int, robots: int, seconds: float, min_requests: int) -> Cell:
    clients = [_connect(port) for _ in range(robots)]
    latencies: list[list[float]] = [[] for _ in clients]
    errors: list[str] = []
    window: list[float] = []  # start and end times of every robot's timed loop
    barrier = threading.Barrier(robots)

    def robot(i: int) -> None:
        obs = _observation(i + 1)
        try:
            clients[i].infer(obs)  # one untimed request per robot
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
            barrier.abort()  # never leave the others waiting for a robot that is gone
            return
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()
        start = time.perf_counter()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline or len(latencies[i]) < min_requests:
            t0 = time.perf_counter()
            try:
                reply = clients[i].infer(obs)
                assert reply["actions"].shape[0] > 0
            except Exception as e:  # e.g. the stock client's keepalive timing out on a busy server
                errors.append(f"{type(e).__name__}: {e}")
                break
            latencies[i].append((time.perf_counter() - t0) * 1000)
        window.extend((start, time.perf_counter()))

    threads = [threading.Thread(target=robot, args=(i,)) for i in range(robots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        with contextlib.suppress(Exception):
            c._ws.close()
    for e in sorted(set(errors)):
        print(f"  {server} {policy} robots={robots}: {errors.count(e)}x {e}", flush=True)
    wall = max(window) - min(window) if window else 0.0
    return Cell(server, policy, robots, [x for lat in latencies for x in lat], wall, len(errors))


def start(
    kind: str,
    policy: str,
    max_wait_ms: float | None,
    omp_wait_policy: str = "PASSIVE",
    impl: str = "auto",
    phase_steps: int = 1,
) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "loadtest.bench.openpi",
        "--serve",
        kind,
        "--policy",
        policy,
        "--port",
        str(port),
    ]
    cmd += ["--policy-impl", impl, "--phase-steps", str(phase_steps)]
    if max_wait_ms is not None:
        cmd += ["--max-wait-ms", str(max_wait_ms)]
    log_dir = ROOT / "test-artifacts"
    log_dir.mkdir(exist_ok=True)
    with (log_dir / f"bench-openpi-{kind}-{policy}.log").open("wb") as log:
        env = {**os.environ}
        if omp_wait_policy:
            # Spinning OpenMP workers starve the Python thread when other work shares the cores.
            env["OMP_WAIT_POLICY"] = omp_wait_policy
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    return proc, port


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


# -- report -----------------------------------------------------------------------------------------------
def hardware() -> str:
    model = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    import torch

    return (
        f"{model}, nproc={os.cpu_count()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"Python {platform.python_version()}"
    )


def table(cells: list[Cell]) -> str:
    rows = [
        "| policy | robots | ours p50 ms | ours p99 ms | stock p50 ms | stock p99 ms | p50 ours/stock "
        "| p99 ours/stock | ours req/s | stock req/s | n ours / stock |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(c.server, c.policy, c.robots): c for c in cells}
    for policy, robots in sorted({(c.policy, c.robots) for c in cells}, key=lambda k: (k[0] != "noop", k[1])):
        o, s = by.get(("ours", policy, robots)), by.get(("stock", policy, robots))
        if o is None or s is None:
            continue
        errs = f" ({o.errors}/{s.errors} errors)" if o.errors or s.errors else ""
        rows.append(
            f"| {policy} | {robots} | {o.pct(50):.1f} | {o.pct(99):.1f} | {s.pct(50):.1f} | {s.pct(99):.1f} "
            f"| {o.pct(50) / s.pct(50):.2f} | {o.pct(99) / s.pct(99):.2f} | {o.throughput:.1f} "
            f"| {s.throughput:.1f} | {len(o.latencies_ms)} / {len(s.latencies_ms)}{errs} |"
        )
    return "\n".join(rows)


def append_markdown(text: str, command: str, load: str, omp: str) -> None:
    BENCHMARKS_MD.parent.mkdir(exist_ok=True)
    header = "" if BENCHMARKS_MD.exists() else "# Benchmarks\n"
    stamp = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    with BENCHMARKS_MD.open("a") as f:
        f.write(
            f"{header}\n## OpenPI policy socket: realtime_gw vs stock openpi-server ({stamp})\n\n"
            f"- hardware: {hardware()}\n"
            f"- command: `{command}`\n"
            f"- load average (1 min) at start / end: {load} (other work on the machine skews absolute numbers; "
            "ours and stock alternate within every cell so both see the same conditions)\n"
            "- observation: 2 cameras 224x224x3 uint8 + 8-dim state + prompt; closed-loop robots "
            "(`WebsocketClientPolicy`), round-trip latency per `infer`\n"
            "- policies: `noop` returns zeros (server overhead only); `tiny` is PI0 at the tiny config with "
            "**random-init weights** (real compute, meaningless actions). Ratios < 1 mean ours is faster.\n"
            "- both servers are child processes on the same machine as the clients, "
            f"with OMP_WAIT_POLICY={omp or '(inherited)'}\n\n"
            f"{text}\n"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--serve", choices=["ours", "stock"], help=argparse.SUPPRESS)
    parser.add_argument("--policy", default="noop", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--policies", default="noop,tiny", help="comma-separated: noop,tiny")
    parser.add_argument("--robots", default="1,4,16", help="concurrent robots per cell, comma-separated")
    parser.add_argument("--seconds", type=float, default=4.0, help="timed load per cell and server")
    parser.add_argument(
        "--rounds", type=int, default=2, help="ours/stock alternations per cell (fights drift)"
    )
    parser.add_argument(
        "--max-wait-ms", type=float, default=None, help="ours: policy_max_wait_ms (default: config)"
    )
    parser.add_argument(
        "--policy-impl",
        default="auto",
        choices=["auto", "fast", "eager"],
        help="PI0 sampler of both servers (auto: eager on the CPU)",
    )
    parser.add_argument(
        "--phase-steps",
        type=int,
        default=1,
        help="ours with --policy-impl fast: denoising steps per worker step (0 = one-shot chunks)",
    )
    parser.add_argument("--min-requests", type=int, default=3, help="per robot and cell, even past --seconds")
    parser.add_argument(
        "--omp-wait-policy",
        default="PASSIVE",
        help="OMP_WAIT_POLICY for both servers ('' = inherit). Under CPU contention the default (spinning) "
        "made the stock server's inference 20-50x slower in our runs",
    )
    parser.add_argument("--no-append", action="store_true", help="print only; leave docs/benchmarks-log.md alone")
    args = parser.parse_args()
    if args.serve == "ours":
        serve_ours(args.policy, args.port, args.max_wait_ms, args.policy_impl, args.phase_steps)
        return
    if args.serve == "stock":
        serve_stock(args.policy, args.port, args.policy_impl)
        return

    command = "python -m loadtest.bench.openpi " + " ".join(sys.argv[1:])
    load_start = os.getloadavg()[0]
    cells: list[Cell] = []
    for policy in args.policies.split(","):
        # Both servers stay up (idle costs nothing) so the measurements can alternate between them.
        servers = {
            kind: start(
                kind, policy, args.max_wait_ms, args.omp_wait_policy, args.policy_impl, args.phase_steps
            )
            for kind in ("ours", "stock")
        }
        try:
            for _, port in servers.values():
                _connect(port)._ws.close()  # ready: metadata received (ours answers 503 until warmed up)
            for robots in (int(r) for r in args.robots.split(",")):
                merged = {k: Cell(k, policy, robots, [], 0.0, 0) for k in servers}
                for rnd in range(args.rounds):
                    for kind in ("ours", "stock") if rnd % 2 == 0 else ("stock", "ours"):
                        part = run_cell(
                            kind,
                            policy,
                            servers[kind][1],
                            robots,
                            args.seconds / args.rounds,
                            args.min_requests,
                        )
                        merged[kind].latencies_ms += part.latencies_ms
                        merged[kind].wall_s += part.wall_s
                        merged[kind].errors += part.errors
                for cell in merged.values():
                    cells.append(cell)
                    print(
                        f"{cell.server:5s} {policy:4s} robots={robots:2d}  p50={cell.pct(50):8.1f} ms  "
                        f"p99={cell.pct(99):8.1f} ms  {cell.throughput:7.1f} req/s  n={len(cell.latencies_ms)}",
                        flush=True,
                    )
        finally:
            for proc, _ in servers.values():
                stop(proc)
    text = table(cells)
    print("\n" + text)
    if not args.no_append:
        append_markdown(
            text, command.strip(), f"{load_start:.2f} / {os.getloadavg()[0]:.2f}", args.omp_wait_policy
        )
        print(f"\nappended to {BENCHMARKS_MD.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
