"""The Moshi speech-to-speech backend (``--s2s moshi``): every live conversation one batched step per 80 ms.

A conversation (``S2sOpen``) holds a slot of the engine for its whole life: ``open`` takes one or raises
``NoFreeSlot`` at once (a full stage refuses, it never queues into lateness). Its inputs arrive in
order: ``S2sAudio`` (one 80 ms frame of 24 kHz PCM16 each) and ``S2sSilence`` (the model's own channels
forced silent from the next frame on, or released). Each worker step advances every conversation that has
a frame waiting by one frame, all in one batched engine step, and answers it with one ``S2sFrame``: the
model's 80 ms of voice, its text token of that step and the piece it spells. A conversation with several
frames waiting advances one per step (``has_work``). ``release`` frees the slot at once; ``END_OF_INPUT``
(the stream's input closed) ends the conversation once the frames before it are answered.

In the gateway the stage runs in lockstep (``lockstep=True``, the worker's ``models/lockstep.Lockstep``
clock): every live conversation is stepped at every 80 ms tick, whether its next frame has come or not; one
that has none hears silence (``take_frame``: concealed, counted in ``realtime_gw_s2s_concealed_input_frames_total``),
and quiet frames are dropped from the head of an input more than ``input_allowance`` frames behind
(``realtime_gw_s2s_dropped_input_frames_total``). Without it (tests, tools) a conversation steps only
on a frame it was given.

Slots stay packed: batch buckets (powers of two to 32, then 40, 48, 56, 64, ...: ``engine.py``) cover
slots ``[0, B)``, so when conversations leave from the low slots the ones above are moved down
(``SlotEngine.exchange``: whole slot rows, nothing of a conversation changes but its row) before the next
step, which then runs at the bucket of the live count.

Lateness is against the lockstep's deadlines (``lockstep.frame_lateness``): the worker tells the backend
when the frame each iteration steps was due (``tick``, before the iteration's opens), and a frame is late by
how long after the next tick its audio was ready. So everything that delayed it counts: a step that ran
long, a step that started late because the one before ran over or the worker's thread was busy, a
PersonaPlex prompt prefilled at open in the same iteration, a stall (the frame after it is late by the
whole gap). Each frame carries it (``late_ms``; 0 outside a lockstep: no schedule to be late against) and
the stage counts and times it (``realtime_gw_s2s_late_steps_total``,
``realtime_gw_s2s_step_lateness_seconds``); how late each step *started* is the worker's
``realtime_gw_worker_tick_lateness_seconds``, on the same clock.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from prometheus_client import Counter, Histogram

from realtime_gw.config import GatewayConfig
from realtime_gw.models.contract import END_OF_INPUT, BackendInfo, NoFreeSlot, StepResult, warmup_seconds
from realtime_gw.models.families import StagePlan
from realtime_gw.models.fp8 import FP8
from realtime_gw.models.kernels import bucket_for
from realtime_gw.models.lockstep import MAX_BEHIND_FRAMES, frame_lateness, take_frame
from realtime_gw.models.s2s.checkpoint import MoshiCheckpoint, load
from realtime_gw.models.s2s.config import FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE, describe_shape
from realtime_gw.models.s2s.engine import MoshiEngine
from realtime_gw.models.s2s.sampling import Sampler
from realtime_gw.protocols.audio import level_dbfs
from realtime_gw.records.s2s import S2sAudio, S2sFrame, S2sOpen, S2sSilence, S2sSpec

log = logging.getLogger(__name__)

S2S_LATE_STEPS = Counter(
    "realtime_gw_s2s_late_steps_total",
    "Speech-to-speech steps whose frames were ready after their lockstep deadline (the next tick)",
)
S2S_STEP_LATENESS = Histogram(
    "realtime_gw_s2s_step_lateness_seconds",
    "How long after its lockstep deadline (its tick + 80 ms) a speech-to-speech step's frames were ready "
    "(0 when on time): a late start and a long step both count",
    buckets=(0.0, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64),
)
S2S_CONCEALED = Counter(
    "realtime_gw_s2s_concealed_input_frames_total",
    "Frames of a user's audio not there at their speech-to-speech step: the model heard silence instead",
)
S2S_DROPPED = Counter(
    "realtime_gw_s2s_dropped_input_frames_total",
    "Quiet frames of a user's audio dropped to bring it back within s2s_input_slack_ms of its step",
)
FRAME_BYTES = 2 * FRAME_SAMPLES
SILENT_FRAME = bytes(FRAME_BYTES)
QUIET_INPUT_DBFS = -45.0
"""A user's frame at or below this RMS level is a pause's: it may be dropped to catch up."""
CAPABILITIES = ("audio_in", "audio_out", "text_out")
KV_DTYPES: dict[str, torch.dtype | None] = {"model": None, "fp8": FP8}
"""``s2s_kv_dtype``: the ring K/V in the LM's dtype, or in e4m3 with a float32 scale per (slot, head,
position) (``streaming.layers.RingTransformer``)."""
__all__ = ["CAPABILITIES", "MoshiBackend", "MoshiState", "NoFreeSlot"]


@dataclass(eq=False)
class MoshiState:
    slot: int
    seed: int
    pending: deque[S2sAudio | S2sSilence] = field(default_factory=deque)
    audio_pending: int = 0
    silent: bool = False
    index: int = 0
    ended: bool = False
    """``END_OF_INPUT`` came: done once the frames before it are answered."""
    done: bool = False
    released: bool = False


class MoshiBackend:
    name = "s2s-moshi"
    family = "moshi"
    """The model family: its shapes (``config.FAMILY_SHAPES``) and its name in ``S2sSpec.model``."""
    capabilities: tuple[str, ...] = CAPABILITIES
    user_lead = 0
    """Columns ahead of the step where a user's frame goes (``lm.py``; PersonaPlex's step: 1)."""

    def __init__(
        self,
        config: str = "tiny",
        path: str | None = None,
        device: str = "cpu",
        slots: int = 4,
        *,
        seed: int | None = None,
        temperature: float = 0.8,
        top_k: int = 250,
        text_temperature: float = 0.7,
        text_top_k: int = 25,
        dtype: torch.dtype | None = None,
        cuda_graphs: bool | None = None,
        checkpoint: MoshiCheckpoint | None = None,
        lockstep: bool = False,
        input_allowance: int = 2,
        kv_dtype: str = "model",
        batch_buckets: Sequence[int] = (),
    ) -> None:
        """``seed``: the stage's seed (a conversation opened without one gets ``seed + n`` for the n-th
        opened; None = random). Temperatures <= 0 are greedy. ``checkpoint``: weights already loaded.
        ``lockstep``: every live conversation steps at every step, on silence when it has no frame;
        ``input_allowance``: frames of its input that may wait before quiet ones are dropped;
        ``kv_dtype``: the temporal transformer's ring K/V, ``model`` (the LM's dtype) or ``fp8``;
        ``batch_buckets``: the engine's batch sizes with a CUDA graph (empty: ``kernels.fine_buckets``)."""
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"s2s_kv_dtype must be one of {sorted(KV_DTYPES)}, not {kv_dtype!r}")
        if slots < 1:
            raise ValueError("s2s_slots must be >= 1")
        dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
        ck = checkpoint or load(config, path, device, dtype, self.family)
        self.checkpoint = ck
        self.slots = slots
        self.lockstep = lockstep
        self.input_allowance = input_allowance
        self._seed = seed
        self._opened = 0
        self.engine = MoshiEngine(
            ck.weights, ck.mimi, ck.shape, slots,
            text=Sampler(text_temperature, text_top_k), audio=Sampler(temperature, top_k),
            cuda_graphs=cuda_graphs, user_lead=self.user_lead, kv_dtype=KV_DTYPES[kv_dtype],
            batch_buckets=batch_buckets,
        )  # fmt: skip
        shape = ck.shape
        self.spec = S2sSpec(
            model=self.family, frame_ms=FRAME_MS, native_rate=SAMPLE_RATE, context_frames=shape.context,
            text_padding_ids=shape.padding_ids, capabilities=self.capabilities,
        )  # fmt: skip
        self.late_steps = 0
        self._due: float | None = None
        """When the frame of the iteration under way was due (``tick``); None: not in a lockstep."""
        self._holders: dict[int, MoshiState] = {}
        """The open conversation in each slot (packing moves them between slots)."""
        self._warming = False
        """While the warm-up runs: its steps (graph captures, first-touch) are not the stage's lateness."""
        self.warmup_report: dict[str, Any] = {}
        self.info = {
            "model": ck.description,
            "random_init": ck.random_init,
            "device": str(self.engine.device),
            "lm_dtype": str(self.engine.lm.dtype).removeprefix("torch."),
            "kv_dtype": str(self.engine.lm.ring.k_ring[0].dtype).removeprefix("torch."),
            "slots": slots,
            "batch_buckets": self.engine.batch_buckets,
            "text": ck.text.name,
            "sampling": {"temperature": temperature, "top_k": top_k, "text_temperature": text_temperature,
                         "text_top_k": text_top_k},  # fmt: skip
            "cuda_graphs": self.engine.use_graphs,
            "shape": describe_shape(shape),
        }
        log.info("%s: %s", self.name, self.info)

    # -- Backend protocol ------------------------------------------------------------------------------
    def open(self, request: S2sOpen) -> MoshiState:
        if not isinstance(request, S2sOpen):
            raise TypeError(f"expected S2sOpen, got {type(request).__name__}")
        if request.voice is not None or request.persona is not None:
            raise ValueError(f"moshi takes no voice prompt or persona; it can: {', '.join(CAPABILITIES)}")
        return self._hold(self._seed_of(request), self.engine.alloc_seeded)

    def _seed_of(self, request: S2sOpen) -> int:
        seed = request.seed
        if seed is None:
            seed = random.getrandbits(32) if self._seed is None else self._seed + self._opened
        return int(seed)

    def _hold(self, seed: int, alloc: Any) -> MoshiState:
        """A conversation in the slot ``alloc(seed)`` takes (NoFreeSlot when full)."""
        state = MoshiState(slot=alloc(seed), seed=seed)
        self._holders[state.slot] = state
        self._opened += 1
        return state

    def tick(self, due: float) -> None:
        """The lockstep worker's iteration that follows steps the frame due at ``due`` (``Ticked``)."""
        self._due = due

    def has_work(self, state: MoshiState) -> bool:
        live = not (state.released or state.done)
        return live and (self.lockstep or state.audio_pending > 0 or state.ended)

    def step(self, work: list[tuple[MoshiState, list[Any]]]) -> list[StepResult]:
        results: dict[int, StepResult] = {}
        run: list[tuple[int, MoshiState, bytes]] = []
        for i, (state, inputs) in enumerate(work):
            try:
                self._ingest(state, inputs)
            except (TypeError, ValueError) as e:  # bad input fails this conversation only
                results[i] = StepResult(done=True, error=f"{self.name}: {e}")
                continue
            pcm = self._next_frame(state)
            if pcm is None:
                state.done = state.ended
                results[i] = StepResult(done=state.done)
            else:
                run.append((i, state, pcm))
        if run:
            self._pack()
            self._run(run, results)
        self._due = None  # told again before the next iteration
        return [results[i] for i in range(len(work))]

    def release(self, state: MoshiState) -> None:
        if not state.released:
            state.released = True
            self._holders.pop(state.slot, None)
            self.engine.free(state.slot)

    def warmup(self) -> None:
        """Every CUDA graph bucket, then one real conversation of a few frames of low noise."""
        start = time.perf_counter()
        self._warming = True
        cuda = self.engine.device.type == "cuda"
        reserved = torch.cuda.memory_reserved(self.engine.device) if cuda else 0
        graphs_s = self.engine.capture_all()
        graphs_gib = (torch.cuda.memory_reserved(self.engine.device) - reserved) / 2**30 if cuda else 0.0
        state = self.open(S2sOpen(seed=0))
        rng = np.random.default_rng(0)
        try:
            frames = 4
            pcm = [(rng.standard_normal(FRAME_SAMPLES) * 300).astype("<i2").tobytes() for _ in range(frames)]
            self._ingest(state, [S2sAudio(p) for p in pcm])
            for _ in range(frames):
                self.step([(state, [])])
        finally:
            self.release(state)
            self._warming = False
        self.warmup_report = {
            "seconds": warmup_seconds(start), "slots": self.slots, "graphs": self.engine.graph_count,
            "graph_capture_s": round(graphs_s, 3), "graph_memory_gib": round(graphs_gib, 2), "frames": frames,
            **self.info,
        }  # fmt: skip

    def describe(self) -> BackendInfo:
        return BackendInfo(
            name=self.name,
            slots=self.slots,
            native_rate=SAMPLE_RATE,
            output_rate=SAMPLE_RATE,
            frame_samples=FRAME_SAMPLES,
            s2s=self.spec,
            warmup_report=self.warmup_report,
        )

    # -- internals -------------------------------------------------------------------------------------
    def _ingest(self, state: MoshiState, inputs: list[Any]) -> None:
        for item in inputs:
            if state.ended:
                break  # nothing follows END_OF_INPUT
            if item is END_OF_INPUT:
                state.ended = True
                continue
            if isinstance(item, S2sAudio):
                if len(item.pcm) != FRAME_BYTES:
                    raise ValueError(
                        f"S2sAudio must be one 80 ms frame: {FRAME_BYTES} bytes of 24 kHz PCM16, "
                        f"got {len(item.pcm)}"
                    )
                state.audio_pending += 1
            elif not isinstance(item, S2sSilence):
                raise TypeError(f"expected S2sAudio or S2sSilence, got {type(item).__name__}")
            state.pending.append(item)

    def _next_frame(self, state: MoshiState) -> bytes | None:
        """The next frame to run, once the silence switches queued before it are applied (in lockstep:
        silence when none has come; quiet frames dropped from an input too far behind)."""
        if not self.lockstep and state.audio_pending == 0:
            return None

        def switch(silent: bool) -> None:
            state.silent = silent

        # outside the lockstep a step runs as frames come: nothing waits long, nothing is dropped
        allowance = self.input_allowance if self.lockstep else len(state.pending)
        limit = MAX_BEHIND_FRAMES if self.lockstep else len(state.pending)
        conceal = self.lockstep and not state.ended
        taken = take_frame(state.pending, state.audio_pending, SILENT_FRAME, allowance, _quiet, switch, conceal, limit)
        state.audio_pending -= taken.dropped + (taken.pcm is not None and not taken.concealed)
        if not self._warming:
            S2S_CONCEALED.inc(taken.concealed)
            S2S_DROPPED.inc(taken.dropped)
        return taken.pcm

    def _pack(self) -> None:
        """Move the conversations above ``n`` (the open count) into the free slots below it when that
        shrinks the batch bucket."""
        held = sorted(self._holders)
        n, buckets = len(held), self.engine.batch_buckets
        if not n or bucket_for(buckets, held[-1] + 1) <= bucket_for(buckets, n):
            return
        pairs = list(zip([s for s in held if s >= n], [s for s in range(n) if s not in self._holders], strict=True))
        self.engine.exchange(pairs)
        for a, b in pairs:
            state = self._holders.pop(a)
            state.slot = b
            self._holders[b] = state

    def _run(self, run: list[tuple[int, MoshiState, bytes]], results: dict[int, StepResult]) -> None:
        pcm = np.frombuffer(b"".join(p for _, _, p in run), dtype="<i2").reshape(len(run), FRAME_SAMPLES)
        frames, valid, out = self.engine.step([s.slot for _, s, _ in run], pcm, [s.silent for _, s, _ in run])
        late_s = 0.0 if self._due is None else frame_lateness(self._due, time.monotonic(), FRAME_MS / 1000)
        if not self._warming:
            S2S_STEP_LATENESS.observe(late_s)
            if late_s > 0:
                self.late_steps += 1
                S2S_LATE_STEPS.inc()
        pad = self.spec.text_padding_ids
        for row, (i, state, _) in enumerate(run):
            token = int(frames[row, 0]) if valid[row] else pad[0]
            padding = token in pad
            results[i] = StepResult(outputs=[S2sFrame(
                index=state.index, pcm=out[row].astype("<i2").tobytes(),
                text="" if padding else self.checkpoint.text.piece(token), text_token=token,
                padding=padding, late_ms=round(late_s * 1000, 3),
            )], done=state.ended and state.audio_pending == 0)  # fmt: skip
            state.done = results[i].done
            state.index += 1


def _quiet(pcm: bytes) -> bool:
    return level_dbfs(pcm) <= QUIET_INPUT_DBFS


def build_moshi(config: GatewayConfig, cls: type[MoshiBackend] = MoshiBackend, **extra: Any) -> MoshiBackend:
    """The backend the gateway config asks for (the ``[s2s]`` section)."""
    return cls(
        config=config.s2s_config,
        path=config.s2s_path,
        device=config.s2s_device,
        slots=config.s2s_slots,
        seed=config.s2s_seed,
        temperature=config.s2s_temperature,
        top_k=config.s2s_top_k,
        text_temperature=config.s2s_text_temperature,
        text_top_k=config.s2s_text_top_k,
        lockstep=True,
        input_allowance=max(0, round(config.s2s_input_slack_ms / FRAME_MS)),
        kv_dtype=config.s2s_kv_dtype,
        batch_buckets=config.s2s_batch_buckets,
        **extra,
    )


def stage_plan(config: GatewayConfig, backend: MoshiBackend) -> StagePlan:
    """A GPU stage (in-thread, CUDA graphs): every conversation holds a slot and all advance each step,
    so slots = batch = admission limit: the worker refuses a conversation past it at submit (NoFreeSlot)."""
    return StagePlan(
        backend=backend,
        device=config.s2s_device,
        max_batch=config.s2s_slots,
        max_active=config.s2s_slots,
        lockstep_ms=FRAME_MS,
    )


def from_config(config: GatewayConfig) -> StagePlan:
    return stage_plan(config, build_moshi(config))
