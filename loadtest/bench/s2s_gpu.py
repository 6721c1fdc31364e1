"""GPU speech-to-speech stage (``--s2s moshi``): Moshi at the published 7B shape, every conversation one
batched 80 ms step.

**Random-init weights** (real architecture and cost; its speech and text are noise): the 32-layer temporal
transformer (dim 4096, 3000-frame ring KV per slot) and the 6-layer per-step depformer in bfloat16, the
Mimi encoder and decoder (8 codebooks) in float32; no network, nothing downloaded. One step = one frame
for every live conversation: Mimi encode, temporal transformer, text sample, 8 depformer sub-steps with
their samples, Mimi decode; a CUDA graph per (batch, KV-length) bucket.

Prints JSON (also to ``--json``):
- ``check``: on the device, CUDA graphs vs eager (three conversations joining at steps 0, 2, 5, greedy
  and sampled), and the tiny shape on the device vs on the CPU (greedy, float32): fractions of equal
  tokens (text + the model's codes) and the largest PCM difference;
- ``warmup``: the stage's warm-up as the gateway runs it (``MoshiBackend.warmup``: every (batch, length)
  bucket's CUDA graph captured, then a short conversation);
- ``steps``: per batch (``--batches``) x KV fill (``--fills``: the fraction of the 3000-frame context the
  conversations have seen; 1.0 = past the whole context, the ring full) the host-measured step time
  (upload, replay, download, sync) p50 / p99 / max;
- ``largest_batch``: the largest batch whose p99 step at the fullest fill stays <= 80 ms and <= 40 ms;
- ``session_start``: with ``batch - 1`` full-context conversations live, a new one opened: open + its
  first step (silence: the model's acoustic delay) and the second (its first voiced frame), in ms;
- ``cancel``: the silence switch (``S2sSilence``, response.cancel / barge-in) set between steps: time
  until the step that returns the forced-silent frame ends (one step: the next frame out is silent).

    python3 -m loadtest.bench.s2s_gpu --json s2s.json                                   # on a CUDA machine
    python3 -m loadtest.bench.s2s_gpu --json s2s_fp8.json --kv-dtype fp8                # the ring K/V in FP8
    python3 -m loadtest.bench.s2s_gpu --config tiny --device cpu --batches 1 2 --fills 0 1 --steps 3   # dry run
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from realtime_gw.models.s2s.backend import MoshiBackend
from realtime_gw.models.s2s.checkpoint import random_checkpoint
from realtime_gw.models.s2s.engine import MoshiEngine
from realtime_gw.models.s2s.sampling import Sampler

FRAME = 1920
FRAME_MS = 80.0
GREEDY = Sampler(0.0, 0)
PUBLISHED = (Sampler(0.7, 25), Sampler(0.8, 250))  # text, audio


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if xs else float("nan")


def stats(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(1e3 * pct(xs, 50), 3), "p99_ms": round(1e3 * pct(xs, 99), 3),
            "max_ms": round(1e3 * max(xs), 3) if xs else float("nan")}  # fmt: skip


def noise(n: int, frames: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, frames, FRAME)) * 3000).astype(np.int16)


def engine(ck: Any, slots: int, graphs: bool, sampled: bool) -> MoshiEngine:
    text, audio = PUBLISHED if sampled else (GREEDY, GREEDY)
    return MoshiEngine(ck.weights, ck.mimi, ck.shape, slots, text=text, audio=audio, cuda_graphs=graphs)


def joining_run(eng: MoshiEngine, steps: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Three conversations joining at steps 0, 2, 5: every frame's tokens and PCM, in order."""
    audio, starts = noise(3, steps, seed=1), (0, 2, 5)
    slots: dict[int, int] = {}
    toks, pcm = [], []
    for t in range(steps):
        for i, start in enumerate(starts):
            if t == start:
                slots[i] = eng.alloc_seeded(100 + i)
        live = sorted(slots)
        frame, _, out = eng.step([slots[i] for i in live], np.stack([audio[i, t - starts[i]] for i in live]),
                                 [False] * len(live))  # fmt: skip
        toks.append(frame.copy())
        pcm.append(out.astype(np.int32))
    for s in slots.values():
        eng.free(s)
    return np.concatenate(toks), np.concatenate(pcm)


def compare(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
    return {"tokens_equal_frac": round(float((a[0] == b[0]).mean()), 4),
            "pcm_max_abs_diff": int(np.abs(a[1] - b[1]).max())}  # fmt: skip


def checks(ck: Any, device: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if device.startswith("cuda"):
        for sampled in (False, True):
            runs = [joining_run(engine(ck, 4, graphs, sampled)) for graphs in (False, True)]
            out["graph_vs_eager_" + ("sampled" if sampled else "greedy")] = compare(*runs)
            torch.cuda.empty_cache()
        tiny_dev = random_checkpoint("tiny", device, torch.float32)
        tiny_cpu = random_checkpoint("tiny", "cpu", torch.float32)
        # the same weights on both: random init draws on the device, so copy the device's to the CPU
        tiny_cpu.weights = {k: v.cpu() for k, v in tiny_dev.weights.items()}
        tiny_cpu.mimi.load_state_dict(tiny_dev.mimi.state_dict())
        out["tiny_cuda_graphs_vs_cpu_greedy"] = compare(
            joining_run(engine(tiny_dev, 4, True, False)), joining_run(engine(tiny_cpu, 4, False, False))
        )
    log(f"check: {json.dumps(out)}")
    return out


def set_fill(eng: MoshiEngine, slots: list[int], positions: int) -> None:
    """Make ``slots`` look like conversations ``positions`` frames in (every ring column up to there a key)."""
    ring = eng.lm.ring
    with torch.no_grad():
        idx = torch.as_tensor(slots, device=eng.device)
        if positions <= 0:
            eng.lm.reset(idx)
            for s in slots:
                eng.frames[s] = 0
            return
        cols = torch.arange(ring.ring, device=eng.device)
        pos = positions - 1 - ((positions - 1 - cols) % ring.ring)  # the latest position in each column
        ring.kpos[idx, : ring.ring] = torch.where(pos >= 0, pos, -1)
        ring.pos[idx] = positions
    for s in slots:
        eng.frames[s] = positions


def time_steps(eng: MoshiEngine, slots: list[int], pcm: np.ndarray, steps: int, silent: list[bool] | None = None) -> list[float]:
    out = []
    silent = silent or [False] * len(slots)
    for i in range(steps):
        t = time.perf_counter()
        eng.step(slots, pcm[:, i % pcm.shape[1]], silent)
        out.append(time.perf_counter() - t)
    return out


def save(result: dict[str, Any], path: str | None) -> None:
    """What is measured so far, written as it comes (a run cut short keeps its rows)."""
    if path:
        with open(path, "w") as f:
            f.write(json.dumps(result, indent=1))


def bench_steps(
    eng: MoshiEngine, args: argparse.Namespace, deadline: float, progress: Callable[[list[dict[str, Any]]], None]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    context = eng.shape.context
    for fill in sorted(args.fills, reverse=True):  # the full context first: the figure that matters most
        for b in args.batches:
            if time.perf_counter() > deadline:
                log("time budget spent: skipping the remaining cells")
                return rows
            slots = [eng.alloc_seeded(s) for s in range(b)]  # lowest first: [0, b), one batch bucket
            pcm = noise(b, 4, seed=b)
            positions = max(0, int(fill * context)) if fill < 1.0 else 10 * context
            set_fill(eng, slots, positions)
            time_steps(eng, slots, pcm, 2)  # caches warm (graphs were captured up front)
            row = {"batch": b, "fill": fill, **stats(time_steps(eng, slots, pcm, args.steps))}
            log(f"steps: {json.dumps(row)}")
            rows.append(row)
            progress(rows)
            for s in slots:
                eng.free(s)
    return rows


def largest(rows: list[dict[str, Any]], fill: float, limit_ms: float) -> int | None:
    ok = [r["batch"] for r in rows if r["fill"] == fill and r["p99_ms"] <= limit_ms]
    return max(ok) if ok else None


def session_start_and_cancel(eng: MoshiEngine, b: int, reps: int) -> dict[str, Any]:
    """``b - 1`` full-context conversations live; a new one opened (start), then a live one silenced (cancel)."""
    live = [eng.alloc_seeded(s) for s in range(b - 1)]
    set_fill(eng, live, 10 * eng.shape.context)
    pcm = noise(b, 2, seed=7)
    time_steps(eng, live, pcm[: len(live)], 2) if live else None
    first, voiced, cancel = [], [], []
    for r in range(reps):
        t = time.perf_counter()
        new = eng.alloc_seeded(1000 + r)
        eng.step([*live, new], pcm[:, 0], [False] * b)
        first.append(time.perf_counter() - t)
        eng.step([*live, new], pcm[:, 1], [False] * b)
        voiced.append(time.perf_counter() - t)
        t = time.perf_counter()  # the silence switch lands between steps; the next frame out is silent
        _, _, out = eng.step([*live, new], pcm[:, 0], [False] * (b - 1) + [True])
        cancel.append(time.perf_counter() - t)
        assert not out[-1].any(), "a silenced conversation's next frame is silence"
        eng.free(new)
    for s in live:
        eng.free(s)
    return {"batch": b, "first_frame": stats(first), "first_voiced_frame": stats(voiced),
            "cancel_to_last_audio": stats(cancel)}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="7b", choices=["7b", "tiny"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", type=int, nargs="*", default=[1, 8, 16, 32, 48, 64])
    p.add_argument("--fills", type=float, nargs="*", default=[0.0, 0.25, 0.5, 1.0])
    p.add_argument("--steps", type=int, default=30, help="timed steps per (batch, fill) cell")
    p.add_argument("--start-reps", type=int, default=5)
    p.add_argument("--budget-s", type=float, default=180.0, help="stop starting cells after this")
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--kv-dtype", default="model", choices=["model", "fp8"], help="the ring K/V (s2s_kv_dtype)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    deadline = t0 + args.budget_s
    cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    result: dict[str, Any] = {
        "config": args.config, "device": args.device, "dtype": str(dtype).removeprefix("torch."),
        "kv_dtype": args.kv_dtype,
        "weights": "random init", "torch": torch.__version__, "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(args.device) if cuda else platform.processor() or platform.machine(),
    }  # fmt: skip
    ck = random_checkpoint(args.config, args.device, dtype)
    log(f"weights ready in {time.perf_counter() - t0:.1f} s")
    if not args.no_check:
        try:
            result["check"] = checks(ck, args.device)
        except Exception as e:  # the timing rows still come
            result["check"] = {"error": repr(e)}
            log(traceback.format_exc())
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    save(result, args.json)
    slots = max([*args.batches, 1])
    # the stage as the gateway builds it (published sampling), warmed up as at start: every graph captured
    backend = MoshiBackend(config=args.config, device=args.device, slots=slots, checkpoint=ck, cuda_graphs=cuda,
                           kv_dtype=args.kv_dtype)  # fmt: skip
    backend.warmup()
    eng = backend.engine
    report = backend.warmup_report
    result["warmup"] = {k: report[k] for k in ("seconds", "graphs", "graph_capture_s", "frames")}
    log(f"warm-up: {json.dumps(result['warmup'])}")
    t = time.perf_counter()
    result["steps"] = bench_steps(eng, args, deadline, lambda rows: save({**result, "steps": rows}, args.json))
    result["steps_wall_s"] = round(time.perf_counter() - t, 1)
    full = max(args.fills) if args.fills else 1.0
    result["largest_batch"] = {"fill": full, "p99_le_80ms": largest(result["steps"], full, 80.0),
                               "p99_le_40ms": largest(result["steps"], full, 40.0)}  # fmt: skip
    if args.batches:
        result["session_start"] = session_start_and_cancel(eng, max(args.batches), args.start_reps)
    if cuda:
        result["max_memory_gib"] = round(torch.cuda.max_memory_allocated(args.device) / 2**30, 1)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, indent=1))
    save(result, args.json)
    return result


if __name__ == "__main__":
    main()
