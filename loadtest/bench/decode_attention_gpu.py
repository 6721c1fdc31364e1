"""Decode attention on the GPU: the Triton kernel (``fused.attention.decode``) against the two GEMMs it
replaces in ``kernels.attend``, and the Moshi 7B step with the ring K/V in bf16 and in FP8.

One command, in this order, each phase only while ``--budget-s`` lasts (JSON written as rows come):
- ``parity``: at the 7B shape (32 heads of 128, ``--keys`` keys, masks with holes, per-row visible
  counts), kernel vs the GEMMs in bf16 (max abs diff), FP8 kernel vs the GEMMs on the same dequantized
  K/V, and vs bf16 K/V (relative L2, e4m3's error); then a 4-slot 7B engine at full context, greedy,
  kernel vs GEMMs and FP8 vs bf16: the fraction of equal tokens over a few steps (random weights:
  informative, not a pass/fail);
- ``attention``: one layer's attention at batch ``--attn-batches`` x ``--keys``, GEMMs vs the kernel
  (bf16) vs the kernel (FP8): ms per call (CUDA events) and the K/V bytes it reads per second;
- ``steps``: the Moshi step (``MoshiEngine``, CUDA graphs, published sampling) at the full context for
  each ``--kv-dtype`` (``bf16``, ``fp8``) with the kernel, then bf16 with the GEMMs at
  ``--baseline-batches``: p50/p99/max per batch; a batch whose ring K/V cannot fit the GPU is skipped
  (said so); the largest batch with p99 <= 80 ms and <= 40 ms per variant;
- ``tiles``: the kernel's launch shapes (keys a step, warps, stages) at batch 32, bf16 and FP8.

    python3 -m loadtest.bench.decode_attention_gpu --json $OUT/decode_attention.json --budget-s 540
    python3 -m loadtest.bench.decode_attention_gpu --device cpu --config tiny --keys 40 \\
        --attn-batches 1 2 --batches 1 2 --baseline-batches 1 --steps 2 --tiles-sweep 2   # dry run
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import platform
import sys
import time
import traceback
from typing import Any

import numpy as np
import torch

from loadtest.bench import s2s_gpu
from realtime_gw.models import kernels
from realtime_gw.models.fp8 import FP8, ScaledKv
from realtime_gw.models.fused.attention import DECODE_TILES
from realtime_gw.models.kernels import KeyMask, additive_mask, attend, write_columns
from realtime_gw.models.s2s.checkpoint import random_checkpoint
from realtime_gw.models.s2s.engine import MoshiEngine

SWEEP = (
    (32, 4, 3, 4), (64, 4, 2, 4), (64, 4, 4, 4), (128, 4, 2, 4), (128, 8, 3, 4), (64, 8, 3, 4), (32, 4, 4, 4),
    (64, 4, 3, 8), (64, 4, 3, 16), (32, 4, 3, 8), (64, 4, 2, 8),
)  # fmt: skip
"""Launch shapes tried after the shipped one: (keys a step, warps, stages, programs per SM the splits aim for)."""
RESERVE_GIB = 8.0
"""GPU memory kept for activations, CUDA graphs, Mimi and the allocator when sizing the slots."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def timed_ms(fn: Any, device: str, reps: int) -> float:
    """Median ms of ``fn`` (CUDA events on a GPU; wall clock on the CPU)."""
    fn()
    sync(device)
    out = []
    for _ in range(reps):
        if device.startswith("cuda"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append(1e3 * (time.perf_counter() - t))
    return float(np.median(out))


def attention_case(b: int, heads: int, d: int, keys: int, device: str, dtype: torch.dtype, seed: int = 0) -> dict[str, Any]:
    """q ``(b, 1, heads, d)``, K/V as a ring's column slices, an additive ring mask with one hole per
    row and a young row (row 1 sees its first ``keys // 5`` columns), FP8 copies of K/V."""
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(b, 1, heads, d, device=device, dtype=dtype, generator=g)
    kc = torch.randn(b, heads, keys + 2, d, device=device, dtype=dtype, generator=g)
    vc = torch.randn(b, heads, keys + 2, d, device=device, dtype=dtype, generator=g)
    k, v = kc[:, :, :keys], vc[:, :, :keys]
    visible = torch.full((b,), keys, dtype=torch.int32, device=device)
    if b > 1:
        visible[1] = max(1, keys // 5)
    keep = torch.arange(keys, device=device)[None, None, :] < visible[:, None, None]
    keep[:, :, keys // 2] = False  # the ring's one stale column
    mask = KeyMask(additive_mask(keep, heads, 1, dtype), visible)
    quant = []
    for x in (k, v):
        data = torch.empty(b, heads, keys, d, device=device, dtype=FP8)
        scale = torch.empty(b, heads, keys, device=device)
        idx = torch.arange(keys, device=device)[None, None, :, None].expand(b, heads, keys, d)
        write_columns(data, scale, idx, x)
        quant.append(ScaledKv(data, scale))
    return {"q": q, "k": k, "v": v, "mask": mask, "kq": quant[0], "vq": quant[1], "scale": d**-0.5}


def sig(x: float) -> float:
    """Three significant digits (a parity error of 1e-7 is not 0)."""
    return float(f"{x:.3g}")


def with_kernel(mode: str, fn: Any) -> Any:
    old = kernels.DECODE_KERNEL
    kernels.DECODE_KERNEL = mode  # type: ignore[assignment]
    try:
        return fn()
    finally:
        kernels.DECODE_KERNEL = old


def kernel_mode(device: str) -> str:
    """The kernel on a GPU; on the CPU (dry run) Triton's interpreter, when it is on."""
    return "auto" if device.startswith("cuda") else "always"


def parity(args: argparse.Namespace, ck: Any) -> dict[str, Any]:
    dev, dtype = args.device, args.dtype
    c = attention_case(4, args.attn_heads, args.attn_head_dim, args.keys, dev, dtype, seed=1)
    run = kernel_mode(dev)
    gemm = with_kernel("never", lambda: attend(c["q"], c["k"], c["v"], c["mask"], c["scale"]))
    kern = with_kernel(run, lambda: attend(c["q"], c["k"], c["v"], c["mask"], c["scale"]))
    gemm8 = with_kernel("never", lambda: attend(c["q"], c["kq"], c["vq"], c["mask"], c["scale"]))
    kern8 = with_kernel(run, lambda: attend(c["q"], c["kq"], c["vq"], c["mask"], c["scale"]))

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return sig(float((a.float() - b.float()).norm() / b.float().norm()))

    def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
        return sig(float((a.float() - b.float()).abs().max()))

    out: dict[str, Any] = {
        "kernel_vs_gemm": {"max_abs": max_abs(kern, gemm), "rel_l2": rel(kern, gemm)},
        "fp8_kernel_vs_gemm_on_dequantized": {"max_abs": max_abs(kern8, gemm8), "rel_l2": rel(kern8, gemm8)},
        "fp8_kernel_vs_bf16_kv": {"rel_l2": rel(kern8, gemm)},
    }  # fmt: skip
    c.clear()  # the GPU memory back before the engines
    out["engine_tokens"] = engine_tokens(args, ck)
    log(f"parity: {json.dumps(out)}")
    return out


def engine_tokens(args: argparse.Namespace, ck: Any, slots: int = 4, steps: int = 6) -> dict[str, float]:
    """Greedy tokens of ``slots`` full-context conversations (eager steps): kernel vs GEMMs, FP8 vs bf16."""
    pcm = s2s_gpu.noise(slots, steps, seed=3)

    def tokens(kv: torch.dtype | None, mode: str) -> np.ndarray:
        eng = MoshiEngine(ck.weights, ck.mimi, ck.shape, slots, text=s2s_gpu.GREEDY, audio=s2s_gpu.GREEDY,
                          cuda_graphs=False, kv_dtype=kv)  # fmt: skip
        live = [eng.alloc_seeded(s) for s in range(slots)]
        s2s_gpu.set_fill(eng, live, 10 * ck.shape.context)
        out = with_kernel(mode, lambda: [eng.step(live, pcm[:, t], [False] * slots)[0] for t in range(steps)])
        return np.concatenate(out)

    run = kernel_mode(args.device)
    base = tokens(None, "never")
    kern = tokens(None, run)
    fp8 = tokens(FP8, run)
    return {"kernel_vs_gemm_equal_frac": round(float((kern == base).mean()), 4),
            "fp8_vs_bf16_equal_frac": round(float((fp8 == kern).mean()), 4)}  # fmt: skip


def attention_bench(args: argparse.Namespace, ck: Any, deadline: float) -> list[dict[str, Any]]:
    rows = []
    run = kernel_mode(args.device)
    for b in args.attn_batches:
        if time.perf_counter() > deadline:
            log("time budget spent: skipping the remaining attention rows")
            break
        c = attention_case(b, args.attn_heads, args.attn_head_dim, args.keys, args.device, args.dtype)
        kv_bytes = 2 * c["k"].numel() * c["k"].element_size()
        row: dict[str, Any] = {"batch": b, "keys": args.keys, "heads": args.attn_heads, "head_dim": args.attn_head_dim}
        for name, mode, k, v, nbytes in (
            ("gemm_bf16", "never", c["k"], c["v"], kv_bytes),
            ("kernel_bf16", run, c["k"], c["v"], kv_bytes),
            ("kernel_fp8", run, c["kq"], c["vq"], kv_bytes // 2),
        ):
            ms = with_kernel(mode, lambda k=k, v=v, c=c: timed_ms(
                lambda: attend(c["q"], k, v, c["mask"], c["scale"]), args.device, args.reps))  # fmt: skip
            row[name] = {"ms": round(ms, 4), "tb_per_s": round(nbytes / ms / 1e9, 3),
                         "ms_x_32_layers": round(ms * 32, 3)}  # fmt: skip
        log(f"attention: {json.dumps(row)}")
        rows.append(row)
        c.clear()
    return rows


def slots_that_fit(args: argparse.Namespace, ck: Any, kv: torch.dtype | None, want: int) -> int:
    """How many slots' ring K/V fit the device beside the weights (all of ``want`` on the CPU)."""
    if not args.device.startswith("cuda"):
        return want
    s = ck.shape
    item = 1 if kv == FP8 else torch.finfo(args.dtype).bits // 8
    per_slot = s.num_layers * 2 * (s.context + 2) * s.dim * item
    if kv == FP8:
        per_slot += s.num_layers * 2 * (s.context + 2) * s.num_heads * 4
    free, _ = torch.cuda.mem_get_info(args.device)
    return max(0, min(want, int((free - RESERVE_GIB * 2**30) // per_slot)))


def step_grid(args: argparse.Namespace, ck: Any, deadline: float, result: dict[str, Any]) -> None:
    variants = [(name, "kernel", args.batches) for name in args.kv_dtype]
    variants.append(("bf16", "gemm", args.baseline_batches))
    result["steps"] = {}
    for name, attention, batches in variants:
        if not batches or time.perf_counter() > deadline:
            continue
        label = f"{name}_{attention}"
        kv = FP8 if name == "fp8" else None
        slots = slots_that_fit(args, ck, kv, max(batches))
        fit = [b for b in batches if b <= slots]
        skipped = [b for b in batches if b > slots]
        if skipped:
            log(f"{label}: batches {skipped} do not fit the GPU's memory (ring K/V); skipped")
        if not fit:
            result["steps"][label] = {"skipped_no_memory": skipped}
            continue
        text, audio = s2s_gpu.PUBLISHED
        eng = MoshiEngine(ck.weights, ck.mimi, ck.shape, max(fit), text=text, audio=audio,
                          cuda_graphs=args.device.startswith("cuda"), kv_dtype=kv)  # fmt: skip
        ns = argparse.Namespace(batches=fit, fills=[1.0], steps=args.steps)
        entry: dict[str, Any] = {"slots": max(fit), "batch_buckets": eng.batch_buckets, "skipped_no_memory": skipped}
        result["steps"][label] = entry
        mode = "never" if attention == "gemm" else kernel_mode(args.device)
        t = time.perf_counter()
        entry["rows"] = with_kernel(mode, lambda eng=eng, ns=ns, entry=entry: s2s_gpu.bench_steps(
            eng, ns, deadline, lambda rows: s2s_gpu.save({**result}, args.json)))  # fmt: skip
        entry["wall_s"] = round(time.perf_counter() - t, 1)
        entry["largest_batch"] = {"p99_le_80ms": s2s_gpu.largest(entry["rows"], 1.0, 80.0),
                                  "p99_le_40ms": s2s_gpu.largest(entry["rows"], 1.0, 40.0)}  # fmt: skip
        if args.device.startswith("cuda"):
            entry["max_memory_gib"] = round(torch.cuda.max_memory_allocated(args.device) / 2**30, 1)
            torch.cuda.reset_peak_memory_stats(args.device)
        log(f"steps {label}: {json.dumps(entry)}")
        s2s_gpu.save(result, args.json)
        del eng
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


def tiles_sweep(args: argparse.Namespace, ck: Any, deadline: float) -> list[dict[str, Any]]:
    from realtime_gw.models.fused import attention as fa

    c = attention_case(args.tiles_batch, args.attn_heads, args.attn_head_dim, args.keys, args.device, args.dtype)
    combos = [fa.DECODE_TILES, *(fa.Tiles(*c) for c in SWEEP if fa.Tiles(*c) != fa.DECODE_TILES)][: args.tiles_sweep]
    rows = []
    for tiles in combos:
        if time.perf_counter() > deadline:
            log("time budget spent: skipping the remaining tiles")
            break
        row: dict[str, Any] = {"batch": args.tiles_batch, **dataclasses.asdict(tiles)}
        for name, k, v in (("bf16", c["k"], c["v"]), ("fp8", c["kq"], c["vq"])):
            ks, vs = (k.scale, v.scale) if isinstance(k, ScaledKv) else (None, None)
            kd, vd = (k.data, v.data) if isinstance(k, ScaledKv) else (k, v)
            try:
                row[name + "_ms"] = round(timed_ms(lambda kd=kd, vd=vd, ks=ks, vs=vs, tiles=tiles: fa.decode(
                    c["q"], kd, vd, c["mask"].mask, c["scale"], visible=c["mask"].visible, k_scale=ks, v_scale=vs,
                    tiles=tiles), args.device, args.reps), 4)  # fmt: skip
            except Exception as e:  # a shape the compiler refuses (shared memory): say so, go on
                row[name + "_error"] = repr(e)[:200]
        log(f"tiles: {json.dumps(row)}")
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="7b", choices=["7b", "tiny"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--keys", type=int, default=3000, help="keys of the attention rows (the 7B's context)")
    p.add_argument("--attn-batches", type=int, nargs="*", default=[1, 16, 32, 64])
    p.add_argument("--attn-heads", type=int, default=32, help="attention rows' heads (the 7B's 32 of 128)")
    p.add_argument("--attn-head-dim", type=int, default=128)
    p.add_argument("--reps", type=int, default=20, help="timed calls per attention row")
    p.add_argument("--kv-dtype", nargs="*", default=["fp8", "bf16"], choices=["bf16", "fp8"])
    p.add_argument("--batches", type=int, nargs="*", default=[1, 16, 32, 48, 64, 80, 96])
    p.add_argument("--baseline-batches", type=int, nargs="*", default=[32, 64], help="bf16 steps with the GEMMs")
    p.add_argument("--steps", type=int, default=30, help="timed steps per batch")
    p.add_argument("--tiles-sweep", type=int, default=12, help="launch shapes tried at --tiles-batch (0: none)")
    p.add_argument("--tiles-batch", type=int, default=32)
    p.add_argument("--budget-s", type=float, default=540.0, help="stop starting rows after this")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    deadline = t0 + args.budget_s
    cuda = args.device.startswith("cuda")
    args.dtype = torch.bfloat16 if cuda else torch.float32
    result: dict[str, Any] = {
        "config": args.config, "device": args.device, "dtype": str(args.dtype).removeprefix("torch."),
        "weights": "random init", "torch": torch.__version__, "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(args.device) if cuda else platform.processor() or platform.machine(),
        "keys": args.keys, "decode_tiles": dataclasses.asdict(DECODE_TILES),
    }  # fmt: skip
    ck = random_checkpoint(args.config, args.device, args.dtype)
    log(f"weights ready in {time.perf_counter() - t0:.1f} s")
    phases = (
        ("parity", lambda: parity(args, ck)),
        ("attention", lambda: attention_bench(args, ck, deadline)),
        ("steps", lambda: step_grid(args, ck, deadline, result)),
        ("tiles", lambda: tiles_sweep(args, ck, deadline) if args.tiles_sweep else []),
    )
    for name, phase in phases:
        if time.perf_counter() > deadline:
            log(f"time budget spent: {name} skipped")
            continue
        try:
            out = phase()
            if out is not None:
                result[name] = out
        except Exception as e:  # the other phases still run
            result[name + "_error"] = repr(e)
            log(traceback.format_exc())
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        s2s_gpu.save(result, args.json)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, indent=1))
    s2s_gpu.save(result, args.json)
    return result


if __name__ == "__main__":
    main()
