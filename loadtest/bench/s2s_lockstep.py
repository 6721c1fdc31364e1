"""Speech-to-speech stage through its stage worker: the 80 ms lockstep against stepping whenever frames
arrive (the stage before the lockstep), with N live conversations.

**Random-init weights** (``--config tiny|7b``; real architecture and cost, noise for speech). Each
conversation's client sends one 80 ms frame every 80 ms on its own phase (spread over the frame, plus
up to ``--jitter-ms`` of random delay), as microphones of independent callers do; every frame the stage
answers is timed where the session would read it. Per mode:

- ``steps_per_frame``: engine steps run per 80 ms of wall time, and ``batch``: conversations per step
  (p50 / max): the lockstep runs one step of all N per frame; stepping as frames arrive runs several
  partial steps, each paying its batch bucket;
- ``cadence_ms``: gaps between a conversation's consecutive frames (p50 / p99 / max);
- ``late_ms``: how far each frame came after its slot on the ideal schedule (first frame + k x 80 ms),
  p50 / p99 / max: a clock that drifts or bursts shows here;
- ``skipped_ticks``, ``concealed_frames``: frames whose step never ran; input frames not there at
  their step (heard as silence);
- ``step_ms``: the engine step's wall time (p50 / p99 / max).

JSON to stdout and ``--json``; ``--budget-s`` stops starting a mode past it.

    python -m loadtest.bench.s2s_lockstep --config 7b --device cuda --slots 32 --seconds 20 --json lockstep.json
    python -m loadtest.bench.s2s_lockstep --config tiny --device cpu --slots 4 --seconds 3   # dry run (CPU)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from realtime_gw.config import GatewayConfig
from realtime_gw.models.lockstep import Lockstep
from realtime_gw.models.runtime import TICKS_SKIPPED, StageWorker
from realtime_gw.models.s2s.backend import S2S_CONCEALED, MoshiBackend, build_moshi
from realtime_gw.records.s2s import S2sAudio, S2sOpen

FRAME_S = 0.08
FRAME_BYTES = 3840


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    a = np.asarray(xs, dtype=np.float64)
    return {"p50": round(float(np.percentile(a, 50)), 2), "p99": round(float(np.percentile(a, 99)), 2), "max": round(float(a.max()), 2)}


class Counting:
    """The backend's steps, timed and counted with their batch sizes (what the worker runs)."""

    def __init__(self, backend: MoshiBackend) -> None:
        self.step = backend.step
        self.batches: list[int] = []
        self.step_ms: list[float] = []
        backend.step = self  # type: ignore[method-assign]

    def __call__(self, work: list[Any]) -> Any:
        t = time.perf_counter()
        out = self.step(work)
        self.step_ms.append((time.perf_counter() - t) * 1000)
        self.batches.append(len(work))
        return out


async def converse(
    stream: Any, i: int, slots: int, t0: float, seconds: float, jitter_ms: float, noise: list[bytes], arrivals: list[float]
) -> None:
    """Conversation ``i`` of ``slots``: an 80 ms frame of ``noise`` pushed on its own phase of the frame
    (each up to ``jitter_ms`` late) until ``t0 + seconds``; each frame out of it timed into ``arrivals``."""
    jitter = random.Random(i)

    async def read() -> None:
        async for _ in stream:
            arrivals.append(time.monotonic())

    reader = asyncio.create_task(read())
    start = t0 + FRAME_S * i / slots
    k = 0
    while time.monotonic() < t0 + seconds:
        await asyncio.sleep(max(0.0, start + k * FRAME_S + jitter.uniform(0, jitter_ms) / 1000 - time.monotonic()))
        stream.push(S2sAudio(noise[k % len(noise)]))
        k += 1
    stream.cancel()
    reader.cancel()


async def run_mode(backend: MoshiBackend, counting: Counting, lockstep: bool, slots: int, seconds: float, jitter_ms: float) -> dict[str, Any]:
    backend.lockstep = lockstep
    worker = StageWorker(backend, max_batch=slots, max_active=slots, lockstep=Lockstep(FRAME_S) if lockstep else None)
    await worker.start(warmup=False)
    skipped0, concealed0 = TICKS_SKIPPED.labels(backend.name)._value.get(), S2S_CONCEALED._value.get()
    counting.batches.clear()
    counting.step_ms.clear()
    rng = np.random.default_rng(0)
    noise = [(rng.standard_normal(FRAME_BYTES // 2) * 3000).astype("<i2").tobytes() for _ in range(8)]
    arrivals: list[list[float]] = [[] for _ in range(slots)]
    t0 = time.monotonic()

    async def client(i: int) -> None:
        await converse(worker.submit(S2sOpen(seed=i)), i, slots, t0, seconds, jitter_ms, noise, arrivals[i])

    try:
        await asyncio.gather(*(client(i) for i in range(slots)))
        wall = time.monotonic() - t0
    finally:
        await worker.stop()
    gaps = [(b - a) * 1000 for times in arrivals for a, b in zip(times, times[1:], strict=False)]
    late = [(t - times[0] - k * FRAME_S) * 1000 for times in arrivals for k, t in enumerate(times)]
    return {
        "mode": "lockstep" if lockstep else "as-frames-arrive",
        "conversations": slots,
        "frames_out": sum(len(t) for t in arrivals),
        "steps_per_frame": round(len(counting.batches) / (wall / FRAME_S), 2),
        "batch": {"p50": float(np.median(counting.batches)) if counting.batches else 0.0, "max": max(counting.batches, default=0)},
        "cadence_ms": stats(gaps),
        "late_ms": stats(late),
        "skipped_ticks": TICKS_SKIPPED.labels(backend.name)._value.get() - skipped0,
        "concealed_frames": S2S_CONCEALED._value.get() - concealed0,
        "step_ms": stats(counting.step_ms),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    deadline = time.monotonic() + args.budget_s
    config = GatewayConfig(s2s="moshi", s2s_config=args.config, s2s_device=args.device, s2s_slots=args.slots)
    t = time.monotonic()
    backend = build_moshi(config)
    backend.warmup()
    result: dict[str, Any] = {
        "config": args.config, "device": args.device, "weights": "random init", "slots": args.slots,
        "seconds": args.seconds, "jitter_ms": args.jitter_ms, "python": platform.python_version(),
        "warmup_s": round(time.monotonic() - t, 1), "modes": [],
    }  # fmt: skip
    counting = Counting(backend)
    for lockstep in (False, True):
        if time.monotonic() > deadline:
            log("budget spent: mode skipped")
            break
        row = await run_mode(backend, counting, lockstep, args.slots, args.seconds, args.jitter_ms)
        log(json.dumps(row))
        result["modes"].append(row)
        save(result, args.json)
    modes = {m["mode"]: m for m in result["modes"]}
    if len(modes) == 2:  # the lockstep against the baseline, measured in the same run
        base, new = modes["as-frames-arrive"], modes["lockstep"]
        result["ratio_steps_per_frame"] = round(new["steps_per_frame"] / max(base["steps_per_frame"], 1e-9), 3)
    return result


def save(result: dict[str, Any], path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


def run_cli(
    doc: str | None, each: str, bench: Callable[[argparse.Namespace], Awaitable[dict[str, Any]]], argv: list[str] | None
) -> dict[str, Any]:
    """The command line of the lockstep benches: conversations on a stage, ``each`` (a mode, a path) run for
    ``--seconds``; the result printed and saved to ``--json``."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="7b", choices=["7b", "tiny"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--slots", type=int, default=32, help="live conversations (the stage's slots)")
    p.add_argument("--seconds", type=float, default=20.0, help=f"per {each}")
    p.add_argument("--jitter-ms", type=float, default=20.0, help="each client frame's random extra delay")
    p.add_argument("--budget-s", type=float, default=300.0, help=f"stop starting {each}s after this")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    result = asyncio.run(bench(args))
    print(json.dumps(result, indent=1))
    save(result, args.json)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_cli(__doc__, "mode", main_async, argv)


if __name__ == "__main__":
    main()
