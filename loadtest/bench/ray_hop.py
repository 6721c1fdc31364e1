"""The Ray hop: what serving a stage from a Ray actor (``remote_stages``) costs against in process.

1. Worker level, in this process: a worker in process and the same worker as a remote stage (one Ray
   actor), N concurrent streams per round: time to first audio (submit -> first frame in the stream)
   and, through the hop, each frame's delivery delay (the actor's step handed it over -> it is in the
   front-end's stream; in process that delay is nil by construction). Two workers: the registry's tone
   TTS (one stream's whole sentence per step: ~21 frames a message) and a stand-in for the GPU codec
   TTS (every stream advances one 80 ms frame per step, all streams in one step of ``STEP_S``: 64
   frames a message), the shape the hop was built for.
2. Gateway level: sessions sustained (tone TTS, p95 frame lateness <= 20 ms, no errors; the text-turn
   loop of ``loadtest/bench/realtime.py``) by one gateway in process, by one front-end whose TTS is the shared
   actor, and by two front-ends sharing that actor (sessions split between them).

With ``--tts codec`` the worker level runs the registry's codec TTS instead of the two stand-ins (full
shape by default, random init: real cost, noise audio), in process and in a Ray actor holding one GPU
(``ray_num_gpus`` 1 for a CUDA stage), 64 streams (its slots) per round; no gateway level.

    .venv/bin/python -m loadtest.bench.ray_hop            # full run (~4 min on 2 cores)
    .venv/bin/python -m loadtest.bench.ray_hop --quick    # smoke run
    .venv/bin/python -m loadtest.bench.ray_hop --tts codec --tts-device cuda   # the H200 row (~2 min)

Everything shares one machine (client, front-ends, Ray, the actor); compare rows of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from loadtest.bench.log import append_run
from loadtest.bench.realtime import Stats, hardware, pct, turns_load
from realtime_gw.config import GatewayConfig
from realtime_gw.models.contract import BackendInfo
from realtime_gw.models.registry import build_stage
from realtime_gw.models.remote.client import RemoteStage
from realtime_gw.models.remote.routing import stage_actors
from realtime_gw.models.runtime import StageWorker, StepResult
from realtime_gw.records.voice import FRAME_SAMPLES, TtsFrame, TtsRequest
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.server.ray_cluster import local_ray, start_front_ends, stop_front_ends

ROOT = Path(__file__).resolve().parents[2]

TEXT = "Please open the door for me. I would like a cup of coffee."
CONFIG = GatewayConfig(tts="tone", policy="none", remote_stages="tts", ray_num_cpus=0.5)
STEP_S = 0.010
"""The stand-in's step: about what one codec-TTS frame step for 64 streams takes on a GPU (its wait
releases the GIL, as a CUDA sync does)."""
FRAMES = 25


class FrameStepTts:
    """Every stream advances one 80 ms frame per step (``FRAMES`` of them), all streams in one step.
    Defined in the script, so Ray ships it to the actor by value."""

    name = "tts-frame-step"
    voices = ("tone",)

    def open(self, request: Any) -> list[int]:
        return [0]

    def step(self, work: list[tuple[list[int], list[Any]]]) -> list[StepResult]:
        time.sleep(STEP_S)
        frame = bytes(2 * FRAME_SAMPLES)
        results = []
        for made, _inputs in work:
            made[0] += 1
            results.append(StepResult(outputs=[TtsFrame(frame)], done=made[0] >= FRAMES))
        return results

    def release(self, state: list[int]) -> None:
        pass

    def has_work(self, state: list[int]) -> bool:
        return state[0] < FRAMES

    def warmup(self) -> None:
        pass

    def describe(self) -> BackendInfo:
        return BackendInfo(name=self.name, voices=self.voices)


def frame_step_stage(role: str, config: GatewayConfig) -> StageWorker:
    return StageWorker(FrameStepTts(), max_batch=64, max_active=256, max_backlog=25)


def tone_stage(role: str, config: GatewayConfig) -> StageWorker:
    return build_stage(role, config)


class Worker:
    def __init__(self) -> None:
        self.ttfa_ms: list[float] = []
        self.delivery_ms: list[float] = []
        """Per frame, through the hop only."""
        self.frames = 0


def gpu(device: str) -> str:
    if not device.startswith("cuda"):
        return "no GPU"
    import torch

    return f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}"


def codec_stage(role: str, config: GatewayConfig) -> StageWorker:
    return build_stage(role, config)


async def streams_round(stage: Any, n: int, out: Worker) -> None:
    async def one() -> None:
        t0 = time.perf_counter()
        stream = stage.submit(TtsRequest(voice=stage.describe().voices[0]))
        stream.push(TEXT)
        stream.close_input()
        first = None
        async for _ in stream:
            out.frames += 1
            if first is None:
                first = time.perf_counter() - t0
                out.ttfa_ms.append(first * 1000)

    await asyncio.gather(*(one() for _ in range(n)))


def record_delivery(out: Worker) -> Any:
    """Wrap the front-end's batch handler: each frame's delay from the actor's hand-over to here."""
    original = RemoteStage._apply  # in seq order, after the two polls are merged

    def recording(self: RemoteStage, replica: Any, batch: Any) -> None:
        now = time.time()
        for _sid, outputs, _done, _error, posted_at in batch.results:
            out.delivery_ms += [(now - posted_at) * 1000] * len(outputs)
        original(self, replica, batch)

    RemoteStage._apply = recording  # type: ignore[method-assign]
    return original


async def worker_level(
    build: Any, streams: int, rounds: int, base: GatewayConfig = CONFIG
) -> tuple[Worker, Worker]:
    local, remote = Worker(), Worker()
    in_process = build("tts", base)
    await in_process.start()
    config = msgspec.structs.replace(base, ray_namespace=f"bench-{build.__name__}")  # its own actor
    hop = RemoteStage("tts", stage_actors("tts", config, build))
    await hop.start()
    original = record_delivery(remote)
    try:
        for _ in range(2):  # warm both paths (Ray's first calls, the actor's first steps)
            await streams_round(in_process, streams, Worker())
            await streams_round(hop, streams, Worker())
        remote.delivery_ms.clear()
        for _ in range(rounds):  # interleaved: both see the same background load
            await streams_round(in_process, streams, local)
            await streams_round(hop, streams, remote)
    finally:
        RemoteStage._apply = original  # type: ignore[method-assign]
        await hop.stop()
        await in_process.stop()
    return local, remote


async def split_load(servers: list[LiveServer], sessions: int, seconds: float) -> Stats:
    """``sessions`` text-turn sessions spread over ``servers``; one merged ``Stats``."""
    shares = [sessions // len(servers) + (i < sessions % len(servers)) for i in range(len(servers))]
    parts = await asyncio.gather(*(turns_load(s, k, seconds) for s, k in zip(servers, shares, strict=True)))
    merged = Stats()
    for p in parts:
        merged.ttfa_ms += p.ttfa_ms
        merged.lateness_ms += p.lateness_ms
        merged.turns += p.turns
        merged.errors += p.errors
    return merged


async def sustained(
    label: str, servers: list[LiveServer], levels: list[int], seconds: float, out: Any
) -> int:
    best = 0
    for n in levels:
        # turns_load starts a session every 50 ms: the run lasts the ramp plus ``seconds`` of full load
        s = await split_load(servers, n, seconds + n * 0.05)
        late = pct(s.lateness_ms, 95)
        out(
            f"| {label} | {n} | {s.turns} | {pct(s.ttfa_ms, 50):.0f} | {pct(s.ttfa_ms, 95):.0f} | "
            f"{late:.1f} | {s.errors} |"
        )
        if late > 20.0 or s.errors:
            break
        best = n
    return best


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--worker-only", action="store_true", help="skip the gateway-level part")
    ap.add_argument(
        "--tts",
        choices=("stand-ins", "codec"),
        default="stand-ins",
        help="worker level: the tone TTS and the frame-per-step stand-in (CPU), or the codec TTS",
    )
    ap.add_argument("--tts-device", default="cpu", help="--tts codec: e.g. cuda")
    ap.add_argument("--tts-config", default=None, help="--tts codec: full (default on CUDA) or tiny")
    args = ap.parse_args()
    workers: list[tuple[str, Any, GatewayConfig]] = [
        ("tone, a sentence per step", tone_stage, CONFIG),
        ("frame per step, 10 ms", frame_step_stage, CONFIG),
    ]
    if args.tts == "codec":
        shape = args.tts_config or ("full" if args.tts_device.startswith("cuda") else "tiny")
        codec = msgspec.structs.replace(
            CONFIG, tts="codec", tts_device=args.tts_device, tts_config=shape, tts_max_batch=args.streams
        )
        workers = [(f"codec TTS ({shape}) on {args.tts_device}", codec_stage, codec)]
        args.worker_only = True
    rounds = 3 if args.quick else 15
    seconds = 5.0 if args.quick else 6.0
    levels = [16, 64] if args.quick else [16, 64, 128, 192, 256, 384]
    lines: list[str] = []

    def out(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    flags = (
        "--policy", "none", "--tts", "tone", "--max-sessions", "1024", "--cpu-backends-in-process",
        "--max-connections-per-client", "0",  # the load comes from one address
    )  # fmt: skip
    with local_ray() as address:
        out(
            f"Worker level: {args.streams} concurrent streams per round, {rounds} rounds each way, interleaved"
        )
        out("")
        out(
            "| worker | path | frames | TTFA p50 ms | TTFA p95 ms | delivery p50 ms | delivery p95 ms | "
            "delivery p99 ms | TTFA p95 added |"
        )
        out("|---|---|---|---|---|---|---|---|---|")
        for label, build, config in workers:
            local, remote = await worker_level(build, args.streams, rounds, config)
            added = pct(remote.ttfa_ms, 95) - pct(local.ttfa_ms, 95)
            ratio = pct(remote.ttfa_ms, 95) / max(pct(local.ttfa_ms, 95), 1e-9)
            out(
                f"| {label} | in process | {local.frames} | {pct(local.ttfa_ms, 50):.2f} | "
                f"{pct(local.ttfa_ms, 95):.2f} | 0 | 0 | 0 | |"
            )
            out(
                f"| {label} | Ray actor | {remote.frames} | {pct(remote.ttfa_ms, 50):.2f} | "
                f"{pct(remote.ttfa_ms, 95):.2f} | {pct(remote.delivery_ms, 50):.2f} | "
                f"{pct(remote.delivery_ms, 95):.2f} | {pct(remote.delivery_ms, 99):.2f} | "
                f"+{added:.2f} ms (x{ratio:.2f}) |"
            )
        if args.worker_only:
            return
        out("")
        out("| gateway | sessions | turns | TTFA p50 ms | TTFA p95 ms | lateness p95 ms | errors |")
        out("|---|---|---|---|---|---|---|")
        single = start_server(*flags, name="bench-ray-in-process")
        try:
            best_local = await sustained("in process", [single], levels, seconds, out)
        finally:
            stop_server(single)
        front_ends = start_front_ends(address, 1, *flags, "--remote-stages", "tts")
        try:
            best_one = await sustained("1 front-end + TTS actor", front_ends, levels, seconds, out)
            front_ends += start_front_ends(address, 1, *flags, "--remote-stages", "tts")
            best_two = await sustained("2 front-ends + TTS actor", front_ends, levels, seconds, out)
        finally:
            stop_front_ends(front_ends)
        out("")
        out(
            f"Sessions sustained (tone TTS, p95 lateness <= 20 ms, no errors): in process {best_local}, "
            f"1 front-end {best_one}, 2 front-ends {best_two} "
            f"(2 vs 1: x{best_two / max(best_one, 1):.2f}; 1 front-end vs in process: x{best_one / max(best_local, 1):.2f})"
        )

    if not args.no_write:
        append_run(
            f"\n## Ray hop: remote stage workers ({dt.date.today().isoformat()})\n\n"
            f"- Hardware: {hardware()}; {gpu(args.tts_device)}; a local Ray (no dashboard), the actor at"
            " 0.5 CPU\n"
            f"- Command: `.venv/bin/python {' '.join(sys.argv)}`\n"
            "- Worker level: streams submitted together (tone: two sentences, ~44 frames; the frame-per-step\n"
            "  stand-in: 25 frames); TTFA = submit ->\n"
            "  first frame in the stream; delivery = the actor's step handed the frame over -> it is in the\n"
            "  front-end's stream (wall clocks of one machine). Gateway level: `loadtest/bench/realtime.py`'s text-turn\n"
            "  loop; lateness = arrival after the frame's real-time playback slot. Client, front-ends, Ray and\n"
            "  the actor share the machine (and its 2 cores with whatever else runs).\n\n"
            + "\n".join(lines)
            + "\n"
        )


if __name__ == "__main__":
    asyncio.run(main())
