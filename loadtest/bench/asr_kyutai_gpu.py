"""GPU streaming ASR stage (``--asr kyutai``): the Kyutai STT architecture at the kyutai/stt-1b-en_fr shape.

**Random-init weights** (real architecture and cost; transcripts are noise): 16-layer LM (hidden 2048,
750-frame attention window) in bfloat16, Mimi encoder (32 codebooks) in float32 without TF32; no network,
nothing downloaded. One step = one 80 ms frame for every active stream (encoder + LM + greedy token), a
CUDA graph per (batch, LM-length) bucket.

Prints JSON (also to ``--json``):
- ``check``: CUDA graphs vs eager on the same streams (3 streams joining at different frames, 16 frames):
  the fraction of equal tokens and codes;
- ``steps``: per batch size (default 1/64/256/800) the host-measured step time (upload, replay, download,
  sync) p50/p95 for fresh streams (LM reads <= 64 positions) and for streams past the whole window (LM
  reads 750 positions, the worst case), with CUDA graphs and eager, and an eager encoder/LM split;
- ``realtime_streams``: the largest batch whose worst-case p95 step stays under 80 ms (every stream then
  keeps up with real time);
- ``direct`` (``--direct N``): N streams stepped back to back through the backend (no worker, no real-time
  pacing), ends spread over one utterance, catch-up off and on alternated ``--repeats`` times: END_OF_INPUT
  -> final in worker steps and in wall time of the steps, and the fraction of tokens equal off vs on;
- ``e2e`` (``--e2e N``): N streams through a real ``StageWorker``, each pushing 80 ms of audio every 80 ms
  for ``--utterance-s``; latency of the first partial, and from END_OF_INPUT to the final transcript (ms
  and worker steps), with the reference's flush (delay + 1 s of silence) and a shorter one (``--flush-s``),
  each with catch-up off and on (``--catchup-steps``: sub-steps per worker step, 0 = off), for two
  arrival patterns (``--arrivals``): ``staggered`` (N sessions talking turn after turn, their ends spread
  evenly: ~N / utterance frames turns end per step) and ``aligned`` (all N end in the same step: then
  the flush is N x frames of work whatever the batching, a throughput bound); worker step p50/p95/max.

    python3 -m loadtest.bench.asr_kyutai_gpu --json asr.json              # on a CUDA machine
    python3 -m loadtest.bench.asr_kyutai_gpu --config tiny --device cpu --batches 1 4 --steps 3 --e2e 2  # dry run
    python3 -m loadtest.bench.asr_kyutai_gpu --batches --e2e 256 --flush-s 0.56  # e2e rows only
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

try:
    import soxr  # noqa: F401
except ImportError:  # a bare GPU machine: 24 kHz input is never resampled, the import only
    import types

    sys.modules["soxr"] = types.ModuleType("soxr")

from realtime_gw.models.runtime import StageWorker
from realtime_gw.models.speech.asr_kyutai import KyutaiAsrBackend
from realtime_gw.models.speech.kyutai.checkpoint import random_checkpoint
from realtime_gw.models.speech.kyutai.engine import KyutaiAsrEngine
from realtime_gw.records.voice import AsrStreamRequest
from tests.models.speech.kyutai_streams import Turn, drive

ROOT = Path(__file__).resolve().parents[2]

FRAME = 1920
FRAME_S = 0.08


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if xs else float("nan")


def ms(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(1e3 * pct(xs, 50), 3), "p95_ms": round(1e3 * pct(xs, 95), 3)}


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def noise(n: int, frames: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, frames, FRAME)) * 3000).astype(np.int16)


def graph_vs_eager(model: Any) -> dict[str, Any]:
    """Same three streams (joining at frames 0, 2, 5) with and without CUDA graphs: same tokens and codes."""
    audio = noise(3, 16, seed=1)
    runs = []
    for graphs in (False, True):
        eng = KyutaiAsrEngine(model, 4, cuda_graphs=graphs)
        slots: dict[int, int] = {}
        toks, codes = [], []
        for t in range(16):
            for i, start in enumerate((0, 2, 5)):
                if t == start:
                    slots[i] = eng.alloc()
            live = sorted(slots)
            tok, c = eng.step([slots[i] for i in live], np.stack([audio[i, t - (0, 2, 5)[i]] for i in live]))
            toks.append(tok.copy())
            codes.append(c.copy())
        runs.append((np.concatenate(toks), np.concatenate(codes)))
        del eng
    (t0, c0), (t1, c1) = runs
    return {
        "graph_equals_eager_tokens_frac": float((t0 == t1).mean()),
        "graph_equals_eager_codes_frac": float((c0 == c1).mean()),
    }


def _fill_window(eng: KyutaiAsrEngine, b: int, start: int = 10_000) -> None:
    """Make slots [0, b) look like streams past the whole LM window (every ring column a valid key)."""
    lm = eng.lm
    with torch.no_grad():
        cols = torch.arange(lm.ring, device=lm.device)
        pos = start - 1 - ((start - 1 - cols) % lm.ring)  # the latest position stored in each column
        lm.kpos[:b, : lm.ring] = pos
        lm.pos[:b] = start
    for s in range(b):
        eng.frames[s] = start


def time_steps(eng: KyutaiAsrEngine, slots: list[int], pcm: np.ndarray, steps: int) -> list[float]:
    out = []
    for i in range(steps):
        t = time.perf_counter()
        eng.step(slots, pcm[:, i % pcm.shape[1]])
        out.append(time.perf_counter() - t)
    return out


def split_eager(eng: KyutaiAsrEngine, b: int, pcm: np.ndarray, reps: int) -> dict[str, float]:
    """Eager encoder and LM times (synchronized) at batch ``b``, LM over its whole window."""
    dev = eng.device
    active = torch.ones(b, dtype=torch.bool, device=dev)
    x = torch.from_numpy(pcm[:, 0]).to(dev).float() / 32768
    enc, lm = [], []
    with torch.no_grad():
        for _ in range(reps):
            sync(dev)
            t = time.perf_counter()
            codes = eng.encoder.step(b, x, active)
            sync(dev)
            enc.append(time.perf_counter() - t)
            t = time.perf_counter()
            eng.lm.step(b, eng.lm.ring, codes, active)
            sync(dev)
            lm.append(time.perf_counter() - t)
    return {
        "encoder_p50_ms": round(1e3 * pct(enc, 50), 3),
        "lm_full_window_p50_ms": round(1e3 * pct(lm, 50), 3),
    }


def bench_batches(eng: KyutaiAsrEngine, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for b in args.batches:
        slots = [eng.alloc() for _ in range(b)]  # lowest first: [0, b), one batch bucket
        pcm = noise(b, 4, seed=b)
        row: dict[str, Any] = {"batch": b}
        time_steps(eng, slots, pcm, 2)  # graphs for this bucket captured (if not yet), caches warm
        row["fresh"] = ms(time_steps(eng, slots, pcm, args.steps))
        _fill_window(eng, b)
        time_steps(eng, slots, pcm, 2)
        row["full_window"] = ms(time_steps(eng, slots, pcm, args.steps))
        if eng.use_graphs:
            eng.use_graphs = False
            row["full_window_eager"] = ms(time_steps(eng, slots, pcm, max(3, args.steps // 4)))
            eng.use_graphs = True
        row.update(split_eager(eng, b, pcm, 3))
        row["realtime"] = row["full_window"]["p95_ms"] < 1e3 * FRAME_S
        for s in slots:
            eng.free(s)
        log(f"batch {b}: {json.dumps(row)}")
        rows.append(row)
    return rows


def catchup_direct(ck: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--direct N`` streams stepped back to back through the backend (no worker, no real-time pacing), all
    opened at once with utterances of 1x to 2x ``--utterance-s`` so that their ends spread over one
    utterance; each flush (``--flush-s``) with catch-up off and on, alternated ``--repeats`` times. Per
    ending stream: worker steps and wall time (of the steps themselves) from END_OF_INPUT to the final;
    the first repeat's tokens compared between off and on."""
    n = args.direct
    frames = max(1, int(args.utterance_s / FRAME_S))
    audio = noise(n, 2 * frames, seed=3)
    lengths = [frames + i * frames // n for i in range(n)]
    budget = args.catchup_budget_ms / 1e3 if args.catchup_budget_ms > 0 else None
    backend = KyutaiAsrBackend(checkpoint=ck, slots=n, catchup_budget_s=budget)
    backend.warmup()
    rows = []
    for flush_s in args.flush_s:
        backend.set_flush(flush_s)
        runs: dict[int, dict[str, Any]] = {}
        for _ in range(args.repeats):
            for substeps in args.catchup_steps:
                backend.catchup_steps = substeps
                sub0 = backend.substeps
                turns = [Turn(audio[i, : lengths[i]].reshape(-1)) for i in range(n)]
                drive(backend, turns, max_steps=10 * frames + 1000)
                r = runs.setdefault(substeps, {"steps": [], "s": [], "substeps": 0, "tokens": None})
                r["steps"] += [t.final_step - t.end_step + 1 for t in turns]  # type: ignore[operator]
                r["s"] += [t.end_to_final_s for t in turns]
                r["substeps"] += backend.substeps - sub0
                r["tokens"] = r["tokens"] or [t.tokens for t in turns]
        base = runs[args.catchup_steps[0]]["tokens"]
        for substeps, r in runs.items():
            pairs = [
                (a, b) for x, y in zip(base, r["tokens"], strict=True) for a, b in zip(x, y, strict=False)
            ]
            row = {
                "flush_s": round(backend.flush_samples / 24000, 3),
                "flush_frames": (backend.flush_samples + FRAME - 1) // FRAME,
                "streams": n,
                "catchup_steps": substeps,
                "repeats": args.repeats,
                "steps_end_to_final": {"p50": pct(r["steps"], 50), "p95": pct(r["steps"], 95)},
                "end_to_final": ms(r["s"]),
                "catchup_substeps": r["substeps"],
                "tokens_equal_first_frac": sum(a == b for a, b in pairs) / max(1, len(pairs)),
                "same_lengths": [len(x) for x in base] == [len(y) for y in r["tokens"]],
            }
            log(f"direct {json.dumps(row)}")
            rows.append(row)
    del backend  # its slots' memory, before the step rows' 800 slots
    gc.collect()
    if ck.model.device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


class TimedBackend:
    """The backend as the worker sees it, with each ``step``'s duration recorded."""

    def __init__(self, backend: KyutaiAsrBackend) -> None:
        self.backend = backend
        self.step_s: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def step(self, work: list[Any]) -> list[Any]:
        t = time.perf_counter()
        try:
            return self.backend.step(work)
        finally:
            self.step_s.append(time.perf_counter() - t)


async def e2e(
    backend: KyutaiAsrBackend, n: int, utterance_s: float, arrivals: str, turns: int
) -> dict[str, Any]:
    """N sessions, 80 ms of audio every 80 ms each, then END_OF_INPUT (the user stopped). ``aligned``: one
    turn each, all ending together; ``staggered``: ``turns`` turns each back to back, session i's first
    turn cut to (i + 1) / N of an utterance so that ends are spread evenly."""
    slots = backend.engine.slots
    timed = TimedBackend(backend)
    worker = StageWorker(timed, device=str(backend.engine.device), max_batch=slots, max_active=slots,
                         max_backlog=4096)  # fmt: skip
    await worker.start(warmup=False)
    frames = max(1, int(utterance_s / FRAME_S))
    audio = noise(n, frames, seed=7)
    first_partial: list[float] = []
    final: list[float] = []
    final_steps: list[int] = []
    substeps0 = backend.substeps

    async def turn(i: int, length: int) -> None:
        s = worker.submit(AsrStreamRequest(sample_rate=24000))
        t0 = time.perf_counter()
        first_partial_seen, stopped, stopped_step = [False], [0.0], [0]

        async def read() -> None:
            async for r in s:
                if not r.final and not first_partial_seen[0]:
                    first_partial_seen[0] = True
                    first_partial.append(time.perf_counter() - t0)
                if r.final:
                    final.append(time.perf_counter() - stopped[0])
                    final_steps.append(len(timed.step_s) - stopped_step[0])

        reader = asyncio.create_task(read())
        for f in range(length):
            s.push(audio[i, f].tobytes())
            await asyncio.sleep(max(0.0, t0 + (f + 1) * FRAME_S - time.perf_counter()))
        stopped[0], stopped_step[0] = time.perf_counter(), len(timed.step_s)
        s.close_input()
        await reader

    async def session(i: int) -> None:
        if arrivals == "aligned":
            await turn(i, frames)
            return
        await turn(i, max(1, round(frames * (i + 1) / n)))
        for _ in range(turns - 1):
            await turn(i, frames)

    t_start = time.perf_counter()
    try:
        await asyncio.gather(*(session(i) for i in range(n)))
    finally:
        await worker.stop()
    wall = time.perf_counter() - t_start
    return {
        "arrivals": arrivals,
        "streams": n,
        "utterance_s": frames * FRAME_S,
        "flush_frames": (backend.flush_samples + FRAME - 1) // FRAME,
        "catchup_steps": backend.catchup_steps,
        "first_partial_from_start": ms(first_partial),  # random init: text shows when a byte id is drawn
        "final_after_end_of_input": ms(final),
        "final_after_end_of_input_max_ms": round(1e3 * max(final), 3) if final else None,
        "worker_steps_end_to_final": {"p50": pct(final_steps, 50), "p95": pct(final_steps, 95)},
        "worker_step": {
            **ms(timed.step_s),
            "max_ms": round(1e3 * max(timed.step_s), 3) if timed.step_s else None,
        },
        "catchup_substeps": backend.substeps - substeps0,
        "finals": len(final),
        "wall_s": round(wall, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="1b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", type=int, nargs="*", default=[1, 64, 256, 800], help="none: no step rows")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--e2e", type=int, nargs="*", default=[64, 256])
    p.add_argument("--utterance-s", type=float, default=3.0)
    p.add_argument(
        "--flush-s",
        type=lambda v: None if v.lower() in ("none", "ref") else float(v),
        nargs="*",
        default=[None, 0.56],
        help="e2e: silence run after each turn (none = the reference's delay + 1 s)",
    )
    p.add_argument(
        "--catchup-steps",
        type=int,
        nargs="+",
        default=[0, 7],
        help="e2e: catch-up sub-steps per worker step to compare (0 = off)",
    )
    p.add_argument("--catchup-budget-ms", type=float, default=50.0, help="0 = no time bound")
    p.add_argument(
        "--arrivals", nargs="+", default=["staggered", "aligned"], choices=["staggered", "aligned"]
    )
    p.add_argument("--turns", type=int, default=3, help="e2e staggered: turns per session")
    p.add_argument("--direct", type=int, default=256, help="streams stepped directly (0 = none)")
    p.add_argument("--repeats", type=int, default=3, help="--direct: off/on alternations")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    dev = torch.device(args.device)
    import transformers

    out: dict[str, Any] = {
        "hardware": (
            torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
        ),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "config": args.config,
        "weights": "random init (real architecture and cost; transcripts are noise)",
    }
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    t = time.perf_counter()
    ck = random_checkpoint(args.config, args.device, dtype)
    out["load_s"] = round(time.perf_counter() - t, 1)
    cfg = ck.model.config
    out["model"] = (f"LM {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, window {cfg.sliding_window}, "
                    f"{sum(q.numel() for q in ck.model.model.parameters()) / 1e9:.2f} B params; Mimi encoder "
                    f"{cfg.codec_config.num_hidden_layers}-layer transformer, {cfg.num_codebooks} codebooks")  # fmt: skip
    log(out["model"])
    try:
        if dev.type == "cuda":
            out["check"] = graph_vs_eager(ck.model)
            log(f"check {out['check']}")
        if args.direct:
            out["direct"] = catchup_direct(ck, args)
        if args.batches:
            bench_step_rows(ck, args, out, dev)
        if args.e2e:
            bench_e2e(ck, args, out)
    except Exception as e:  # report what was measured, and why it stopped
        traceback.print_exc()
        out["error"] = f"{type(e).__name__}: {e}"
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


def bench_step_rows(ck: Any, args: argparse.Namespace, out: dict[str, Any], dev: torch.device) -> None:
    eng = KyutaiAsrEngine(ck.model, max(args.batches))
    out["slots"] = eng.slots
    out["cuda_graphs"] = eng.use_graphs  # "fresh" and "full_window" are measured with them when on
    out["capture_all_s"] = round(eng.capture_all(), 1)
    out["graphs"] = eng.graph_count
    out["steps"] = bench_batches(eng, args)
    rt = [r["batch"] for r in out["steps"] if r["realtime"]]
    out["realtime_streams"] = max(rt) if rt else 0
    if dev.type == "cuda":
        out["max_memory_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 1)
    del eng


def bench_e2e(ck: Any, args: argparse.Namespace, out: dict[str, Any]) -> None:
    budget = args.catchup_budget_ms / 1e3 if args.catchup_budget_ms > 0 else None
    backend = KyutaiAsrBackend(checkpoint=ck, slots=max(args.e2e), catchup_budget_s=budget)
    t = time.perf_counter()
    backend.warmup()
    out["e2e_warmup_s"] = round(time.perf_counter() - t, 1)
    out["e2e_catchup_budget_ms"] = args.catchup_budget_ms
    out["e2e"] = []
    for flush_s in args.flush_s:
        backend.set_flush(flush_s)
        for n in args.e2e:
            for arrivals in args.arrivals:
                for substeps in args.catchup_steps:
                    backend.catchup_steps = substeps
                    r = {
                        "flush_s": round(backend.flush_samples / 24000, 3),
                        **asyncio.run(e2e(backend, n, args.utterance_s, arrivals, args.turns)),
                    }
                    log(f"e2e {json.dumps(r)}")
                    out["e2e"].append(r)


if __name__ == "__main__":
    main()
