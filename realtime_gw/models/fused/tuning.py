"""Per-shape choices measured on the device: the fused kernels' tiles, and whether a fused path beats the
eager one at a batch bucket.

``Tuner.pick`` times a kernel's candidate configs the first time it sees a shape (a CUDA graph of a few
launches each, so the host's launch cost does not hide the kernel's) and keeps the fastest for that shape.
The first call of each shape happens in a stage's warm-up, before its CUDA graphs are captured (every
capture runs its body eagerly first); a shape first seen while a graph is being captured, inside an
autograd backward, on the CPU or under Triton's interpreter takes the first candidate, untimed (the
interpreter's is its one big tile).

``graph_ms`` times any body as a CUDA graph replay: what ``fastest`` uses to choose, per batch bucket,
between a fused and an eager path at warm-up.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import torch

log = logging.getLogger(__name__)

C = TypeVar("C")

TIMED_LAUNCHES = 8
"""Launches per candidate in the timed graph."""
TUNING = True
"""False: each kernel takes its first candidate, untimed (a fixed choice, as under the interpreter; the
bench's parity phases, which then compile less)."""


def measurable(device: torch.device) -> bool:
    """Whether timing can run now on ``device``: CUDA, not under the interpreter, not inside a capture,
    not inside an autograd backward (its engine's own thread: a shape first seen there, RTC's recomputed
    gate|up, takes its first candidate)."""
    from realtime_gw.models.fused import interpreted

    if device.type != "cuda" or interpreted() or torch.cuda.is_current_stream_capturing():
        return False
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is None or task() == -1


def graph_ms(body: Callable[[], object], launches: int = 1, replays: int = 3, warm: int = 1) -> float:
    """Device ms of one ``body`` call: ``warm`` eager runs, then ``launches`` calls captured in one CUDA
    graph, replayed ``replays`` times after one untimed replay; the fastest replay over ``launches``."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warm):
            body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for _ in range(launches):
            body()
    return replay_ms(graph, replays) / launches


def replay_ms(graph: Any, replays: int = 5, statistic: Callable[[list[float]], float] = min) -> float:
    """Device ms of a captured CUDA graph's replay (CUDA events around each): ``statistic`` of ``replays``
    after one untimed; the fastest by default (a choice between paths), the benches report the median."""
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistic(times)


def _graph_timer(body: Callable[[], object]) -> float:
    return graph_ms(body, replays=3, warm=2)


class Tuner:
    """The fastest of a kernel's candidate configs, per shape key, measured once on the device."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.chosen: dict[Hashable, Any] = {}
        self.timings: dict[Hashable, dict[str, float]] = {}
        self.seconds = 0.0
        """Wall time spent timing (compiles included)."""

    def pick(
        self, key: Hashable, candidates: Sequence[C], launch: Callable[[C], object], device: torch.device
    ) -> C:
        """The config for ``key`` (timing every candidate the first time, where ``measurable``)."""
        got = self.chosen.get(key)
        if got is not None:
            return got
        if len(candidates) == 1 or not TUNING or not measurable(device):
            return candidates[0]  # untimed, not kept: a later measurable call of this shape still tunes
        t0 = time.perf_counter()
        times: dict[str, float] = {}
        best, best_ms = candidates[0], math.inf
        for c in candidates:
            try:
                ms = graph_ms(lambda c=c: launch(c), launches=TIMED_LAUNCHES, replays=2)
            except Exception as e:  # e.g. a tile over the SM's shared memory: not a candidate here
                log.debug("%s %s: config %s failed: %s", self.name, key, c, e)
                continue
            times[str(c)] = round(ms * 1000, 2)  # microseconds
            if ms < best_ms:
                best, best_ms = c, ms
        self.chosen[key], self.timings[key] = best, times
        self.seconds += time.perf_counter() - t0
        log.debug("%s %s: %s (us: %s)", self.name, key, best, times)
        return best

    def report(self) -> dict[str, Any]:
        """What was chosen, per shape, with every candidate's time (us), and the seconds spent."""
        return {
            "seconds": round(self.seconds, 1),
            "shapes": {
                str(k): {"chosen": str(v), "us": self.timings.get(k, {})} for k, v in self.chosen.items()
            },
        }


def fastest(
    label: str, paths: dict[str, Callable[[], object]], timer: Callable[[Callable[[], object]], float] | None = None
) -> tuple[str, dict[str, float]]:
    """The name of the fastest of ``paths`` and every path's ms: each body timed by ``timer`` (default: as
    a CUDA graph replay, after two eager runs); a path that fails to run or capture is left out (logged).
    Logs the choice."""
    ms: dict[str, float] = {}
    for name, body in paths.items():
        try:
            ms[name] = round((timer or _graph_timer)(body), 4)
        except Exception as e:
            log.warning("%s: the %s path failed to run as a CUDA graph: %s", label, name, e)
    if not ms:
        raise RuntimeError(f"{label}: no path ran")
    name = min(ms, key=ms.__getitem__)
    log.info("%s: %s (ms: %s)", label, name, ms)
    return name, ms
