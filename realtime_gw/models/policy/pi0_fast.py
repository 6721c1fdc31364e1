"""Fast PI0 serving: ``Pi0Functional``'s sampler over fixed robot slots (``chunk_slots``), with CUDA
graphs per batch bucket for the prefix and for one denoising step.

- A chunk is two phases: the prefix (SigLIP + Gemma over the observation, into the slot's static K/V)
  and the denoising steps, which every robot holding a slot shares whatever step it is at. The policy
  backend runs new robots' prefixes and a few steps of every robot per worker iteration, so a robot that
  arrives mid-chunk does not wait for the whole chunk (``PolicyBackend``); ``run`` is the one-shot use of
  the same slots (prefix, then every step, in one call).
- On CUDA the prefix (per exact robot count: padding rows would cost a full robot each) and the step
  (per bucket, 1, 2, 4, 8, 16 by default: latency-bound, padding costs little) are **CUDA graphs** in one
  pool. Inputs go up through pinned staging buffers; one host sync per call.
- By default on CUDA the graphs are captured from ``torch.compile``-d code: the expert's step (plain and
  RTC-guided; the guided one's backward too) bucket by bucket, and the prefix (once for one robot, once
  for any other count), within a start-up budget, with an on-disk cache of the compile work
  (``compile_cache``) so that a warm start-up skips it.

The maths (static KV cache, fused layers, RTC guidance) is ``pi0_functional``; the slots and graphs are
``chunk_slots``; this module adds compile, warm-up and the runner interface.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from realtime_gw.models.policy.chunk_slots import KINDS, ChunkSlots
from realtime_gw.models.policy.compile_cache import CompileCache
from realtime_gw.models.policy.pi0 import Pi0Runner, action_error, probe_requests
from realtime_gw.models.policy.pi0_functional import Pi0Functional, PrefixFill, Prepared, Velocity
from realtime_gw.models.policy.rtc import DEFAULT_BETA

log = logging.getLogger(__name__)

DEFAULT_BUCKETS = (1, 2, 4, 8, 16)
DEFAULT_COMPILE_BUDGET_S = 450.0
DEFAULT_FP8_MAX_ERROR = 0.05
"""``policy_fp8``'s guard: the largest relative L2 error of the probe's actions against transformers'
``sample_actions`` at which the FP8 prefix is served."""
FP8_PROBE_ROBOTS = 2


class FastPi0Runner(Pi0Runner):
    """``Pi0Runner`` with the fast sampler: static KV in fixed slots, bucketed CUDA graphs on CUDA (eager
    elsewhere). Also a phased runner for ``PolicyBackend``: ``admit``, ``advance``, ``free``.

    ``compile_graphs``: the graphs are captured from ``torch.compile``-d code: the expert's step (one
    compile per bucket and step kind, the guided one's with its backward) and the prefix (two compiles:
    one robot, and any other count). ``warmup`` compiles bucket by bucket, smallest first, while
    ``compile_budget_s`` lasts; graphs begun after that run the uncompiled code (same function, slower),
    and so does any capture that fails compiled. ``compile_cache``: where the compile work is
    kept between start-ups."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        spec: Any,
        device: str = "cpu",
        norm: Any = None,
        rtc_beta: float = DEFAULT_BETA,
        buckets: tuple[int, ...] = DEFAULT_BUCKETS,
        cuda_graphs: bool | None = None,
        compile_graphs: bool = False,
        compile_budget_s: float = DEFAULT_COMPILE_BUDGET_S,
        compile_cache: CompileCache | None = None,
        prefix_fp8: bool = False,
        fp8_max_error: float = DEFAULT_FP8_MAX_ERROR,
        fused_expert: bool = False,
    ) -> None:
        super().__init__(model, tokenizer, spec, device, norm, rtc_beta)
        self.fused_expert = fused_expert
        self.buckets = tuple(sorted(set(buckets)))
        if not self.buckets or self.buckets[0] < 1:
            raise ValueError(f"policy_graph_buckets must be positive batch sizes, got {list(buckets)}")
        self.compile_graphs, self.compile_budget_s = compile_graphs, compile_budget_s
        self.compile_cache = compile_cache
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self._prepared: dict[int, Prepared] = {}
        self.fp8_check: dict[str, Any] | None = None
        """``prefix_fp8``'s guard: the probe's error, the limit, whether FP8 is served."""
        self._build(prefix_fp8)
        if prefix_fp8:
            self._guard_fp8(fp8_max_error)
        self.warmup_report: dict[str, Any] = {} if self.fp8_check is None else {"fp8": self.fp8_check}
        """What ``warmup`` did: seconds, graphs, buckets compiled or not, failures, the compile cache."""

    def _build(self, prefix_fp8: bool) -> None:
        """The functional sampler, its compiled entry points and the slots (no graphs yet)."""
        self.fn = Pi0Functional(self.model, prefix_fp8)
        self._functional = self.fn
        self._compiled_velocity: Velocity | None = None
        self._compiled_prefix: PrefixFill | None = None
        if self.compile_graphs:
            import torch._dynamo

            # One compiled entry per bucket and grad mode (plain / guided), plus slack.
            need = 2 * len(self.buckets) + 4
            cfg = torch._dynamo.config
            cfg.recompile_limit = max(cfg.recompile_limit, need)
            self._compiled_velocity = torch.compile(self.fn.velocity, dynamic=False)
            # The prefix has a graph per exact robot count: compiled once static for one robot, then
            # once with the robot count dynamic (dynamo's automatic dynamic shapes) for all the others.
            self._compiled_prefix = torch.compile(self.fn.fill_prefix)
        fused: Velocity | None = None
        if self.fused_expert:
            from realtime_gw.models.fused.pi0_expert import FusedExpert

            fused = FusedExpert(self.fn).velocity
        spec = self.spec
        tokens = spec.image_slots * self.tokens_per_image + spec.max_prompt_tokens
        self.slots = ChunkSlots(
            self.fn,
            self.buckets,
            spec.image_slots,
            spec.image_size,
            tokens,
            self.device,
            self.cuda_graphs,
            self.rtc_beta,
            self._compiled_velocity,
            self._compiled_prefix,
            fused,
        )

    def _guard_fp8(self, max_error: float) -> None:
        """Serve the FP8 prefix only if a probe's actions stay within ``max_error`` (relative L2, model
        space, the robot's action dims) of transformers' ``sample_actions`` in the model dtype; else fall
        back to the model dtype, say so in the log and ``/readyz``. Eager and before any graph: the
        compiled graphs compute the same function to fusion rounding (``loadtest/bench/policy_gpu.py``
        measures the served path's error)."""
        probe = [self.prepare(r) for r in probe_requests(self.spec, FP8_PROBE_ROBOTS)]
        got = self.fn.sample(probe, self.spec.num_inference_steps, self.device)
        error, max_abs = action_error(got[..., : self.spec.action_dim], self.reference_actions(probe))
        served = error <= max_error
        self.fp8_check = {
            "served": served,
            "error": round(error, 5),
            "max_error": max_error,
            "max_abs_diff": round(max_abs, 5),
        }
        if served:
            log.info("policy: FP8 prefix served %s", self.fp8_check)
            return
        log.warning(
            "policy: FP8 prefix off: its probe's actions are %.4f (relative L2) from the model dtype's, over "
            "policy_fp8_max_error %.4f; serving the prefix in %s",
            error,
            max_error,
            self.dtype,
        )
        self._build(prefix_fp8=False)

    # -- the phased interface (PolicyBackend) ----------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.slots.capacity

    def admit(self, entries: Sequence[tuple[Prepared, int]]) -> list[int | None]:
        """Slots and prefixes for (prepared, num_steps) while slots last; None where none was free."""
        slots = self.slots.admit(entries)
        for slot, (prepared, _) in zip(slots, entries, strict=True):
            if slot is not None:
                self._prepared[slot] = prepared
        return slots

    def advance(self, slots: Sequence[int], max_steps: int) -> dict[int, np.ndarray]:
        """Up to ``max_steps`` denoising steps for ``slots``; the robot actions of those now complete."""
        done = self.slots.advance(slots, max_steps)
        actions = self.slots.actions(done)  # the iteration's one host sync, finished or not
        if not done:
            return {}
        return dict(zip(done, self.finish([self._prepared[s] for s in done], actions), strict=True))

    def free(self, slot: int) -> None:
        self._prepared.pop(slot, None)
        self.slots.free(slot)

    def reset_slots(self) -> None:
        self._prepared.clear()
        self.slots.reset()

    # -- one-shot --------------------------------------------------------------------------------------
    def run(self, prepared: list[Prepared], num_steps: int | None) -> list[np.ndarray]:
        """Whole chunks now: the same slots, every step in one ``advance``. Needs free slots (it is not
        for a runner a backend is serving from)."""
        steps = num_steps or self.spec.num_inference_steps
        out: list[np.ndarray] = []
        for i in range(0, len(prepared), self.capacity):
            group = prepared[i : i + self.capacity]
            slots = self.admit([(p, steps) for p in group])
            try:
                if None in slots:
                    raise RuntimeError(
                        f"policy: {slots.count(None)} of {len(group)} robots found no free slot"
                    )
                done = self.advance([s for s in slots if s is not None], steps)
                out += [done[s] for s in slots if s is not None]
            finally:
                for s in slots:
                    if s is not None:
                        self.free(s)
        return out

    # -- start-up --------------------------------------------------------------------------------------
    def warmup(self) -> None:
        """Capture every graph (prefixes at every exact count, plain and RTC steps per bucket), compiling
        smallest buckets first while the budget lasts, through the on-disk compile cache."""
        if not self.cuda_graphs:
            return
        start = time.monotonic()
        compiling = self.compile_graphs
        if compiling and self.compile_cache is not None:
            self.compile_cache.load()
        prev = 0
        for size in self.buckets:
            if compiling and time.monotonic() - start > self.compile_budget_s:
                compiling = False
                log.warning(
                    "policy: compile budget (%.0f s) spent; graphs from bucket %d on run uncompiled code",
                    self.compile_budget_s,
                    size,
                )
            for robots in range(prev + 1, size + 1):
                self.slots.graph("prefix", robots, compiled=compiling)
                self.slots.graph("commit", robots)
            for kind in KINDS:
                self.slots.graph(kind, size, compiled=compiling)
            prev = size
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self.compile_graphs and self.compile_cache is not None:
            self.compile_cache.save()
        self.warmup_report = self._report(time.monotonic() - start)
        log.info("policy: graphs ready %s", self.warmup_report)

    def _report(self, seconds: float) -> dict[str, Any]:
        """For the log and ``/readyz``: which buckets run the compiled step, which fall back, and the robot
        counts whose prefix runs compiled."""
        compiled = {
            size: sorted(k for k in KINDS if (k, size) in self.slots.compiled) for size in self.buckets
        }
        report: dict[str, Any] = {
            "seconds": round(seconds, 1),
            "graphs": len(self.slots.graphs),
            "compiled": compiled,
            "buckets_compiled": [s for s, kinds in compiled.items() if len(kinds) == len(KINDS)],
            "buckets_uncompiled": [s for s, kinds in compiled.items() if len(kinds) < len(KINDS)],
            "prefixes_compiled": sorted(n for kind, n in self.slots.compiled if kind == "prefix"),
            "failed": sorted(map(str, self.slots.failed)),
        }
        if self.slots.fused_ms:  # per step kind and bucket: the path kept and each path's device ms
            report["fused"] = {f"{k}@{n}": {"fused": self.slots.fused_on[(k, n)], "ms": ms}
                               for (k, n), ms in sorted(self.slots.fused_ms.items())}  # fmt: skip
        if self.fp8_check is not None:
            report["fp8"] = self.fp8_check
        if self.compile_cache is not None:
            report["compile_cache"] = self.compile_cache.describe()
        return report
