"""What a load level did inside the gateway, from two scrapes of its ``/metrics`` (before and after) and
the GPU's utilization sampled meanwhile: the 80 ms deadline misses per stage, step wall vs CPU time,
the device clock's waits, the event loop's lag and the gateway process's CPU.

Together they tell a device-bound gateway from a host-bound one: on a device-bound one the stages' steps
fill the wall time (``device_busy`` near 1 with the clock on, GPU utilization high) while the event loop
stays prompt; on one bound by its own Python (one process, one GIL for the event loop and every stage's
host work) the event loop lags, the process uses about one core (``gateway_cpu_cores``), a step's
thread CPU time is most of its wall time, and the GPU idles between steps.
"""

from __future__ import annotations

import subprocess
import threading
from typing import Any

import httpx

Labels = tuple[tuple[str, str], ...]
Sample = dict[tuple[str, Labels], float]

STEP = "realtime_gw_worker_step_seconds"
STEP_CPU = "realtime_gw_worker_step_cpu_seconds"
CLOCK_WAIT = "realtime_gw_device_clock_wait_seconds"
CLOCK_HANDOFF = "realtime_gw_device_clock_handoff_seconds"
LOOP_LAG = "realtime_gw_event_loop_lag_seconds"
FRAMES = "realtime_gw_stage_frames_total"
MISSES = "realtime_gw_stage_deadline_misses_total"
PROCESS_CPU = "process_cpu_seconds_total"


def parse(text: str) -> Sample:
    """Prometheus text format -> {(name, sorted labels): value} (comments skipped)."""
    out: Sample = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, value = line.rsplit(" ", 1)
        name, labels = key, ()
        if "{" in key:
            name, rest = key.split("{", 1)
            pairs = [kv.split("=", 1) for kv in rest.rstrip("}").split(",") if "=" in kv]
            labels = tuple(sorted((k, v.strip('"')) for k, v in pairs))
        out[(name, labels)] = float(value)
    return out


def scrape(port: int) -> Sample:
    return parse(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)


def delta(before: Sample, after: Sample) -> Sample:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def by_label(sample: Sample, name: str, label: str) -> dict[str, float]:
    """``name``'s values summed per value of ``label``."""
    out: dict[str, float] = {}
    for (n, labels), v in sample.items():
        if n == name:
            key = dict(labels).get(label, "")
            out[key] = out.get(key, 0.0) + v
    return out


def histograms(sample: Sample, name: str, label: str | None) -> dict[str, dict[float, float]]:
    """{value of ``label`` (or "" for all): {bucket bound: cumulative count}} of a histogram."""
    out: dict[str, dict[float, float]] = {}
    for (n, labels), v in sample.items():
        if n != name + "_bucket":
            continue
        d = dict(labels)
        le = float("inf") if d["le"] == "+Inf" else float(d["le"])
        buckets = out.setdefault(d.get(label, "") if label else "", {})
        buckets[le] = buckets.get(le, 0.0) + v
    return out


def bucket_quantile(cum: dict[float, float], q: float) -> float | None:
    """Prometheus-style quantile (linear inside the bucket) in ms."""
    bounds = sorted(cum)
    total = cum[bounds[-1]] if bounds else 0
    if total <= 0:
        return None
    rank, prev_b, prev_c = q * total, 0.0, 0.0
    for b in bounds:
        if cum[b] >= rank:
            if b == float("inf"):
                return round(prev_b * 1000, 2)
            frac = (rank - prev_c) / max(cum[b] - prev_c, 1e-9)
            return round((prev_b + (b - prev_b) * frac) * 1000, 2)
        prev_b, prev_c = b, cum[b]
    return None


def _quantiles(cum: dict[float, float], *qs: float) -> dict[str, float | None]:
    return {f"p{round(q * 100)}_ms": bucket_quantile(cum, q) for q in qs}


def summarize(before: Sample, after: Sample, wall_s: float) -> dict[str, Any]:
    """The level's figures (see the module's docstring)."""
    d = delta(before, after)
    steps: dict[str, Any] = {}
    cpu = histograms(d, STEP_CPU, "worker")
    wall_sums = by_label(d, STEP + "_sum", "worker")
    cpu_sums = by_label(d, STEP_CPU + "_sum", "worker")
    for worker, cum in histograms(d, STEP, "worker").items():
        count = cum.get(float("inf"), 0.0)
        if count:
            steps[worker] = {
                "steps": int(count),
                **_quantiles(cum, 0.5, 0.95),
                "cpu_p50_ms": bucket_quantile(cpu.get(worker, {}), 0.5),
                "busy": round(wall_sums.get(worker, 0.0) / wall_s, 3),
                "cpu_over_wall": round(cpu_sums.get(worker, 0.0) / max(wall_sums.get(worker, 0.0), 1e-9), 3),
            }
    frames, misses = by_label(d, FRAMES, "stage"), by_label(d, MISSES, "stage")
    deadlines = {
        stage: {
            "frames": int(n),
            "missed": int(misses.get(stage, 0)),
            "miss_rate": round(misses.get(stage, 0) / n, 5),
        }
        for stage, n in frames.items()
        if n
    }
    total_frames = sum(frames.values())
    waits = {stage: _quantiles(cum, 0.5, 0.95) for stage, cum in histograms(d, CLOCK_WAIT, "stage").items()}
    lag = histograms(d, LOOP_LAG, None).get("", {})
    cpu_s = sum(v for (n, _), v in d.items() if n == PROCESS_CPU)
    return {
        "steps": steps,
        "deadlines": deadlines,
        "deadline_miss_rate": round(sum(misses.values()) / total_frames, 5) if total_frames else None,
        "clock_wait": waits,
        "clock_handoff": {
            dev: _quantiles(cum, 0.5, 0.95) for dev, cum in histograms(d, CLOCK_HANDOFF, "device").items()
        },
        "event_loop_lag": _quantiles(lag, 0.5, 0.95, 0.99),
        "gateway_cpu_cores": round(cpu_s / wall_s, 2),
        "device_busy": round(sum(wall_sums.values()) / wall_s, 3),
    }


class GpuSampler:
    """``nvidia-smi``'s GPU utilization (% of time a kernel ran), sampled every ``period_s`` on a thread
    while in the ``with`` block; ``mean`` is None where there is no nvidia-smi."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.period_s = period_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                ).stdout.split()
            except (OSError, subprocess.TimeoutExpired):
                return
            if not out:
                return
            self.samples.append(float(out[0]))

    @property
    def mean(self) -> float | None:
        return round(sum(self.samples) / len(self.samples), 1) if self.samples else None
