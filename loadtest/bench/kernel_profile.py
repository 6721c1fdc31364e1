"""For the GPU probes and benches: one call's CUDA kernels under ``torch.profiler`` (count, summed time,
time by kind: GEMM, attention, copies, the rest; the top kernels by summed time), and the median time of
a CUDA-graph replay."""

from __future__ import annotations

from statistics import median
from typing import Any

import torch

from realtime_gw.models.fused.tuning import replay_ms

KINDS = (
    ("attention", ("fmha", "flash", "attention", "cudnn", "sdpa", "efficient")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "sm90", "cublas")),
    ("conv", ("conv", "implicit", "winograd", "fft")),
    ("copy", ("copy", "cat", "index", "fill", "memcpy", "memset")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "elementwise/norm"


def graph_ms(fn: Any, reps: int = 20, warmup_runs: int = 1) -> float:
    """Median ms of one CUDA-graph replay of ``fn`` (captured after ``warmup_runs`` plain calls)."""
    from realtime_gw.models.kernels import GraphCapture

    return replay_ms(GraphCapture("cuda").capture(fn, warmup_runs=warmup_runs), reps, median)


def kernels(fn: Any, top: int = 12) -> dict[str, Any]:
    """Profile one call of ``fn`` (after one unprofiled call)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_kind: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for e in evs:
        ms = e.device_time / 1000
        by_kind[kind_of(e.name)] = by_kind.get(kind_of(e.name), 0.0) + ms
        by_name.setdefault(e.name, []).append(ms)
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "kernels": len(evs),
        "kernel_ms": round(sum(by_kind.values()), 3),
        "by_kind_ms": {k: round(v, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top": [(n[:90], len(ts), round(sum(ts), 3)) for n, ts in ranked],
    }
