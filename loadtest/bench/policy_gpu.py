"""GPU robot policy: the fast PI0 (or π0.5, ``--policy pi05``) sampler (static prefix KV + CUDA graphs per
batch bucket) vs transformers' eager ``sample_actions``, one run.

Full PI0 config (PaliGemma 2B + 300M action expert), **random-init weights** (real architecture and cost;
the actions are meaningless), bfloat16, 3 cameras at 224x224, 48 prompt tokens, 50 x 32 actions; π0.5:
its published config, the state in a 200-token prompt (openpi's ``pi05_droid`` layout).

Phases (each prints as it goes; everything also goes to ``--json``):
1. checks: fast (graphs) vs eager ``sample_actions`` on the same inputs and noise, mixed batch of 4 (bf16,
   so agreement is to bf16 rounding); graph replay vs the same code launched eagerly; RTC frozen steps.
2. chunk latency, runner level (``runner.run`` on prepared requests: host->device copy, graph replays,
   device->host copy), p50/p99 at several batch sizes, eager baseline at 1 and 8; RTC chunks too.
   Also the device time of the graph replays alone (CUDA events) and where the host time goes.
   The main fast runner is built as the server builds it: ``--compile auto`` compiles the expert's
   step on CUDA within ``--compile-budget-s`` (the warm-up time is reported).
3. robots at a fixed chunk rate (default 10 Hz each, random phases) through a real ``StageWorker``
   (preprocessing on the worker thread): latency p50/p99 per N, for each ``--phase-steps`` in one run:
   0 = one-shot chunks (batching window ``policy_max_wait_ms``), k > 0 = phased chunks (new robots'
   prefixes, then k denoising steps of every robot per worker step; no window).
4. the socket: a gateway (uvicorn, the OpenPI handler) on this machine and msgpack-numpy clients on
   this machine: round trip per ``infer`` for 1 robot closed-loop and N robots at 10 Hz, and streamed
   mode (chunk order, start steps, gaps).
5. uncompiled: the same sampler without ``torch.compile`` at batch 1 and 8 (what the compile buys).

    python3 -m loadtest.bench.policy_gpu --json out.json          # on a CUDA machine
    python3 -m loadtest.bench.policy_gpu --policy pi05 --json pi05.json   # π0.5, same phases
    python3 -m loadtest.bench.policy_gpu --config tiny --device cpu --quick   # smoke run anywhere
    python3 -m loadtest.bench.policy_gpu --config tiny --device cpu --policy-impl fast \
        --skip checks,eager,fast,variant,uncompiled,socket --robots 1,2,4 --phase-steps 0,1   # phases on the CPU
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import faulthandler
import json
import platform
import random
import socket
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from realtime_gw.config import GatewayConfig
from realtime_gw.models.policy.backend import PolicyBackend
from realtime_gw.models.policy.factory import (
    compile_cache,
    compile_enabled,
    load_model,
    policy_spec,
)
from realtime_gw.models.policy.pi0 import Pi0Runner
from realtime_gw.models.policy.pi0_fast import FastPi0Runner
from realtime_gw.models.runtime import StageWorker
from realtime_gw.records.policy import PolicyRequest, RtcGuide

ROOT = Path(__file__).resolve().parents[2]

CAMERAS = [
    "observation/exterior_image_1_left",
    "observation/wrist_image_left",
    "observation/exterior_image_2_left",
]
PROMPT = "pick up the red cup and put it in the blue bowl on the left"  # >= 48 byte tokens
RESULTS: dict[str, Any] = {}


def log(msg: str) -> None:
    print(msg, flush=True)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def make_config(args: argparse.Namespace) -> GatewayConfig:
    return GatewayConfig(
        policy=args.policy,
        policy_config=args.config,
        policy_device=args.device,
        policy_cameras=CAMERAS,
        policy_optional_cameras=[],
        policy_max_batch=max(args.batches),
        policy_max_wait_ms=args.max_wait_ms,
        openpi_max_sessions=256,
        warmup=True,
    )


def load_pi0(name: str, device: str, max_batch: int) -> tuple[Any, Any, Any]:
    """(model, tokenizer, spec) of the ``name`` config as the probes use it: random init, the bench's
    cameras, 48 prompt tokens."""
    config = GatewayConfig(
        policy_config=name,
        policy_device=device,
        policy_cameras=CAMERAS,
        policy_optional_cameras=[],
        policy_max_batch=max_batch,
    )
    model, tok, desc, _ = load_model(config)
    spec = policy_spec(
        config, model=desc, action_horizon=model.config.chunk_size, tokenizer=tok.name, max_prompt_tokens=48
    )
    return model, tok, spec


def request(i: int, seed: int | None = None, rtc: RtcGuide | None = None) -> PolicyRequest:
    rng = np.random.default_rng(i)
    return PolicyRequest(
        images=[rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in CAMERAS],
        state=rng.standard_normal((1, 8)).astype(np.float32),
        prompt=PROMPT,
        seed=i if seed is None else seed,
        rtc=rtc,
    )


def observation(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    obs: dict[str, Any] = {k: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for k in CAMERAS}
    obs["observation/state"] = rng.standard_normal(8)
    obs["prompt"] = PROMPT
    return obs


# -- 1. checks --------------------------------------------------------------------------------------------
def checks(eager: Pi0Runner, fast: FastPi0Runner) -> None:
    reqs = [request(i) for i in range(4)]
    reqs[1].images[2] = None  # a masked camera in the mix
    prepared = [eager.prepare(r) for r in reqs]
    ref = np.stack(eager.run(prepared, None))
    got = np.stack(fast.run(prepared, None))
    solo = np.stack([fast.run([p], None)[0] for p in prepared])
    direct = fast.finish(prepared, fast.fn.sample(prepared, fast.spec.num_inference_steps, fast.device))
    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    RESULTS["check"] = {
        "fast_vs_eager_max_abs": float(np.abs(got - ref).max()),
        "fast_vs_eager_rel_l2": rel,
        "eager_abs_max": float(np.abs(ref).max()),
        "graph_batched_vs_solo_max_abs": float(np.abs(got - solo).max()),
        "graph_vs_no_graph_max_abs": float(np.abs(got - np.stack(direct)).max()),
    }
    # A bf16 reference for scale: eager bf16 vs itself on a different batch composition.
    ref_solo = np.stack([eager.run([p], None)[0] for p in prepared])
    RESULTS["check"]["eager_batched_vs_solo_max_abs"] = float(np.abs(ref - ref_solo).max())
    h = fast.spec.action_horizon
    s, d = h // 2, max(2, h // 10)
    prev = got[0][s:]
    (rtc,) = fast.run([fast.prepare(request(9, rtc=RtcGuide(prev, d, s)))], None)
    (plain,) = fast.run([fast.prepare(request(9))], None)
    raw = fast.fn.sample([fast.prepare(request(9, rtc=RtcGuide(prev, d, s)))], 10, fast.device)
    raw_a = raw[0, :, : fast.spec.action_dim].float().cpu().numpy()
    RESULTS["check"]["rtc_frozen_max_abs_model_output"] = float(np.abs(raw_a[:d] - prev[:d]).max())
    RESULTS["check"]["rtc_boundary_jump"] = float(np.linalg.norm(rtc[d] - prev[d]))
    RESULTS["check"]["plain_boundary_jump"] = float(np.linalg.norm(plain[d] - prev[d]))
    log(f"checks: {json.dumps(RESULTS['check'])}")


# -- 2. chunk latency ---------------------------------------------------------------------------------------
def time_runner(runner: Pi0Runner, batch: int, reps: int, device: str, rtc: bool = False) -> dict[str, float]:
    h = runner.spec.action_horizon
    guide = RtcGuide(np.zeros((h // 2, runner.spec.action_dim), np.float32), 5, h // 2) if rtc else None
    sets = [[runner.prepare(request(100 * k + i, rtc=guide)) for i in range(batch)] for k in range(3)]
    runner.run(sets[0], None)  # warm (captures this bucket's graph if it was not yet)
    times = []
    for r in range(reps):
        sync(device)
        t0 = time.perf_counter()
        runner.run(sets[r % 3], None)
        times.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": pct(times, 50), "p99_ms": pct(times, 99), "min_ms": min(times), "n": reps}


def device_time(fast: FastPi0Runner, batch: int, rtc: bool = False, iters: int = 20) -> dict[str, float]:
    """Graph replays only, CUDA events, medians: the prefix at ``batch`` robots, one denoising step at
    its bucket, the steps of a chunk, and a whole chunk (prefix + steps)."""
    steps = fast.spec.num_inference_steps
    size = next(b for b in fast.buckets if b >= batch)
    prefix = fast.slots.graph("prefix", batch)
    step = fast.slots.graph("rtc" if rtc else "plain", size)
    out: dict[str, float] = {}
    parts = {
        "prefix_ms": [prefix],
        "step_ms": [step],
        "denoise_ms": [step] * steps,
        "chunk_ms": [prefix] + [step] * steps,
    }
    for name, graphs in parts.items():
        if any(g is None for g in graphs):
            continue
        times = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for g in graphs:
                g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        out[name] = float(np.median(times))
    return out


def host_time(fast: FastPi0Runner, batch: int, iters: int = 20) -> dict[str, float]:
    """Where a one-shot chunk's time goes, medians: ``admit`` (staging, upload, prefix launch: returns
    before the device is done) and ``advance`` (every step's launch, the wait for the device, read-back
    and un-normalising)."""
    steps = fast.spec.num_inference_steps
    prepared = [fast.prepare(request(300 + i)) for i in range(batch)]
    parts: dict[str, list[float]] = {"admit_ms": [], "advance_ms": []}
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        slots = fast.admit([(p, steps) for p in prepared])
        t1 = time.perf_counter()
        fast.advance([s for s in slots if s is not None], steps)
        t2 = time.perf_counter()
        for s in slots:
            if s is not None:
                fast.free(s)
        parts["admit_ms"].append((t1 - t0) * 1000)
        parts["advance_ms"].append((t2 - t1) * 1000)
    return {k: float(np.median(v)) for k, v in parts.items()}


# -- 3. robots at a chunk rate through the worker -------------------------------------------------------------
async def robots_at_rate(
    worker: StageWorker, n: int, hz: float, seconds: float, seed: int = 0
) -> dict[str, Any]:
    """``n`` robots, each a chunk every ``1 / hz`` s from a random phase, for ``seconds``: the latencies
    and what ``summarize`` needs."""
    lat: list[float] = []
    batches_before = _batch_sum()
    rng = random.Random(1000 * seed + n)

    async def robot(i: int) -> None:
        await asyncio.sleep(rng.random() / hz)  # random phase
        period, nxt = 1.0 / hz, time.perf_counter()
        end = nxt + seconds
        k = 0
        while nxt < end:
            req = request(1000 * i + k % 4)
            t0 = time.perf_counter()
            outs = await worker.submit(req).collect()
            assert len(outs) == 1
            lat.append((time.perf_counter() - t0) * 1000)
            k += 1
            nxt += period
            await asyncio.sleep(max(0.0, nxt - time.perf_counter()))

    t0 = time.perf_counter()
    await asyncio.gather(*(robot(i) for i in range(n)))
    wall = time.perf_counter() - t0
    steps, items = (x - y for x, y in zip(_batch_sum(), batches_before, strict=True))
    return {"robots": n, "lat": lat, "wall": wall, "steps": steps, "items": items}


def summarize(parts: list[dict[str, Any]]) -> dict[str, float]:
    lat = [x for p in parts for x in p["lat"]]
    steps, items = sum(p["steps"] for p in parts), sum(p["items"] for p in parts)
    return {
        "robots": parts[0]["robots"],
        "p50_ms": pct(lat, 50),
        "p99_ms": pct(lat, 99),
        "max_ms": max(lat),
        "chunks_per_s": len(lat) / sum(p["wall"] for p in parts),
        "mean_batch": items / steps if steps else 0.0,
        "n": len(lat),
    }


def robots_simulated(
    runner: Any, n: int, hz: float, seconds: float, phase_steps: int, seed: int, clock: Any
) -> dict[str, Any]:
    """The same robots on a simulated clock: one thread opens and steps the backend as the worker would
    (every open request in every step, no batching window, no thread hops), and the clock advances by
    ``clock()``'s measure of each open and step (``time.thread_time`` on the CPU: this thread's CPU time,
    which other processes on a shared machine do not inflate). Robots keep their schedule (random
    phases) but, as the real ones, send the next request only once the last is answered."""
    backend = PolicyBackend(runner, slots=512, phase_steps=phase_steps)
    rng = random.Random(1000 * seed + n)
    schedule = {i: rng.random() / hz for i in range(n)}  # each robot's next slot (random phase)
    due = dict(schedule)  # when each robot sends next: its slot, or its last answer if that came later
    sent = dict.fromkeys(range(n), 0)
    live: list[tuple[Any, int, float]] = []
    lat: list[float] = []
    now, busy, steps, items = 0.0, 0.0, 0, 0
    while due or live:
        if not live:
            now = max(now, min(due.values()))
        for i in [i for i, t in due.items() if t <= now]:
            t0 = clock()
            live.append((backend.open(request(1000 * i + sent[i] % 4)), i, due.pop(i)))
            now += clock() - t0
        t0 = clock()
        results = backend.step([(state, []) for state, _, _ in live])
        cost = clock() - t0
        now, busy, steps, items = now + cost, busy + cost, steps + 1, items + len(live)
        still = []
        for (state, i, t), r in zip(live, results, strict=True):
            if not r.done:
                still.append((state, i, t))
                continue
            lat.append((now - t) * 1000)
            backend.release(state)
            sent[i] += 1
            schedule[i] += 1.0 / hz
            if sent[i] < seconds * hz:
                due[i] = max(schedule[i], now)
        live = still
    return {"robots": n, "lat": lat, "wall": now, "steps": steps, "items": items, "busy": busy}


def _batch_sum() -> tuple[float, float]:
    from prometheus_client import REGISTRY

    count = REGISTRY.get_sample_value("realtime_gw_worker_batch_size_count", {"worker": "policy"}) or 0.0
    total = REGISTRY.get_sample_value("realtime_gw_worker_batch_size_sum", {"worker": "policy"}) or 0.0
    return count, total


# -- 4. the socket ------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def gateway(config: GatewayConfig, backend: PolicyBackend) -> Any:
    """The OpenPI handler under uvicorn with only the policy worker (no voice models needed)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute

    from realtime_gw.app import Gateway
    from realtime_gw.models.registry import Workers
    from realtime_gw.server import openpi_ws
    from realtime_gw.server.auth import Access
    from realtime_gw.server.responder import build_responder

    worker = StageWorker(
        backend,
        device=config.policy_device,
        max_batch=config.policy_max_batch,
        max_wait_ms=config.policy_max_wait_ms if backend.one_shot else 0.0,  # no window between phases
        max_active=512,
    )
    workers = Workers(tts=worker, asr=worker, vad=worker, policy=worker, all=[worker])
    gw = Gateway(config=config, workers=workers, responder=build_responder(config), access=Access([], 0, []))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        await worker.start(warmup=False)  # the backend is already warm
        yield
        await worker.stop()

    app = Starlette(routes=[WebSocketRoute("/", openpi_ws.openpi_endpoint)], lifespan=lifespan)
    app.state.gateway = gw
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", ws_max_size=64 << 20, lifespan="on"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"ws://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _client(url: str) -> Any:
    import websockets.sync.client as wsc

    from realtime_gw.protocols.openpi import unpackb

    conn = wsc.connect(url, max_size=None, compression=None)
    unpackb(conn.recv())  # metadata
    return conn


def socket_round_trips(url: str, n: int, hz: float | None, seconds: float) -> dict[str, float]:
    from realtime_gw.protocols.openpi import packb, unpackb

    frames = [packb(observation(i)) for i in range(4)]
    lat: list[float] = []
    lock = threading.Lock()

    def robot(i: int) -> None:
        conn = _client(url)
        rng = random.Random(i)
        if hz:
            time.sleep(rng.random() / hz)
        nxt = time.perf_counter()
        end = nxt + seconds
        k = 0
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            conn.send(frames[(i + k) % 4])
            reply = unpackb(conn.recv(timeout=60))
            assert isinstance(reply, dict) and "actions" in reply, reply
            with lock:
                lat.append((time.perf_counter() - t0) * 1000)
            k += 1
            if hz:
                nxt += 1.0 / hz
                time.sleep(max(0.0, nxt - time.perf_counter()))
        conn.close()

    threads = [threading.Thread(target=robot, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"robots": n, "hz": hz or 0, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "n": len(lat)}


def socket_stream(url: str, control_hz: float, execute_horizon: int, seconds: float) -> dict[str, Any]:
    from realtime_gw.protocols.openpi import packb, unpackb

    conn = _client(url)
    conn.send(
        packb({"endpoint": "stream_start", "control_hz": control_hz, "execute_horizon": execute_horizon})
    )
    started = unpackb(conn.recv(timeout=30))
    stop = threading.Event()

    def sender() -> None:
        k = 0
        while not stop.is_set():
            conn.send(packb(observation(k % 4)))
            k += 1
            time.sleep(1.0 / 30)  # a 30 fps camera

    t = threading.Thread(target=sender)
    t.start()
    chunks: list[dict[str, Any]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        msg = conn.recv(timeout=30)
        if isinstance(msg, str):
            raise RuntimeError(msg)
        m = unpackb(msg)
        if m.get("type") == "action_chunk":
            chunks.append(m)
    stop.set()
    t.join()
    conn.send(packb({"endpoint": "stream_stop"}))
    status: dict[str, Any] = {}
    while True:
        m = unpackb(conn.recv(timeout=30))
        if m.get("status") == "stream stopped":
            status = m
            break
    conn.close()
    idx = [c["chunk_index"] for c in chunks]
    starts = [c["start_step"] for c in chunks]
    h = started["action_horizon"]
    joins = []
    for a, b in zip(chunks, chunks[1:], strict=False):
        off, d = b["start_step"] - a["start_step"], b["inference_delay"]
        if 0 <= off < h and d:
            joins.append(float(np.abs(b["actions"][:d] - a["actions"][off : off + d]).max()))
    return {
        "chunks": len(chunks),
        "in_order": idx == list(range(idx[0], idx[0] + len(idx))) if idx else False,
        "start_step_deltas": sorted(set(np.diff(starts).tolist())),
        "max_start_delta": int(max(np.diff(starts))) if len(starts) > 1 else 0,
        "action_horizon": h,
        "inference_delays": sorted({c["inference_delay"] for c in chunks}),
        "infer_ms_p50": pct([c["server_timing"]["infer_ms"] for c in chunks], 50),
        "frozen_join_max_abs": max(joins) if joins else None,
        "status": {k: v for k, v in status.items() if k != "status"},
    }


# -- main ---------------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="pi0", choices=["pi0", "pi05"], help="PI0 or π0.5")
    ap.add_argument("--config", default="pi0", choices=["pi0", "tiny"], help="published shape or tiny")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--between", default="3,6", help="batch sizes between buckets, timed at runner level")
    ap.add_argument("--robots", default="1,2,3,4,6,8,12")
    ap.add_argument("--robot-hz", type=float, default=10.0)
    ap.add_argument("--robot-seconds", type=float, default=3.0, help="per robot count and mode")
    ap.add_argument("--robot-rounds", type=int, default=2, help="alternations of the modes per robot count")
    ap.add_argument(
        "--simulated-robots",
        action="store_true",
        help="also the robots on a simulated clock (CPU time of the stepping thread: robust to a shared CPU)",
    )
    ap.add_argument("--max-wait-ms", type=float, default=2.0, help="batching window of one-shot chunks")
    ap.add_argument(
        "--phase-steps",
        default="0,1",
        help="robots phase, one run each: denoising steps per worker step (0 = one-shot chunks)",
    )
    ap.add_argument(
        "--policy-impl",
        default="fast",
        choices=["fast", "eager"],
        help="the runner the robots and socket phases serve with (eager: transformers, one-shot only)",
    )
    ap.add_argument(
        "--compile",
        default="auto",
        choices=["auto", "on", "off"],
        help="the main fast runner's policy_compile (auto: on for CUDA, as the server's default)",
    )
    ap.add_argument("--compile-budget-s", type=float, default=450.0)
    ap.add_argument(
        "--compile-cache",
        default="auto",
        help="the server's policy_compile_cache: auto (~/.cache/realtime-gw/policy-compile), off, or a "
        "directory. Run twice with the same directory: the second warm-up is the warm start-up",
    )
    ap.add_argument("--fp8", action="store_true", help="the main fast runner's policy_fp8 (FP8 prefix)")
    ap.add_argument("--fp8-max-error", type=float, default=0.05, help="policy_fp8_max_error: the guard")
    ap.add_argument("--cpu-threads", type=int, default=2, help="torch threads with --device cpu")
    ap.add_argument("--quick", action="store_true", help="few reps, small robot counts (smoke run)")
    ap.add_argument(
        "--skip",
        default="",
        help="comma list of phases to skip: checks,eager,fast,robots,variant,uncompiled,socket",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--dump-after-s", type=float, default=0, help="print every thread's stack after this long"
    )
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    args.between = [int(b) for b in args.between.split(",") if b and int(b) <= max(args.batches)]
    phase_steps = [int(k) for k in args.phase_steps.split(",")]
    robots = [int(r) for r in args.robots.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    if args.quick:
        args.reps, robots, args.robot_seconds = 3, [1, 4], 1.5
    dev = args.device
    if dev == "cpu":
        torch.set_num_threads(args.cpu_threads)
    RESULTS["env"] = {
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name() if dev.startswith("cuda") else "cpu",
    }
    import transformers

    RESULTS["env"]["transformers"] = transformers.__version__
    log(f"env: {RESULTS['env']}")
    config = make_config(args)
    t0 = time.perf_counter()
    model, tok, desc, _ = load_model(config)
    sync(dev)
    RESULTS["load_s"] = time.perf_counter() - t0
    pi05 = args.policy == "pi05"  # openpi's π0.5: the state as text in a 200-token prompt
    spec = policy_spec(
        config,
        model=desc,
        action_horizon=model.config.chunk_size,
        tokenizer=tok.name,
        max_prompt_tokens=200 if pi05 else 48,
        state_in_prompt=pi05,
    )
    log(
        f"model {desc}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B params, {RESULTS['load_s']:.1f} s"
    )
    eager = Pi0Runner(model, tok, spec, dev)
    config.policy_compile = args.compile
    config.policy_compile_cache = args.compile_cache
    config.policy_graph_buckets = list(args.batches)
    compiled = compile_enabled(config)
    fast = FastPi0Runner(
        model,
        tok,
        spec,
        dev,
        buckets=tuple(args.batches),
        compile_graphs=compiled,
        compile_budget_s=args.compile_budget_s,
        compile_cache=compile_cache(config, model, spec),
        prefix_fp8=args.fp8,
        fp8_max_error=args.fp8_max_error,
    )
    RESULTS["compile_graphs"] = compiled
    if fast.fp8_check is not None:
        RESULTS["fp8"] = fast.fp8_check
        log(f"fp8 guard: {fast.fp8_check}")
    fast.warmup()
    RESULTS["warmup"] = fast.warmup_report
    log(f"warm-up (graph capture{' + compile' if compiled else ''}): {fast.warmup_report}")

    phases: list[tuple[str, Any]] = []
    if "checks" not in skip:
        phases.append(("checks", lambda: checks(eager, fast)))
    if "eager" not in skip:

        def eager_phase() -> None:
            RESULTS["eager"] = {}
            for b in (1, 8):
                RESULTS["eager"][b] = time_runner(eager, b, 4 if not args.quick else 2, dev)
                log(f"eager batch {b}: {RESULTS['eager'][b]}")

        phases.append(("eager", eager_phase))
    if "fast" not in skip:

        def fast_phase() -> None:
            RESULTS["fast"], RESULTS["fast_rtc"], RESULTS["device"] = {}, {}, {}
            for b in args.batches:
                RESULTS["fast"][b] = time_runner(fast, b, args.reps, dev)
                if dev.startswith("cuda"):
                    RESULTS["device"][b] = device_time(fast, b)
                    RESULTS["device"][b]["host"] = host_time(fast, b)
                log(f"fast batch {b}: {RESULTS['fast'][b]} device {RESULTS['device'].get(b)}")
            for b in args.between:
                # Sizes between buckets: the loop runs padded, the prefix at the exact size.
                RESULTS["fast"][b] = time_runner(fast, b, args.reps, dev)
                log(f"fast batch {b} (between buckets): {RESULTS['fast'][b]}")
            for b in (1, 8):
                if b in args.batches:
                    log(f"fast+rtc batch {b}: start")
                    RESULTS["fast_rtc"][b] = time_runner(fast, b, args.reps, dev, rtc=True)
                    if dev.startswith("cuda"):
                        RESULTS["fast_rtc"][b]["device"] = device_time(fast, b, rtc=True)
                    log(f"fast+rtc batch {b}: {RESULTS['fast_rtc'][b]}")

        phases.append(("fast", fast_phase))
    served = fast if args.policy_impl == "fast" else eager
    backend = PolicyBackend(served, slots=512, phase_steps=phase_steps[-1])
    if "robots" not in skip:

        def robots_phase() -> None:
            async def go() -> None:
                # One worker per mode, all on the same runner (one runs at a time); the modes alternate
                # within every robot count, so drift on a shared machine hits them alike.
                workers = {}
                for k in phase_steps:
                    mode = PolicyBackend(served, slots=512, phase_steps=k)
                    workers[k] = StageWorker(
                        mode,
                        device=dev,
                        max_batch=max(args.batches),
                        max_wait_ms=args.max_wait_ms if mode.one_shot else 0.0,
                        max_active=512,
                    )
                    await workers[k].start(warmup=False)
                RESULTS["robots"] = []
                over = 0
                for n in robots:
                    parts: dict[int, list[dict[str, Any]]] = {k: [] for k in phase_steps}
                    for rnd in range(args.robot_rounds):
                        for k in phase_steps if rnd % 2 == 0 else phase_steps[::-1]:
                            seconds = args.robot_seconds / args.robot_rounds
                            parts[k].append(await robots_at_rate(workers[k], n, args.robot_hz, seconds, rnd))
                    for k in phase_steps:
                        r = {**summarize(parts[k]), "phase_steps": k}
                        RESULTS["robots"].append(r)
                        log(f"robots at {args.robot_hz:g} Hz, phase_steps={k}: {r}")
                    over = (
                        over + 1
                        if min(r["p99_ms"] for r in RESULTS["robots"][-len(phase_steps) :]) > 50
                        else 0
                    )
                    if over >= 2 and dev.startswith("cuda"):
                        break
                for w in workers.values():
                    await w.stop()

            asyncio.run(go())

        phases.append(("robots", robots_phase))
    if args.simulated_robots:

        def simulated_phase() -> None:
            clock = time.thread_time if dev == "cpu" else time.perf_counter
            RESULTS["robots_simulated"] = []
            for n in robots:
                parts: dict[int, list[dict[str, Any]]] = {k: [] for k in phase_steps}
                for rnd in range(args.robot_rounds):
                    for k in phase_steps if rnd % 2 == 0 else phase_steps[::-1]:
                        seconds = args.robot_seconds / args.robot_rounds
                        parts[k].append(robots_simulated(served, n, args.robot_hz, seconds, k, rnd, clock))
                for k in phase_steps:
                    busy = sum(p["busy"] for p in parts[k]) / sum(p["wall"] for p in parts[k])
                    r = {**summarize(parts[k]), "phase_steps": k, "busy": busy}
                    RESULTS["robots_simulated"].append(r)
                    log(f"simulated robots at {args.robot_hz:g} Hz, phase_steps={k}: {r}")

        phases.append(("simulated", simulated_phase))
    if "variant" not in skip:

        def variant_phase() -> None:
            # The expert's attention through SDPA's fused kernel instead of GEMMs (graphs bake the choice
            # in at capture): the comparison behind UNFUSED_MAX_QUERIES.
            import realtime_gw.models.policy.pi0_functional as pf

            saved, pf.UNFUSED_MAX_QUERIES = pf.UNFUSED_MAX_QUERIES, 0
            try:
                sizes = tuple(b for b in (1, 8) if b in args.batches)
                alt = FastPi0Runner(model, tok, spec, dev, buckets=sizes)
                alt.warmup()
                RESULTS["expert_attention_sdpa"] = {}
                for b in sizes:
                    r = time_runner(alt, b, args.reps, dev)
                    if dev.startswith("cuda"):
                        r["device"] = device_time(alt, b)
                    RESULTS["expert_attention_sdpa"][b] = r
                    log(f"expert attention via SDPA, batch {b}: {r}")
            finally:
                pf.UNFUSED_MAX_QUERIES = saved

        phases.append(("variant", variant_phase))
    if "uncompiled" not in skip and compiled:

        def uncompiled_phase() -> None:
            # The same sampler without torch.compile: what the compile buys, and the start-up it costs.
            sizes = tuple(b for b in (1, 8) if b in args.batches)
            plain = FastPi0Runner(model, tok, spec, dev, buckets=sizes, compile_graphs=False)
            plain.warmup()
            RESULTS["uncompiled"] = {"warmup": plain.warmup_report}
            for b in sizes:
                prepared = [plain.prepare(request(7 * i)) for i in range(b)]
                r: dict[str, Any] = {
                    "vs_compiled_max_abs": float(
                        np.abs(np.stack(plain.run(prepared, None)) - np.stack(fast.run(prepared, None))).max()
                    )
                }
                r.update(time_runner(plain, b, args.reps, dev))
                r["rtc"] = time_runner(plain, b, args.reps, dev, rtc=True)
                if dev.startswith("cuda"):
                    r["device"] = device_time(plain, b)
                RESULTS["uncompiled"][b] = r
                log(f"uncompiled batch {b}: {r}")

        phases.append(("uncompiled", uncompiled_phase))
    if "socket" not in skip:

        def socket_phase() -> None:
            with gateway(config, backend) as url:
                RESULTS["socket"] = {"closed_loop_1": socket_round_trips(url, 1, None, 3.0)}
                log(f"socket 1 robot closed loop: {RESULTS['socket']['closed_loop_1']}")
                for n in (4, 8):
                    r = socket_round_trips(url, n, args.robot_hz, 3.0 if not args.quick else 1.5)
                    RESULTS["socket"][f"robots_{n}_at_{args.robot_hz:g}hz"] = r
                    log(f"socket {n} robots at {args.robot_hz:g} Hz: {r}")
                h = spec.action_horizon
                RESULTS["socket"]["stream"] = socket_stream(url, 50.0, h // 2, 4.0 if not args.quick else 2.0)
                log(f"socket stream: {RESULTS['socket']['stream']}")

        phases.append(("socket", socket_phase))
    # The comparison runner is optional: measure it last.
    phases.sort(key=lambda p: p[0] == "uncompiled")
    if args.dump_after_s:
        faulthandler.dump_traceback_later(args.dump_after_s, exit=False)
    for name, fn in phases:
        try:
            fn()
        except Exception:
            RESULTS.setdefault("errors", {})[name] = traceback.format_exc()
            log(f"phase {name} FAILED:\n{traceback.format_exc()}")
        if args.json:
            Path(args.json).write_text(json.dumps(RESULTS, indent=1, default=str))
    log("\n" + summary())


def summary() -> str:
    lines = [
        "| batch | eager p50 ms | fast p50 ms | fast p99 ms | device ms (prefix + denoise) | fast+RTC p50 ms |",
        "|---|---|---|---|---|---|",
    ]
    for b, r in RESULTS.get("fast", {}).items():
        e = RESULTS.get("eager", {}).get(b, {})
        d = RESULTS.get("device", {}).get(b, {})
        rt = RESULTS.get("fast_rtc", {}).get(b, {})
        dev_s = (
            f"{d.get('chunk_ms', float('nan')):.1f} ({d.get('prefix_ms', float('nan')):.1f} + {d.get('denoise_ms', float('nan')):.1f})"
            if d
            else "-"
        )
        lines.append(
            f"| {b} | {e.get('p50_ms', float('nan')):.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {dev_s} | {rt.get('p50_ms', float('nan')):.1f} |"
        )
    for r in RESULTS.get("robots", []):
        lines.append(
            f"robots {r['robots']} (phase_steps {r.get('phase_steps', 0)}): p50 {r['p50_ms']:.1f} p99 {r['p99_ms']:.1f} ms, "
            f"{r['chunks_per_s']:.0f}/s, batch {r['mean_batch']:.1f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
