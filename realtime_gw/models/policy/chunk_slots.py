"""Fixed robot slots for PI0's (and π0.5's) fast sampler: a chunk is a prefix pass, then denoising steps that every
robot holding a slot shares, whatever step each is at.

- Per-slot static buffers (as ``models/speech/streaming/slot_engine.py`` keeps them for TTS streams): the prefix's
  K/V, masks and rotary tables (``Cache`` rows), the chunk's state, starting noise, RTC guide and its
  current actions ``x``. New robots' prefixes run over staging rows of their exact count, then their
  rows are copied into their slots; a denoising step advances slots ``[0, B)`` (``B`` the bucket above
  the highest slot in use; slots are handed out lowest first, so the active ones stay packed), each row
  from its own time (``step_params``), rows not in the step unchanged. So a robot that arrives while
  others are mid-chunk waits for at most the steps of one iteration before its prefix runs, and joining
  never changes another robot's actions (rows never mix).
- On CUDA the prefix (one graph per exact count) and the step (one per bucket, plain and RTC-guided)
  are CUDA graphs (``kernels.GraphCapture``); elsewhere, or where a capture fails, the same code runs
  eagerly.
- Overlap (CUDA with graphs): the prefix runs on a stream of its own, in a graph pool of its own, over
  the staging rows only; the robots already admitted keep stepping on the main stream meanwhile (the
  prefix is compute-bound, a step latency-bound: they share the GPU well). Once it is done (an event) the
  staging rows are committed into their slots on the main stream, and the new robots step from then on.
  One prefix batch is in flight at a time; robots arriving meanwhile wait for the next. Without a GPU
  the prefix is committed as soon as it ran.
- Per-robot step parameters go up once per iteration (all of its steps); each step's column is a
  device-to-device copy before the replay. The only host sync per iteration ends it (the finished rows'
  actions come back in it), after which every staging buffer is free again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from realtime_gw.models.kernels import GraphCapture, bucket_for
from realtime_gw.models.policy.pi0_functional import (
    IDLE_PARAMS,
    STEP_PARAMS,
    Batch,
    Cache,
    Chunk,
    Pi0Functional,
    PrefixFill,
    Prepared,
    Velocity,
    rtc_stack,
    step_params,
)
from realtime_gw.models.slot_pool import SlotPool

log = logging.getLogger(__name__)

KINDS = ("plain", "rtc")
"""The step's two graphs per bucket: unguided, and RTC-guided (a vector-Jacobian product per step)."""


class HostEvent:
    """The event of a prefix launched where there are no streams: done when launched."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


@dataclass
class _InFlight:
    """The prefix batch in the staging rows, not yet in its slots."""

    slots: list[int]
    event: Any  # torch.cuda.Event or HostEvent


class ChunkSlots:
    """``capacity`` (the largest bucket) robot slots on one device and the two phases that advance them."""

    def __init__(
        self,
        fn: Pi0Functional,
        buckets: Sequence[int],
        image_slots: int,
        image_size: tuple[int, int],
        prompt_len: int,
        device: torch.device,
        cuda_graphs: bool,
        beta: float,
        compiled_velocity: Velocity | None = None,
        compiled_prefix: PrefixFill | None = None,
        fused_velocity: Velocity | None = None,
    ) -> None:
        self.fn, self.buckets, self.device, self.beta = fn, tuple(buckets), device, beta
        self.fused_velocity = fused_velocity  # ``models.fused``'s, both step kinds; None: compiled/eager
        self.fused_on: dict[tuple[str, int], bool] = {}  # (kind, bucket): fused where timed faster
        self.fused_ms: dict[tuple[str, int], dict[str, float]] = {}  # (kind, bucket): each path's ms
        self.capacity = cap = self.buckets[-1]
        self.cuda_graphs = cuda_graphs
        self.compiled_velocity = compiled_velocity
        self.compiled_prefix = compiled_prefix
        dt, (h, w) = fn.dtype, image_size
        actions = (cap, fn.chunk, fn.max_action_dim)
        # Staging: new robots' prefix inputs, rows [0, n) for n robots.
        self.stage = Batch(
            pixel_values=torch.zeros((cap, image_slots, 3, h, w), dtype=torch.uint8, device=device),
            input_ids=torch.zeros((cap, prompt_len), dtype=torch.long, device=device),
            mask=torch.ones((cap, prompt_len), dtype=torch.bool, device=device),
            state=torch.zeros((cap, fn.max_state_dim), dtype=dt, device=device),
            noise=torch.zeros(actions, dtype=dt, device=device),
            target=torch.zeros(actions, dtype=torch.float32, device=device),
            weights=torch.zeros(actions, dtype=torch.float32, device=device),
            frozen=torch.zeros((cap, fn.chunk, 1), dtype=torch.bool, device=device),
        )
        self.stage_cache = Cache(fn, cap, prompt_len, device)
        # Host staging, pinned on CUDA: uploads are asynchronous, and free again after the iteration's sync.
        self.pinned = device.type == "cuda"
        self.host = Batch(**{k: self._host_like(v) for k, v in vars(self.stage).items()})
        self.index = torch.arange(cap, device=device)
        """Staging row i -> slot ``index[i]``."""
        self.host_index = self._host_like(self.index)
        # The slots.
        self.cache = Cache(fn, cap, prompt_len, device)
        self.chunk = Chunk(
            state=torch.zeros_like(self.stage.state),
            noise=torch.zeros(actions, dtype=dt, device=device),
            target=torch.zeros(actions, dtype=torch.float32, device=device),
            weights=torch.zeros(actions, dtype=torch.float32, device=device),
            frozen=torch.zeros((cap, fn.chunk, 1), dtype=torch.bool, device=device),
        )
        self.x = torch.zeros(actions, dtype=dt, device=device)
        """Each slot's actions so far: its noise after the prefix, its chunk after the last step."""
        idle = torch.tensor(IDLE_PARAMS, dtype=torch.float32)[:, None].expand(STEP_PARAMS, cap)
        self.idle = idle.to(device)
        self._idle_host = idle.contiguous()
        self.params = self.idle.clone()
        """The step's per-row parameters (``STEP_PARAMS``, capacity): what the step graphs read."""
        self._host_params = self._host_like(idle.clone()[None])
        self._dev_params = torch.zeros_like(self._host_params, device=device)
        # Host mirror per slot.
        self.step_of = [0] * cap
        self.steps_of = [0] * cap
        self.guided = [False] * cap
        self.slot_pool = SlotPool(cap, "policy")
        self.graphs: dict[tuple[str, int], Any] = {}  # ("prefix", robots) and (kind, bucket) -> CUDA graph
        self.compiled: set[tuple[str, int]] = set()
        """Graphs captured from compiled code: steps with the compiled expert step, prefixes with the
        compiled prefix."""
        self.failed: set[tuple[str, int]] = set()
        self._capturer = GraphCapture(device)  # graphs of the main stream: steps, commits
        self.overlap = device.type == "cuda" and cuda_graphs
        self._prefix_capturer = GraphCapture(device) if self.overlap else self._capturer  # own pool
        self._side: Any = torch.cuda.Stream(device) if self.overlap else None
        self._inflight: _InFlight | None = None
        self.pending: set[int] = set()  # slots whose prefix is not committed yet: they do not step

    def _host_like(self, t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t, device="cpu", pin_memory=self.pinned)

    # -- slots ---------------------------------------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return len(self.slot_pool)

    def free(self, slot: int) -> None:
        self.slot_pool.give(slot)  # raises on a slot freed twice

    def reset(self) -> None:
        """Every slot free (after a supervisor restart that dropped states unreleased). A prefix still in
        flight is waited for first: its copies may still read the pinned staging rows the next prefix
        writes on the host."""
        if self._inflight is not None:
            try:
                self._inflight.event.synchronize()
            except Exception as e:  # a broken device: nothing is left to protect, the reset goes on
                log.warning("policy: the prefix in flight failed at reset: %s", e)
        self.slot_pool.reset()
        self._inflight, self.pending = None, set()

    # -- phase 1: prefixes ---------------------------------------------------------------------------------
    @torch.no_grad()
    def admit(self, entries: Sequence[tuple[Prepared, int]]) -> list[int | None]:
        """A slot for each (prepared, num_steps) while slots last (None for the rest), and the prefixes
        of those admitted, in one pass. Their first denoising step is the next ``advance`` after the
        prefix is committed. None for all while another prefix batch is in flight."""
        self.commit(wait=False)
        if self._inflight is not None:
            return [None] * len(entries)
        slots = [self.slot_pool.take() for _ in entries]
        rows = [(s, p, n) for s, (p, n) in zip(slots, entries, strict=True) if s is not None]
        if rows:
            try:
                self._prefix(rows)
            except BaseException:  # nobody will hold these slots (e.g. an OOM): give them back
                self._inflight, self.pending = None, set()
                for s, _, _ in rows:
                    self.slot_pool.give(s)
                raise
        return slots

    def _prefix(self, rows: list[tuple[int, Prepared, int]]) -> None:
        for slot, p, steps in rows:
            self.step_of[slot], self.steps_of[slot], self.guided[slot] = 0, steps, p.rtc is not None
        if self._side is None:
            self._prefix_launch(rows)
            self._inflight = _InFlight([s for s, _, _ in rows], HostEvent())
        else:
            # The staging is free once the main stream's last commit has read it.
            self._side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._side):
                self._prefix_launch(rows)
                event = torch.cuda.Event()
                event.record(self._side)
            self._inflight = _InFlight([s for s, _, _ in rows], event)
        self.pending = set(self._inflight.slots)
        if not self.overlap:
            self.commit(wait=True)

    def _prefix_launch(self, rows: list[tuple[int, Prepared, int]]) -> None:
        n = len(rows)
        self.host_index[:n].copy_(torch.tensor([s for s, _, _ in rows]))
        self.index[:n].copy_(self.host_index[:n], non_blocking=True)
        # Capture (if new) before the inputs land: its warm-up runs on whatever the staging holds.
        graph = self.graph("prefix", n) if self.cuda_graphs else None
        prepared = [p for _, p, _ in rows]
        host, dev = self.host.rows(n), self.stage.rows(n)
        host.pixel_values.copy_(torch.stack([p.pixel_values for p in prepared]))
        host.input_ids.copy_(torch.stack([p.input_ids for p in prepared]))
        host.mask.copy_(torch.stack([p.attention_mask for p in prepared]))
        host.state.copy_(torch.stack([p.state for p in prepared]))
        host.noise.copy_(torch.stack([p.noise for p in prepared]))
        target, weights, frozen = rtc_stack(prepared, self.fn.chunk, self.fn.max_action_dim)
        for name, value in (("target", target), ("weights", weights), ("frozen", frozen)):
            getattr(host, name).copy_(value)  # zeros for unguided robots: a guided step leaves them be
        for name, src in vars(host).items():
            getattr(dev, name).copy_(src, non_blocking=True)
        if graph is not None:
            graph.replay()
        else:
            self._prefix_body(n, ("prefix", n) in self.compiled)

    def commit(self, wait: bool) -> None:
        """The prefix batch in flight into its slots (on the main stream), if it is done or ``wait``."""
        if self._inflight is None:
            return
        event = self._inflight.event
        if not wait and not event.query():
            return
        if isinstance(event, HostEvent):
            event.synchronize()
        else:
            torch.cuda.current_stream(self.device).wait_event(event)
        n = len(self._inflight.slots)
        graph = self.graph("commit", n) if self.cuda_graphs else None
        if graph is not None:
            graph.replay()
        else:
            self._commit_body(n)
        self._inflight, self.pending = None, set()

    def _prefix_body(self, n: int, compiled: bool = False) -> None:
        """The VLM over staging rows [0, n): their K/V, masks and rotary tables in the staging cache."""
        fill = self.compiled_prefix if compiled and self.compiled_prefix is not None else self.fn.fill_prefix
        fill(self.stage_cache.rows(n), self.stage.rows(n))

    def _commit_body(self, n: int) -> None:
        """Staging rows [0, n) into their slots."""
        cache, batch = self.stage_cache.rows(n), self.stage.rows(n)
        idx, src = self.index[:n], batch.chunk()
        for dst, rows in zip(self.cache.buffers(), cache.buffers(), strict=True):
            dst.index_copy_(0, idx, rows)
        self.x.index_copy_(0, idx, src.noise)
        for name in ("state", "noise", "target", "weights", "frozen"):
            getattr(self.chunk, name).index_copy_(0, idx, getattr(src, name))

    # -- phase 2: denoising steps --------------------------------------------------------------------------
    @torch.no_grad()
    def advance(self, slots: Sequence[int], max_steps: int) -> list[int]:
        """Up to ``max_steps`` denoising steps for every slot in ``slots`` that has steps left (the others
        stay as they are); returns the slots whose chunk is now complete (read them with ``actions``).
        A prefix in flight is committed first if it is done, or waited for when nothing else could step."""
        self.commit(wait=all(s in self.pending for s in slots))
        slots = [s for s in slots if s not in self.pending]
        left = {s: self.steps_of[s] - self.step_of[s] for s in slots}
        steps = min(max_steps, max(left.values(), default=0))
        if steps <= 0:
            return [s for s in slots if left[s] <= 0]
        # Graphs exist per bucket; launched eagerly (the CPU, where a padding row costs a full row) the
        # step covers exactly the slots up to the highest in use.
        size = bucket_for(self.buckets, max(slots) + 1) if self.cuda_graphs else max(slots) + 1
        kind = "rtc" if any(self.guided[s] for s in slots) else "plain"
        graph = self.graph(kind, size) if self.cuda_graphs else None  # captures idle the params
        host = self._params_buffers(steps)
        host[:steps, :, :size] = self._idle_host[:, :size]
        for s in slots:
            for j in range(min(steps, left[s])):
                host[j, :, s] = torch.tensor(step_params(self.step_of[s] + j, self.steps_of[s], self.beta))
            self.step_of[s] += min(steps, left[s])
        # The whole contiguous [:steps] block: a column slice of pinned memory would be copied through a
        # pageable temporary, synchronously. Columns from ``size`` on hold stale values no step reads.
        self._dev_params[:steps].copy_(host[:steps], non_blocking=True)
        for j in range(steps):
            self.params[:, :size].copy_(self._dev_params[j, :, :size])
            if graph is not None:
                graph.replay()
            else:
                self._step_body(kind, size, (kind, size) in self.compiled)()
        return [s for s in slots if self.step_of[s] >= self.steps_of[s]]

    def _params_buffers(self, steps: int) -> torch.Tensor:
        if self._host_params.shape[0] < steps:
            shape = (steps, STEP_PARAMS, self.capacity)
            self._host_params = torch.empty(shape, pin_memory=self.pinned)
            self._dev_params = torch.zeros(shape, device=self.device)
        return self._host_params

    def _step_body(self, kind: str, size: int, compiled: bool = False) -> Callable[[], None]:
        fn, cache, x, params = self.fn, self.cache.rows(size), self.x[:size], self.params[:, :size]
        velocity = self.compiled_velocity if compiled and self.compiled_velocity is not None else fn.velocity
        if self.fused_velocity is not None and self.fused_on.get((kind, size), True):
            velocity = self.fused_velocity
        chunk = (self.chunk if kind == "rtc" else self.chunk.plain()).rows(size)

        def step() -> None:
            x.copy_(fn.denoise_step(cache, chunk, x, params, velocity))

        return step

    def actions(self, slots: Sequence[int]) -> torch.Tensor:
        """The slots' chunks (n, chunk, max_action_dim) on the CPU; ends the iteration (the host sync)."""
        out = self.x[torch.tensor(list(slots), dtype=torch.long)].cpu()
        if self.device.type == "cuda":  # when no slot finished, the copy above was empty
            torch.cuda.current_stream(self.device).synchronize()
        return out

    # -- graphs --------------------------------------------------------------------------------------------
    def graph(self, kind: str, size: int, compiled: bool = False) -> Any:
        """The graph of ``kind`` at ``size`` (captured on first use; a step's fused or not, the faster); None
        where capture failed (launch eagerly). Only warm-up asks for ``compiled``: a compile takes tens of
        seconds, which a serving step must not (the supervisor would take it for a hang)."""
        key = (kind, size)
        if key in self.graphs or key in self.failed:
            return self.graphs.get(key)
        compiled_code = self.compiled_prefix if kind == "prefix" else self.compiled_velocity
        fused = kind in KINDS and self.fused_velocity is not None
        if fused:  # today's step first (compiled where asked), then the fused one: the faster is kept
            self.fused_on[key] = False
        tries = [True, False] if compiled and kind != "commit" and compiled_code is not None else [False]
        graph = None
        for with_compiled in tries:
            try:
                graph = self._capture(kind, size, with_compiled)
            except Exception as e:  # capture is an optimisation: fall back to less of it
                how = "compiled" if with_compiled else "uncompiled"
                log.warning("policy: CUDA graph capture of %s at %d (%s) failed: %s", kind, size, how, e)
                continue
            if with_compiled:
                self.compiled.add(key)
            break
        graph = _faster_step(self, key, graph) if fused else graph
        if graph is None:
            self.failed.add(key)
        else:
            self.graphs[key] = graph
        return graph

    def _capture(self, kind: str, size: int, compiled: bool) -> Any:
        if kind == "prefix":
            return self._prefix_capturer.capture(lambda: self._prefix_body(size, compiled), warmup_runs=2)
        if kind == "commit":  # its warm-ups are the commit itself, twice: the same copies
            return self._capturer.capture(lambda: self._commit_body(size))
        # Warm-ups and capture with every row idle: live slots keep their actions (the suffix K/V the
        # step writes is rewritten by every step before it is read).
        self.params.copy_(self.idle)
        # Two warm-ups outside the capture: compiles, cuBLAS handles, autograd.
        return self._capturer.capture(self._step_body(kind, size, compiled), warmup_runs=2)


def _faster_step(slots: ChunkSlots, key: tuple[str, int], today: Any) -> Any:
    """The faster step graph at ``key``: ``today``'s (None: its capture failed) or the fused one, both
    replayed and timed at warm-up (the fused kernels' tiles are tuned in its capture's warm-up runs). The
    choice goes to ``fused_on`` (eager launches follow it too) and the log."""
    from realtime_gw.models.fused.tuning import replay_ms

    kind, size = key
    slots.fused_on[key] = True
    try:
        fused = slots._capture(kind, size, False)
    except Exception as e:
        log.warning("policy: CUDA graph capture of the fused %s step at %d failed: %s", kind, size, e)
        slots.fused_on[key] = False
        return today
    graphs = {"fused": fused} if today is None else {"today": today, "fused": fused}
    ms = {name: round(replay_ms(g), 3) for name, g in graphs.items()}
    pick = min(ms, key=ms.__getitem__)
    slots.fused_on[key], slots.fused_ms[key] = pick == "fused", ms
    log.info("policy: the %s step at bucket %d runs %s (ms %s)", kind, size, pick, ms)
    return graphs[pick]
