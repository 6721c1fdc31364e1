"""The Ray hop for the speech-to-speech stage: its 80 ms lockstep served in process against the same
stage in a Ray actor (``remote_stages = "s2s"``), N live conversations, in the same run.

**Random-init weights** (``--config tiny|7b``). Each conversation's client sends one 80 ms frame every
80 ms on its own phase (spread over the frame, plus up to ``--jitter-ms`` of random delay), as
``loadtest/bench/s2s_lockstep.py`` does, and every frame the stage answers is timed where a session
would read it. Per path:

- ``open_ms``: submit -> the conversation holds a slot (in process: ``submit``; through the hop:
  ``RemoteStage.open_stream``, one round trip);
- ``cadence_ms``: gaps between a conversation's consecutive frames (p50 / p99 / max);
- ``late_ms``: each frame's arrival after its slot on the ideal schedule (k x 80 ms, anchored at the
  conversation's earliest frame on it);
- ``delivery_ms`` (the hop only): the actor's step handed a frame over -> it is in the front-end's stream;
- ``concealed_frames``: input frames not at the stage by their tick (heard as silence): the hop's delay on
  the way in shows here; ``skipped_ticks``, ``tick_late_ms_mean``: the stage's own clock, where it runs.

Ratios (Ray actor / in process) of late p99 and concealed frames come with them. JSON to stdout and
``--json``; ``--budget-s`` stops starting a path past it.

    python -m loadtest.bench.s2s_ray_hop --config 7b --device cuda --slots 32 --seconds 20 --json s2s_hop.json
    python -m loadtest.bench.s2s_ray_hop --config tiny --device cpu --slots 4 --seconds 4   # CPU
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from loadtest.bench.ray_hop import Worker, record_delivery
from loadtest.bench.s2s_lockstep import FRAME_BYTES, FRAME_S, converse, log, run_cli, save, stats
from realtime_gw.config import GatewayConfig
from realtime_gw.models.registry import build_stage
from realtime_gw.models.remote.client import RemoteStage
from realtime_gw.models.remote.routing import stage_actors
from realtime_gw.models.remote.settings import stage_settings
from realtime_gw.models.runtime import Stream
from realtime_gw.records.s2s import S2sOpen
from tests.server.ray_cluster import local_ray


def clocks(worker: Any) -> tuple[float, float, float, float]:
    """The stage's counters where it runs: concealed input frames, skipped ticks, tick lateness (sum,
    count). Shipped to the actor by value: it imports the metrics there (the actor's own)."""
    from realtime_gw.models.runtime import TICK_LATENESS, TICKS_SKIPPED
    from realtime_gw.models.s2s.backend import S2S_CONCEALED

    late = TICK_LATENESS.labels(worker.name)
    return (
        S2S_CONCEALED._value.get(),
        TICKS_SKIPPED.labels(worker.name)._value.get(),
        late._sum.get(),
        sum(b.get() for b in late._buckets),
    )


async def run_path(
    label: str,
    open_stream: Callable[[S2sOpen], Awaitable[Stream[Any]]],
    counters: Callable[[], Awaitable[tuple[float, float, float, float]]],
    slots: int,
    seconds: float,
    jitter_ms: float,
) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    noise = [(rng.standard_normal(FRAME_BYTES // 2) * 3000).astype("<i2").tobytes() for _ in range(8)]
    arrivals: list[list[float]] = [[] for _ in range(slots)]
    open_ms: list[float] = []
    before = await counters()
    t0 = time.monotonic()

    async def client(i: int) -> None:
        t = time.perf_counter()
        stream = await open_stream(S2sOpen(seed=i))
        open_ms.append((time.perf_counter() - t) * 1000)
        await converse(stream, i, slots, t0, seconds, jitter_ms, noise, arrivals[i])

    await asyncio.gather(*(client(i) for i in range(slots)))
    after = await counters()
    gaps = [(b - a) * 1000 for times in arrivals for a, b in zip(times, times[1:], strict=False)]
    late: list[float] = []
    for times in arrivals:  # after the schedule k x 80 ms set by the conversation's earliest frame
        offsets = [t - k * FRAME_S for k, t in enumerate(times)]
        late += [(o - min(offsets, default=0.0)) * 1000 for o in offsets]
    ticks = after[3] - before[3]
    return {
        "path": label,
        "conversations": slots,
        "frames_out": sum(len(t) for t in arrivals),
        "open_ms": stats(open_ms),
        "cadence_ms": stats(gaps),
        "late_ms": stats(late),
        "concealed_frames": after[0] - before[0],
        "skipped_ticks": after[1] - before[1],
        "tick_late_ms_mean": round((after[2] - before[2]) / max(ticks, 1) * 1000, 3),
    }


async def in_process(config: GatewayConfig, args: argparse.Namespace) -> dict[str, Any]:
    local = build_stage("s2s", config)
    await local.start()

    async def submit(request: S2sOpen) -> Stream[Any]:
        return local.submit(request)

    async def here() -> tuple[float, float, float, float]:
        return clocks(local)

    try:
        return await run_path("in process", submit, here, args.slots, args.seconds, args.jitter_ms)
    finally:
        await local.stop()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    deadline = time.monotonic() + args.budget_s
    config = GatewayConfig(
        policy="none", s2s="moshi", s2s_config=args.config, s2s_device=args.device, s2s_slots=args.slots,
        remote_stages="s2s", ray_namespace="bench-s2s-hop", ray_num_cpus=0.5,
    )  # fmt: skip
    result: dict[str, Any] = {
        "config": args.config, "device": args.device, "weights": "random init", "slots": args.slots,
        "seconds": args.seconds, "jitter_ms": args.jitter_ms, "python": platform.python_version(), "paths": [],
    }  # fmt: skip
    row = await in_process(config, args)
    gc.collect()  # the in-process stage's weights and ring KV leave the device before the actor's come
    if args.device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
    log(json.dumps(row))
    result["paths"].append(row)
    save(result, args.json)
    if time.monotonic() > deadline:
        log("budget spent: the Ray path skipped")
        return result
    with local_ray():
        actors = stage_actors("s2s", config, build_stage)
        hop = RemoteStage("s2s", actors, stage_settings("s2s", config))
        await hop.start()

        async def there() -> tuple[float, float, float, float]:
            answer: tuple[float, float, float, float] = await actors[0].__ray_call__.remote(
                lambda a: clocks(a.worker)
            )
            return answer

        delivered = Worker()
        original = record_delivery(delivered)
        try:
            row = await run_path(
                "Ray actor", hop.open_stream, there, args.slots, args.seconds, args.jitter_ms
            )
        finally:
            RemoteStage._apply = original  # type: ignore[method-assign]
            await hop.stop()
        row["delivery_ms"] = stats(delivered.delivery_ms)
    log(json.dumps(row))
    result["paths"].append(row)
    base, hopped = result["paths"]
    result["ratio_late_p99"] = round(hopped["late_ms"]["p99"] / max(base["late_ms"]["p99"], 1e-9), 3)
    result["ratio_concealed"] = round(hopped["concealed_frames"] / max(base["concealed_frames"], 1), 3)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_cli(__doc__, "path", main_async, argv)

if __name__ == "__main__":
    main()
