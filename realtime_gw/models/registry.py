"""Builds the stage workers the config asks for, each from its family's plan (``families``)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from realtime_gw.config import GatewayConfig
from realtime_gw.models import faults
from realtime_gw.models.clock_schedule import pacing_of
from realtime_gw.models.contract import BackendInfo
from realtime_gw.models.device_clock import DeviceClock, share_clocks
from realtime_gw.models.families import Role, StagePlan, chosen
from realtime_gw.models.lockstep import Lockstep
from realtime_gw.models.process_backend import ProcessBackend
from realtime_gw.models.runtime import StageWorker


@dataclass
class Workers:
    tts: StageWorker
    asr: StageWorker
    vad: StageWorker
    policy: StageWorker | None = None
    turn: StageWorker | None = None
    """Semantic VAD's end-of-turn model; None: pauses are judged by silence length."""
    s2s: StageWorker | None = None
    """The full-duplex speech-to-speech model (``--s2s``); None: no such stage."""
    all: list[StageWorker] = field(default_factory=list)
    clocks: dict[str, DeviceClock] = field(default_factory=dict)
    """The device clocks their stages share, by device (``device_clock`` setting)."""

    @property
    def ready(self) -> bool:
        return all(w.ready for w in self.all)

    async def start(self, warmup: bool = True) -> None:
        """Warm-ups run concurrently, each on its own worker thread, except CUDA stages: those go one
        after another, because while one thread captures a CUDA graph another's device-wide sync (or
        work on the legacy default stream) aborts the capture (cudaErrorStreamCaptureUnsupported), so
        two GPU stages warming up together stopped the gateway at start."""
        cuda = [w for w in self.all if str(getattr(w, "device", "cpu")).startswith("cuda")]

        async def one_by_one() -> None:
            for w in cuda:
                await w.start(warmup=warmup)

        await asyncio.gather(one_by_one(), *(w.start(warmup=warmup) for w in self.all if w not in cuda))
        freeze_heap()

    async def stop(self) -> None:
        await asyncio.gather(*(w.stop() for w in self.all), return_exceptions=True)


def freeze_heap() -> None:
    """What is alive once the stages are warm (weights, compiled graphs, tokenizers) lives as long as the
    process: frozen, a full garbage collection skips it. Unfrozen, one over that heap stalls every stream's
    frame at once (docs/benchmarks-log.md, the Qwen3-TTS second pass)."""
    gc.collect()
    gc.freeze()


def accepted_voices(info: BackendInfo) -> frozenset[str]:
    """Voice names a TTS backend answers to: its own, "default", and OpenAI's names (mapped)."""
    from realtime_gw.models.speech.tts_base import OPENAI_VOICES

    return frozenset(info.voices) | {"default"} | OPENAI_VOICES


def _cpu_backend(role: str, factory: Callable[[], Any], name: str, config: GatewayConfig) -> Any:
    """A backend that holds the GIL for long (pocketsphinx, Piper): built by ``factory`` (picklable) in
    a child process of its own, one per worker (plus a warm spare), so it stalls neither the event loop
    nor other stages and a hung step can be killed (``cpu_backends_in_process`` builds it here
    instead). One child per worker suits a 2-core box: the worker's slots (pocketsphinx's decoders)
    live in it and it steps them one batch at a time. Test faults are built with it, wherever it runs."""
    factory = faults.FaultyFactory(role, factory, tuple(config.fault_injection))
    if config.cpu_backends_in_process:
        return factory()
    return ProcessBackend(factory, name=name, spare=config.cpu_backend_spare)


def serve(role: str, plan: StagePlan, config: GatewayConfig) -> StageWorker:
    """The stage worker for a family's ``plan``, with the configured deadline and any injected test
    faults."""
    if plan.factory is not None:
        backend = _cpu_backend(role, plan.factory, plan.name, config)
    else:
        backend = faults.wrap(role, plan.backend, config.fault_injection)
    return StageWorker(
        backend,
        device=plan.device,
        max_batch=plan.max_batch,
        max_wait_ms=plan.max_wait_ms,
        max_active=plan.max_active,
        max_backlog=plan.max_backlog,
        step_timeout_s=config.worker_step_timeout_s,
        admit=plan.admit,
        pacing=pacing_of(role),
        lockstep=Lockstep(plan.lockstep_ms / 1000, plan.lockstep_stop_when_idle) if plan.lockstep_ms else None,
    )


def build_stage(role: Role, config: GatewayConfig) -> StageWorker:
    """One stage's worker, here, from the family the config names (``families``); also what a Ray stage
    actor runs (``models/remote/actor.py``)."""
    return serve(role, chosen(role, config).from_config(config), config)


def build_tts(config: GatewayConfig) -> StageWorker:
    return build_stage("tts", config)


def build_asr(config: GatewayConfig) -> StageWorker:
    return build_stage("asr", config)


def build_vad(config: GatewayConfig) -> StageWorker:
    return build_stage("vad", config)


def build_turn(config: GatewayConfig) -> StageWorker:
    return build_stage("turn", config)


def build_policy(config: GatewayConfig) -> StageWorker:
    return build_stage("policy", config)


def build_workers(config: GatewayConfig) -> Workers:
    """Every stage the config asks for; those named in ``remote_stages`` are served by Ray actors
    shared with other front-ends (``models/remote``), the rest run here."""
    remote: list[str] = []
    if config.remote_stages:
        from realtime_gw.models.remote import remote_roles

        remote = remote_roles(config)

    def stage(role: Role) -> StageWorker:
        if role in remote:
            from realtime_gw.models.remote import remote_stage

            return remote_stage(role, config, build_stage)  # type: ignore[return-value]  # StageWorker's interface
        return build_stage(role, config)

    workers = Workers(tts=stage("tts"), asr=stage("asr"), vad=stage("vad"), turn=stage("turn"))
    if config.policy != "none":
        workers.policy = stage("policy")
    if config.s2s != "none":
        workers.s2s = stage("s2s")
    workers.all = [
        w
        for w in (workers.tts, workers.asr, workers.vad, workers.turn, workers.policy, workers.s2s)
        if w is not None
    ]
    workers.clocks = share_clocks(workers.all, config.device_clock)
    return workers
