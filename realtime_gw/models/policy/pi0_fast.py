"""Fast PI0 serving: ``Pi0Functional``'s sampler over static buffers, with CUDA graphs per batch bucket.

- The flow-matching loop has no host syncs, so on CUDA the prefix and the whole loop are captured as
  **CUDA graphs** and replayed, over static buffers per batch bucket (1, 2, 4, 8, 16 by default). The loop
  runs padded up to its bucket (it is latency-bound: padding rows cost little), the compute-bound prefix
  has a graph per exact batch size (padding rows would cost a full robot each). All graphs share one
  memory pool (``kernels.GraphCapture``). Inputs go up through pinned staging buffers; the only sync is
  the final copy of the actions.
- By default on CUDA the expert's step is ``torch.compile``-d (plain and guided loops; the guided one's
  backward too), bucket by bucket within a start-up budget.
- Real-time chunking (``policy_rtc``) is captured in its own graph per bucket.

The maths (static KV cache, fused layers, RTC guidance) is ``pi0_functional``; this module only stages
inputs, captures and replays.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from realtime_gw.models.kernels import GraphCapture, bucket_for
from realtime_gw.models.policy.pi0 import Pi0Runner
from realtime_gw.models.policy.pi0_functional import (
    Batch,
    Cache,
    Pi0Functional,
    Prepared,
    Velocity,
    rtc_stack,
)
from realtime_gw.models.policy.rtc import DEFAULT_BETA

log = logging.getLogger(__name__)

DEFAULT_BUCKETS = (1, 2, 4, 8, 16)
DEFAULT_COMPILE_BUDGET_S = 300.0


class _Bucket:
    """Static inputs, cache and output of one batch size, and the graphs captured over them: the loop's
    (``plain``, ``rtc``) at this size, the prefix's at every exact size from ``smallest`` up to it."""

    def __init__(
        self,
        fn: Pi0Functional,
        size: int,
        smallest: int,
        slots: int,
        image: tuple[int, int],
        prompt_len: int,
        device: torch.device,
    ) -> None:
        dt = fn.dtype
        h, w = image
        tokens = prompt_len
        self.size, self.smallest = size, smallest
        self.batch = Batch(
            pixel_values=torch.zeros((size, slots, 3, h, w), dtype=torch.uint8, device=device),
            input_ids=torch.zeros((size, tokens), dtype=torch.long, device=device),
            # Padding rows keep an all-valid mask: finite values, never read back.
            mask=torch.ones((size, tokens), dtype=torch.bool, device=device),
            state=torch.zeros((size, fn.model.config.max_state_dim), dtype=dt, device=device),
            noise=torch.zeros((size, fn.chunk, fn.max_action_dim), dtype=dt, device=device),
            target=torch.zeros((size, fn.chunk, fn.max_action_dim), dtype=torch.float32, device=device),
            weights=torch.zeros((size, fn.chunk, fn.max_action_dim), dtype=torch.float32, device=device),
            frozen=torch.zeros((size, fn.chunk, 1), dtype=torch.bool, device=device),
        )
        # Host staging, pinned on CUDA: the uploads are asynchronous and ordered before the replays.
        pinned = device.type == "cuda"
        self.host = Batch(
            **{
                f.name: torch.empty_like(getattr(self.batch, f.name), device="cpu", pin_memory=pinned)
                for f in dataclasses.fields(Batch)
            }
        )
        self.cache = Cache(fn, size, tokens, device)
        self.out = torch.zeros((size, fn.chunk, fn.max_action_dim), dtype=dt, device=device)
        self.graphs: dict[tuple[str, int], Any] = {}
        """(kind, steps) for the loops, ("prefix", rows) for the prefix -> CUDA graph."""
        self.compiled: set[str] = set()
        """Loop kinds whose graph runs the compiled expert step."""

    def plain(self) -> Batch:
        b = self.batch
        return Batch(b.pixel_values, b.input_ids, b.mask, b.state, b.noise)


class FastPi0Runner(Pi0Runner):
    """``Pi0Runner`` with the fast sampler: static KV, bucketed CUDA graphs on CUDA (eager elsewhere).

    ``compile_expert``: the expert's step goes through ``torch.compile`` (one compile per bucket and loop
    kind, the guided loop's with its backward). ``warmup`` compiles bucket by bucket, smallest first,
    while ``compile_budget_s`` lasts; buckets begun after that run the uncompiled step (same function,
    slower), and so does any capture that fails compiled."""

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
        compile_expert: bool = False,
        compile_budget_s: float = DEFAULT_COMPILE_BUDGET_S,
    ) -> None:
        super().__init__(model, tokenizer, spec, device, norm, rtc_beta)
        self.fn = Pi0Functional(model)
        self._functional = self.fn
        self.buckets = tuple(sorted(set(buckets)))
        if not self.buckets or self.buckets[0] < 1:
            raise ValueError(f"policy_graph_buckets must be positive batch sizes, got {list(buckets)}")
        self.compile_expert, self.compile_budget_s = compile_expert, compile_budget_s
        self._compiled_velocity: Velocity | None = None
        if compile_expert:
            import torch._dynamo

            # One compiled entry per bucket and grad mode (plain / guided), plus slack for step counts.
            need = 2 * len(self.buckets) + 4
            cfg = torch._dynamo.config
            cfg.recompile_limit = max(cfg.recompile_limit, need)
            self._compiled_velocity = torch.compile(self.fn.velocity, dynamic=False)
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self._buckets: dict[int, _Bucket] = {}
        self._graph_failed: set[tuple[str, int, int]] = set()
        self._capturer = GraphCapture(self.device)
        self.warmup_report: dict[str, Any] = {}
        """What ``warmup`` did: seconds, graphs, compiled loops per bucket, failures."""

    def run(self, prepared: list[Prepared], num_steps: int | None) -> list[np.ndarray]:
        steps = num_steps or self.spec.num_inference_steps
        out: list[np.ndarray] = []
        top = self.buckets[-1]
        for i in range(0, len(prepared), top):
            group = prepared[i : i + top]
            out += self.finish(group, self._sample_group(group, steps))
        return out

    def warmup(self) -> None:
        """Capture every bucket's graphs (exact-size prefixes, plain and RTC loops) at the default step
        count, compiling while the budget lasts."""
        if not self.cuda_graphs:
            return
        start = time.monotonic()
        steps = self.spec.num_inference_steps
        budget_left = self.compile_expert
        for size in self.buckets:
            if budget_left and time.monotonic() - start > self.compile_budget_s:
                budget_left = False
                log.warning(
                    "policy: compile budget (%.0f s) spent; buckets from %d on run the uncompiled step",
                    self.compile_budget_s,
                    size,
                )
            bucket = self._bucket(size)
            for rows in range(bucket.smallest, size + 1):
                self._graph(bucket, "prefix", 0, rows)
            for kind in ("plain", "rtc"):
                self._graph(bucket, kind, steps, compiled=budget_left)
        torch.cuda.synchronize(self.device)
        self.warmup_report = {
            "seconds": round(time.monotonic() - start, 1),
            "graphs": sum(len(b.graphs) for b in self._buckets.values()),
            "compiled": {b.size: sorted(b.compiled) for b in self._buckets.values()},
            "failed": sorted(map(str, self._graph_failed)),
        }
        log.info("policy: graphs ready %s", self.warmup_report)

    # -- internals ------------------------------------------------------------------------------------
    @torch.no_grad()
    def _sample_group(self, group: list[Prepared], steps: int) -> torch.Tensor:
        rtc = any(p.rtc is not None for p in group)
        if not self.cuda_graphs:
            return self.fn.sample(group, steps, self.device, self.rtc_beta)
        n = len(group)
        bucket = self._bucket(bucket_for(self.buckets, n))
        self._load(bucket, group, rtc)
        self._launch(bucket, "prefix", 0, n)
        self._launch(bucket, "rtc" if rtc else "plain", steps, bucket.size)
        return bucket.out[:n].clone()  # the caller's .cpu() is the one host sync

    def _bucket(self, size: int) -> _Bucket:
        if size not in self._buckets:
            tokens = self.spec.image_slots * self.tokens_per_image + self.spec.max_prompt_tokens
            smaller = [b for b in self.buckets if b < size]
            self._buckets[size] = _Bucket(
                self.fn,
                size,
                smaller[-1] + 1 if smaller else 1,
                self.spec.image_slots,
                self.spec.image_size,
                tokens,
                self.device,
            )
        return self._buckets[size]

    def _load(self, bucket: _Bucket, group: list[Prepared], rtc: bool) -> None:
        """Stage the group in the bucket's host buffers, then upload them (asynchronously from pinned
        memory; the previous group's results were read back first, so the staging is free)."""
        n = len(group)
        host, dev = bucket.host.rows(n), bucket.batch.rows(n)
        fields = ["pixel_values", "input_ids", "mask", "state", "noise"]
        host.pixel_values.copy_(torch.stack([p.pixel_values for p in group]))
        host.input_ids.copy_(torch.stack([p.input_ids for p in group]))
        host.mask.copy_(torch.stack([p.attention_mask for p in group]))
        host.state.copy_(torch.stack([p.state for p in group]))
        host.noise.copy_(torch.stack([p.noise for p in group]))
        if rtc:
            fields += ["target", "weights", "frozen"]
            target, weights, frozen = rtc_stack(group, self.fn.chunk, self.fn.max_action_dim)
            assert host.target is not None and host.weights is not None and host.frozen is not None
            host.target.copy_(target)
            host.weights.copy_(weights)
            host.frozen.copy_(frozen)
        for name in fields:
            getattr(dev, name).copy_(getattr(host, name), non_blocking=True)

    def _body(
        self, bucket: _Bucket, kind: str, steps: int, rows: int, velocity: Velocity
    ) -> Callable[[], None]:
        fn, beta = self.fn, self.rtc_beta
        if kind == "prefix":
            return lambda: fn.fill_prefix(bucket.cache.rows(rows), bucket.batch.rows(rows))
        batch = bucket.batch if kind == "rtc" else bucket.plain()

        def denoise() -> None:
            bucket.out.copy_(fn.denoise(bucket.cache, batch, steps, beta, velocity))

        return denoise

    def _launch(self, bucket: _Bucket, kind: str, steps: int, rows: int) -> None:
        graph = self._graph(bucket, kind, steps, rows)
        if graph is None:
            velocity = self._compiled_velocity if kind in bucket.compiled else None
            self._body(bucket, kind, steps, rows, velocity or self.fn.velocity)()
        else:
            graph.replay()

    def _graph(
        self, bucket: _Bucket, kind: str, steps: int, rows: int | None = None, compiled: bool = False
    ) -> Any:
        """The graph of ``kind`` (captured on first use); None where capture failed (launch eagerly).

        Only ``warmup`` asks for ``compiled``: a compile takes tens of seconds, which a serving step
        must not (the supervisor would take it for a hang), so captures later run the plain step."""
        rows = bucket.size if rows is None else rows
        key = ("prefix", rows) if kind == "prefix" else (kind, steps)
        if key in bucket.graphs:
            return bucket.graphs[key]
        if (kind, key[1], bucket.size) in self._graph_failed:
            return None
        tries: list[Velocity] = [self.fn.velocity]
        if kind != "prefix" and compiled and self._compiled_velocity is not None:
            tries.insert(0, self._compiled_velocity)
        for velocity in tries:
            try:
                graph = self._capture(bucket, kind, steps, rows, velocity)
            except Exception as e:  # capture is an optimisation: fall back to less of it
                log.warning(
                    "policy: CUDA graph capture of %s (batch %d, %d rows, %d steps, %s) failed: %s",
                    kind,
                    bucket.size,
                    rows,
                    steps,
                    "compiled" if velocity is self._compiled_velocity else "uncompiled",
                    e,
                )
                continue
            if velocity is self._compiled_velocity:
                bucket.compiled.add(kind)
            bucket.graphs[key] = graph
            return graph
        self._graph_failed.add((kind, key[1], bucket.size))
        return None

    def _capture(self, bucket: _Bucket, kind: str, steps: int, rows: int, velocity: Velocity) -> Any:
        body = self._body(bucket, kind, steps, rows, velocity)
        fn = self.fn

        def warmup() -> None:
            if kind != "prefix":  # the loop reads a filled cache
                fn.fill_prefix(bucket.cache, bucket.batch)
            body()

        # Two warm-ups outside the capture: compiles, cuBLAS handles, autograd.
        return self._capturer.capture(body, warmup, warmup_runs=2)
