"""Builds the stage workers the config asks for; the only place that maps names to backends."""

from __future__ import annotations

import asyncio
import functools
import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from realtime_gw.config import ConfigError, GatewayConfig
from realtime_gw.models import faults
from realtime_gw.models.process_backend import ProcessBackend
from realtime_gw.models.runtime import StageWorker
from realtime_gw.records.voice import AsrRequest


@dataclass
class Workers:
    tts: StageWorker
    asr: StageWorker
    vad: StageWorker
    policy: StageWorker | None = None
    turn: StageWorker | None = None
    """Semantic VAD's end-of-turn model; None: pauses are judged by silence length."""
    all: list[StageWorker] = field(default_factory=list)

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


def accepted_voices(backend: object) -> frozenset[str]:
    """Voice names a TTS backend answers to: its own, "default", and OpenAI's names (mapped)."""
    from realtime_gw.models.speech.tts_base import OPENAI_VOICES

    return frozenset(getattr(backend, "voices", ())) | {"default"} | OPENAI_VOICES


def _worker(role: str, backend: Any, config: GatewayConfig, **options: Any) -> StageWorker:
    """A stage worker for an in-thread ``backend``, with the configured deadline and any injected test
    faults."""
    backend = faults.wrap(role, backend, config.fault_injection)
    return _stage(backend, config, **options)


def _stage(backend: Any, config: GatewayConfig, **options: Any) -> StageWorker:
    return StageWorker(backend, step_timeout_s=config.worker_step_timeout_s, **options)


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


def piper_backend(voice: str, max_text_chars: int, deterministic: bool = False) -> Any:
    """Piper, built where it runs (a top-level function, so a child process can be told to call it)."""
    from realtime_gw.models.speech.tts_piper import PiperTtsBackend

    backend = PiperTtsBackend(voice=voice, deterministic=deterministic)
    backend.max_text_chars = max_text_chars
    return backend


def pocketsphinx_backend(slots: int) -> Any:
    from realtime_gw.models.speech.asr_pocketsphinx import PocketsphinxAsrBackend

    return PocketsphinxAsrBackend(slots=slots)


def utterance_bound(max_seconds: float) -> Callable[[Any], str | None]:
    """The ASR worker's cost bound: a committed utterance longer than ``max_seconds`` is refused at
    submit (its decode would hold a core for about as long), with the reason the client sees."""

    def admit(request: Any) -> str | None:
        if not isinstance(request, AsrRequest) or request.sample_rate <= 0:
            return None  # a stream's audio is decoded as it arrives; bad rates are the backend's to refuse
        seconds = len(request.pcm) / 2 / request.sample_rate
        if seconds <= max_seconds:
            return None
        return (
            f"utterance of {seconds:.1f} s is longer than the {max_seconds:g} s the gateway transcribes "
            "(asr_max_utterance_s); commit the audio in shorter turns"
        )

    return admit


def request_check(backend: Any) -> Callable[[Any], str | None]:
    """The TTS worker's ``admit``: an in-thread backend's own ``check_request`` (voice, speed, and what its
    model limits, e.g. Qwen3's instruction tokens) run at submit, so a bad request is refused before it
    takes a slot, with the reason the client sees (HTTP 400 on ``/v1/audio/speech``)."""

    def admit(request: Any) -> str | None:
        try:
            backend.check_request(request)
        except ValueError as e:
            return f"{backend.name}: {e}"
        return None

    return admit


def build_tts(config: GatewayConfig) -> StageWorker:
    if config.tts == "codec":
        from realtime_gw.models.speech.tts_codec import CodecTtsBackend

        # Every stream holds a slot and all of them advance each step: slots = batch = admission limit,
        # so a full worker refuses at submit ("no free slot") instead of queueing.
        slots = config.tts_max_batch
        codec = CodecTtsBackend(
            config=config.tts_shape, path=config.tts_path, device=config.tts_device, slots=slots
        )
        return _worker("tts", codec, config, device=config.tts_device, max_batch=slots, max_active=slots)
    if config.tts == "qwen3":
        from realtime_gw.models.speech.qwen3.voices import parse_voice_specs
        from realtime_gw.models.speech.tts_qwen3 import Qwen3TtsBackend

        slots = config.tts_max_batch
        try:
            qwen = Qwen3TtsBackend(
                path=config.tts_path,
                size=config.tts_shape,
                device=config.tts_device,
                slots=slots,
                voice=config.tts_voice,
                language=config.tts_language,
                instructions=config.tts_instructions,
                designs=parse_voice_specs(config.tts_voice_design, "--tts-voice-design"),
                clones=parse_voice_specs(config.tts_voice_clone, "--tts-voice-clone"),
                compile_predictor=config.tts_compile,
                pipelined=None if config.tts_pipelined else False,
            )
        except (ValueError, OSError, RuntimeError) as e:  # a bad voice spec or recording, a mismatched checkpoint
            raise ConfigError(f"--tts qwen3: {e}") from e
        return _worker(
            "tts", qwen, config, device=config.tts_device, max_batch=slots, max_active=slots,
            admit=request_check(qwen),
        )  # fmt: skip
    if config.tts == "tone":
        from realtime_gw.models.speech.tts_tone import ToneTtsBackend

        # In-thread: a beep costs microseconds of numpy per sentence and its text is bounded, so a
        # process hop would only add latency to what it exists to measure (gateway overhead).
        tone = ToneTtsBackend()
        tone.max_text_chars = config.tts_max_text_chars
        backend: Any = faults.wrap("tts", tone, config.fault_injection)
    else:
        factory = functools.partial(
            piper_backend, config.tts_voice, config.tts_max_text_chars, config.tts_deterministic
        )
        backend = _cpu_backend("tts", factory, "tts-piper", config)
    # Piper has no batched kernel: one sentence per step lets the scheduler put a new stream's first
    # sentence ahead of other streams' later ones. A small backlog keeps streams ~2 s ahead, no more.
    return _stage(backend, config, max_batch=1, max_active=config.worker_max_active, max_backlog=25)


def build_asr(config: GatewayConfig) -> StageWorker:
    if config.asr == "kyutai":
        from realtime_gw.models.speech.asr_kyutai import build_kyutai_asr

        # A GPU stage (in-thread, CUDA graphs): every stream holds a slot and all advance each step,
        # so slots = batch = admission limit, as for the codec TTS.
        return _worker(
            "asr",
            build_kyutai_asr(config),
            config,
            device=config.asr_device,
            max_batch=config.asr_max_batch,
            max_active=config.asr_max_batch,
            admit=utterance_bound(config.asr_max_utterance_s),
        )
    return _stage(
        _cpu_backend(
            "asr", functools.partial(pocketsphinx_backend, config.asr_slots), "asr-pocketsphinx", config
        ),
        config,
        max_batch=config.asr_slots,
        max_active=config.asr_slots,  # one decoder per request: a full pool refuses at submit
        admit=utterance_bound(config.asr_max_utterance_s),
    )


def build_vad(config: GatewayConfig) -> StageWorker:
    if config.vad_device:
        from realtime_gw.models.speech.vad_silero_torch import TorchSileroVadBackend

        # In-thread like the other torch stages: a slot (h, c row) per open stream, up to the worker's
        # admission limit; a round batches up to vad_max_batch streams (one graph bucket each on CUDA).
        silero = TorchSileroVadBackend(
            config.vad_device, slots=config.worker_max_active, max_batch=config.vad_max_batch
        )
        return _worker(
            "vad",
            silero,
            config,
            device=config.vad_device,
            max_batch=config.vad_max_batch,
            max_active=config.worker_max_active,
        )
    from realtime_gw.models.speech.vad_silero import SileroVadBackend

    # Silero stays in-thread: onnxruntime releases the GIL while it runs, one batched call per 32 ms
    # window costs ~1 ms, and a process hop on every window of every session would cost more than that.
    return _worker(
        "vad", SileroVadBackend(), config, max_batch=config.vad_max_batch, max_active=config.worker_max_active
    )


def build_turn(config: GatewayConfig) -> StageWorker:
    from realtime_gw.models.speech.turn_smart import TURN_MAX_BATCH, SmartTurnBackend

    # In-thread like Silero: onnxruntime releases the GIL; one batched call (~50 ms) per step.
    return _worker(
        "turn", SmartTurnBackend(), config, max_batch=TURN_MAX_BATCH, max_active=config.worker_max_active
    )


def build_policy(config: GatewayConfig) -> StageWorker:
    from realtime_gw.models.policy.factory import build_policy_backend, worker_max_wait_ms

    return _worker(
        "policy",
        build_policy_backend(config),
        config,
        device=config.policy_device,
        max_batch=config.policy_max_batch,
        max_wait_ms=worker_max_wait_ms(config),
        max_active=config.openpi_max_sessions * 2,
    )


STAGE_BUILDERS: dict[str, Callable[[GatewayConfig], StageWorker]] = {
    "tts": build_tts,
    "asr": build_asr,
    "vad": build_vad,
    "turn": build_turn,
    "policy": build_policy,
}


def build_stage(role: str, config: GatewayConfig) -> StageWorker:
    """One stage's worker, here (also what a Ray stage actor runs: ``models/remote/actor.py``)."""
    return STAGE_BUILDERS[role](config)


def build_workers(config: GatewayConfig) -> Workers:
    """Every stage the config asks for; those named in ``remote_stages`` are served by Ray actors
    shared with other front-ends (``models/remote``), the rest run here."""
    remote: list[str] = []
    if config.remote_stages:
        from realtime_gw.models.remote import remote_roles

        remote = remote_roles(config)

    def stage(role: str) -> StageWorker:
        if role in remote:
            from realtime_gw.models.remote import remote_stage

            return remote_stage(role, config, build_stage)  # type: ignore[return-value]  # StageWorker's interface
        return build_stage(role, config)

    workers = Workers(tts=stage("tts"), asr=stage("asr"), vad=stage("vad"), turn=stage("turn"))
    if config.policy != "none":
        workers.policy = stage("policy")
    workers.all = [
        w for w in (workers.tts, workers.asr, workers.vad, workers.turn, workers.policy) if w is not None
    ]
    return workers
