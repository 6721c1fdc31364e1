"""One config for the whole gateway: defaults < TOML file < environment < CLI flags.

Environment variables are ``REALTIME_GW_<FIELD>`` (upper case), e.g. ``REALTIME_GW_PORT=9000``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

ENV_PREFIX = "REALTIME_GW_"


class GatewayConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # -- server ---------------------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    """Bearer key for HTTP and /v1/realtime, ``Api-Key`` for the OpenPI socket; None = open."""
    api_keys: list[str] = msgspec.field(default_factory=list)
    """More accepted keys (each with its own session slots), in addition to ``api_key``."""
    max_sessions_per_key: int = 0
    """Open sessions (all sockets together) one key may hold; 0 = only the global limits."""
    session_starts_per_key_per_min: int = 0
    """Sessions one key may start in any 60 s (all sockets together); 0 = no limit. Over it: an error
    `rate_limit_exceeded` (realtime, speech stream) or HTTP 429 (OpenPI), with the wait in seconds."""
    allowed_origins: list[str] = msgspec.field(default_factory=list)
    """Browser origins allowed to open WebSockets besides the gateway's own; "*" = any."""
    log_level: str = "info"
    max_sessions: int = 256
    max_frame_bytes: int = 16 * 1024 * 1024
    """Largest WebSocket message accepted (uvicorn closes with 1009 above it)."""
    outbound_queue_frames: int = 2048
    """Per-session outbound events waiting for the socket; a client that stops reading is closed."""
    send_timeout_s: float = 10.0
    """A socket write blocked this long means the client stopped reading: close 1008."""
    audio_lead_ms: int = 400
    """How far ahead of real-time playback audio is sent (0 = as fast as produced)."""
    warmup: bool = True

    # -- connections: bounds and timeouts (docs/security.md, "Limits and timeouts") -------------------
    allowed_hosts: list[str] = msgspec.field(default_factory=list)
    """Names the gateway answers to besides localhost, 127.0.0.1, ::1, the bind address and any IP
    literal ("*.example.com" matches subdomains; "*" = any). Other ``Host`` headers get HTTP 421 (a DNS
    rebinding page names its own domain); browser ``Origin`` s are judged against the same list."""
    ws_per_message_deflate: bool = False
    """Offer permessage-deflate. Off: a small compressed frame can inflate to ``max_frame_bytes`` on the
    event loop (bounded by that size when on)."""
    max_header_bytes: int = 64 * 1024
    """Request line plus headers of one HTTP request or WebSocket upgrade (h11); above it: HTTP 400."""
    handshake_timeout_s: float = 10.0
    """A connection must finish its request line and headers within this (from its first byte or from
    its previous response): raw sockets that send nothing and endless headers are closed."""
    max_connections_per_client: int = 64
    """Open TCP connections (HTTP and WebSocket) from one client address; further ones get HTTP 429.
    0 = no cap. Behind a proxy every client shares its address: raise it or let the proxy cap."""
    realtime_idle_timeout_s: float = 900.0
    """A realtime session with no client event for this long gets `error` `session_expired`, then close
    1000. 0 = never."""
    realtime_max_session_s: float = 3600.0
    """Longest realtime session (OpenAI's limit is 60 min): `error` `session_expired`, then close 1000.
    0 = no limit."""
    speech_idle_timeout_s: float = 300.0
    """A speech stream with no client event for this long (and nothing being spoken): `error`
    `session_expired`, then close 1000. 0 = no limit."""
    speech_max_session_s: float = 3600.0
    """Longest speech stream: `error` `session_expired`, then close 1000. 0 = no limit."""
    speech_max_pending_chars: int = 16 * 1024
    """Speech stream text waiting to be spoken: the socket is not read while more waits; one
    `input.text` longer than this gets `error` `string_above_max_length`."""
    speech_max_utterance_chars: int = 256 * 1024
    """Text of one speech-stream utterance (from its first `input.text` to `input.done`); above it:
    `error` `string_above_max_length`, the piece dropped."""
    max_request_body_bytes: int = 1024 * 1024
    """Body of `POST /v1/audio/speech`; above it: HTTP 413."""
    input_audio_rate_factor: float = 10.0
    """Realtime input audio may arrive this many times faster than real time (counted in decoded
    bytes at 24 kHz PCM16, 48,000 B/s), after a burst of ``input_audio_burst_s``; beyond that the
    session's socket is read more slowly (backpressure), never refused. 0 = no limit."""
    input_audio_burst_s: float = 60.0
    """Seconds of audio a realtime session may send at once before the rate above applies."""

    # -- realtime voice -------------------------------------------------------------------------------
    max_input_buffer_bytes: int = 15 * 1024 * 1024
    """Bound on the decoded input audio buffer of one session (PCM16)."""
    max_conversation_items: int = 512
    """Items a session with ``truncation: "disabled"`` may hold; one more is refused `conversation_full`."""
    max_retained_items: int = 4096
    """Items a session with truncation on (``auto``, ``retention_ratio``) keeps in memory: past it the
    oldest are forgotten silently (the client's own view is untouched), so a long call never fills up."""
    max_instructions_chars: int = 64 * 1024
    """Session or response ``instructions``; longer: `error` `string_above_max_length`, nothing echoed."""
    max_item_text_chars: int = 64 * 1024
    """Each text of a conversation item (a text part, a transcript, function arguments, a function
    output; `input_image` URLs are bounded by `max_frame_bytes` only); longer: `error`
    `string_above_max_length`."""
    max_tools: int = 128
    """Function tools in `session.tools` or a response's `tools`; their JSON is capped at
    ``max_instructions_chars`` too."""
    responder_context_tokens: int = 8192
    """The chat backend's context window. With truncation on, the oldest items leave the model's
    context (never the client's view) so instructions + items + tools + the reserved reply fit it;
    tokens are estimated (about 4 UTF-8 bytes per token plus a per-message overhead)."""
    tts: Literal["piper", "tone", "codec", "qwen3"] = "piper"
    tts_voice: str = "joe"
    tts_deterministic: bool = False
    """Piper: speak each sentence without VITS' sampling noise, so the same text always gives the same
    audio (reproducible output and tests, cacheable); slightly flatter prosody. Off: Piper's default,
    different audio on every call."""
    tts_max_batch: int = 8
    """Streams advanced per step by batching TTS backends (``codec``); Piper and tone step one.
    For ``codec`` also its slot count: the most streams synthesising at once (64 suits a GPU)."""
    tts_path: str | None = None
    """`codec`: local weight directory (see realtime_gw/models/speech/codec/spec.py); `qwen3`: a published
    Qwen3-TTS-12Hz checkpoint directory, CustomVoice, VoiceDesign or Base (see models/speech/qwen3/checkpoint.py);
    None = random init."""
    tts_config: Literal["tiny", "full", "0.6b", "1.7b"] = "tiny"
    """Random-init shape. `codec`: `tiny` (CPU tests) or `full` (Qwen3-TTS-0.6B-shaped). `qwen3`: `0.6b`
    (also `full`/`tiny`) or `1.7b`, the published shapes."""
    tts_language: str = "auto"
    """`qwen3`: the language of speech ("auto" or one of the checkpoint's, e.g. "english")."""
    tts_instructions: str | None = None
    """`qwen3`: how to speak, in words, when a request gives no `instructions` (realtime sessions never
    do): a VoiceDesign checkpoint's default voice description; a CustomVoice checkpoint's style (1.7B)."""
    tts_voice_design: list[str] = msgspec.field(default_factory=list)
    """`qwen3` VoiceDesign: named voices, `NAME=description` each; `voice: NAME` selects one."""
    tts_voice_clone: list[str] = msgspec.field(default_factory=list)
    """`qwen3` Base: voices cloned at start-up from recordings, `NAME=path.wav` each (x-vector mode) or
    `NAME=path.wav:transcript` (ICL mode: the recording's codes and transcript in each prompt);
    `voice: NAME` selects one."""
    tts_device: str = "cpu"
    tts_compile: bool = False
    """`qwen3` on CUDA: torch.compile the code predictor's 15 passes a frame (four compiles at start-up,
    ~20 s). Measured on an H200 (docs/benchmarks.md): the predictor 0.7-0.8 ms faster a frame at 1-64
    streams, no faster at 256; its bf16 rounding differs from the uncompiled kernels'. Off by default."""
    tts_pipelined: bool = True
    """`qwen3` on CUDA: each frame's codec decoder runs behind the next frame's talker step (its own CUDA
    stream), overlapping it and the host's work between steps; a frame's audio leaves one step after its
    codes. Off: talker and decoder in one graph per step."""
    asr: Literal["pocketsphinx", "kyutai"] = "pocketsphinx"
    asr_slots: int = 4
    asr_path: str | None = None
    """`kyutai`: a transformers `save_pretrained` directory of KyutaiSpeechToTextForConditionalGeneration
    (e.g. kyutai/stt-1b-en_fr-trfs; see realtime_gw/models/speech/kyutai/checkpoint.py); None = random init."""
    asr_config: Literal["tiny", "1b"] = "tiny"
    """`kyutai` random-init shape: `tiny` (CPU tests) or `1b` (kyutai/stt-1b-en_fr)."""
    asr_device: str = "cpu"
    """`kyutai`: torch device (e.g. `cuda`, `cuda:1`)."""
    asr_max_batch: int = 64
    """`kyutai`: slots = streams transcribed at once, all advanced one 80 ms frame per step
    (loadtest/bench_asr_kyutai_gpu.py measures how many keep up with real time on a GPU)."""
    asr_flush_s: float | None = None
    """`kyutai`: seconds of silence run after a turn's audio to flush the text, which lags the audio by the
    model's delay; None = the reference's (delay + 1 s). Down to the delay (0.5 s for 1b): the transcript
    sooner, the last word possibly cut."""
    asr_catchup_steps: int = 0
    """`kyutai`: once a turn's input has ended, extra sub-steps per worker step that advance only the ending
    streams (one frame each, moved into the lowest slots so that their batch is small), so the flush does not
    wait one full-batch step per frame; 0 = off. The tokens are the same either way. Off by default: on the
    H200 it cut the ASR stage's own end-of-input -> transcript at 256 streams (p95 128 -> 88 ms with 7), but
    in the whole voice pipeline (TTS on the same GPU) it made turns slower at 64 sessions (docs/benchmarks.md);
    turn it on (e.g. 7) for a gateway whose GPU serves ASR alone."""
    asr_catchup_budget_ms: float = 50.0
    """`kyutai`: no catch-up sub-step starts once the worker step would pass this (its main step included),
    so the step stays inside the 80 ms frame; 0 = no time bound."""
    vad: Literal["silero"] = "silero"
    vad_max_batch: int = 64
    vad_device: str | None = None
    """Silero VAD in torch on this device (`cuda`, `cuda:1`, `cpu`): every session's next window in one
    batched forward, CUDA graphs on CUDA (models/speech/vad_silero_torch.py). None = onnxruntime's CPU
    provider (no torch import), right for CPU-only deployments; give `cuda` when ASR and TTS are on a GPU."""
    responder: Literal["echo", "openai"] = "echo"
    responder_url: str = "http://127.0.0.1:8001/v1"
    responder_model: str = "default"
    responder_api_key: str | None = None
    responder_max_tokens: int = 256
    responder_timeout_s: float = 30.0
    worker_max_active: int = 256
    worker_step_timeout_s: float = 30.0
    """A backend step running longer is a hang: the supervisor kills the backend's child process and
    starts a fresh one (in-thread backends: abandons the thread), and every slot comes back."""
    cpu_backends_in_process: bool = False
    """Run the GIL-holding CPU backends (pocketsphinx ASR, Piper TTS) on threads of the gateway process
    instead of one child process per worker (the default), e.g. where processes cannot be spawned.
    In-process, a long decode stalls the event loop and a hung step cannot be killed."""
    cpu_backend_spare: bool = True
    """Keep a second child per CPU worker built and warmed, so a killed step's worker is back at once
    (~0.2 s) instead of after a fresh start and warm-up (2-10 s on a busy 2-core box). Costs that
    backend's memory twice: ~440 MB for pocketsphinx with 4 slots, ~180 MB for Piper."""
    asr_max_utterance_s: float = 60.0
    """Longest committed utterance transcribed; a longer one fails its transcription with a clear error
    (the decode's cost grows with it; the input buffer itself may hold more)."""
    tts_max_text_chars: int = 256 * 1024
    """Text one TTS stream (a response's audio, a speech request, a speech-stream utterance) may receive
    in all (Piper, tone); more fails that stream. Keep it >= ``speech_max_utterance_chars``."""
    fault_injection: list[str] = msgspec.field(default_factory=list)
    """Tests only: e.g. ["tts:raise@3"], see realtime_gw/models/faults.py."""

    # -- scale-out on Ray (models/remote/, docs/architecture.md "Deployment on Ray") ------------------
    ray_address: str = ""
    """Ray cluster to join (e.g. "10.0.0.5:6379", or "auto"); used only when ``remote_stages`` names a
    stage. Needs the ``ray`` extra; without remote stages Ray is never imported."""
    remote_stages: str = ""
    """Comma-separated stages served by Ray actors shared by every front-end of the cluster: any of
    ``tts``, ``asr``, ``vad``, ``turn``, ``policy`` (e.g. "tts,policy"); the others stay in process."""
    ray_namespace: str = "realtime_gw"
    """Ray namespace of the named stage actors: front-ends in one namespace share the same actors."""
    ray_replicas: int = 1
    """Actors per remote stage (a stream sticks to the replica that opened it)."""
    ray_num_cpus: float = 1.0
    """CPUs Ray reserves for each stage actor."""
    ray_num_gpus: float | None = None
    """GPUs Ray reserves for each stage actor; None = 1 for a stage on a CUDA device, else 0."""
    ray_max_restarts: int = -1
    """Times Ray restarts a dead stage actor (-1: always)."""
    ray_lease_s: float = 0.9
    """A front-end silent this long (it polls every ~0.2 s) is dead: the actors end its streams."""

    # -- robots (OpenPI) ------------------------------------------------------------------------------
    policy: Literal["pi0", "noop", "none"] = "pi0"
    """`none` disables the robot socket and skips loading torch."""
    policy_config: Literal["tiny", "pi0"] = "tiny"
    policy_path: str | None = None
    policy_device: str = "cpu"
    policy_max_batch: int = 16
    policy_max_wait_ms: float = 2.0
    """How long the policy worker holds a step open for more robots once steps are being shared."""
    policy_impl: Literal["auto", "fast", "eager"] = "auto"
    """PI0 sampler: `fast` (static prefix KV, CUDA graphs per batch bucket), `eager` (transformers'
    `sample_actions`); `auto` = `fast` on CUDA, `eager` on the CPU. Both give the same actions."""
    policy_graph_buckets: list[int] = msgspec.field(default_factory=lambda: [1, 2, 4, 8, 16])
    """`fast` on CUDA: batch sizes with captured graphs; a batch runs padded to the next bucket."""
    policy_compile: Literal["auto", "on", "off"] = "auto"
    """`fast`: torch.compile the action expert's step (fuses its small kernels, plain and RTC loops) and
    the VLM prefix; `auto` = on with CUDA graphs (CUDA), off on the CPU. Costs start-up time (see the
    budget)."""
    policy_compile_budget_s: float = 450.0
    """Start-up seconds for compiling, bucket by bucket from the smallest; buckets (and prefix robot counts)
    begun after it run uncompiled. Inductor's on-disk cache makes later start-ups much shorter."""
    policy_compile_cache: str = "auto"
    """`fast` with `policy_compile`: directory of the on-disk compile cache that lets a warm start-up skip
    inductor's work, one file per key (model config, dtype, shapes, torch and transformers versions, GPU,
    sampler code); `auto` = $XDG_CACHE_HOME/realtime-gw/policy-compile (~/.cache/...), `off` = none."""
    policy_fp8: bool = False
    """`fast`: the VLM prefix's projections (SigLIP and Gemma) in FP8 e4m3 with row-wise scales (the action
    expert stays in the model dtype). Served only if a start-up probe's actions stay within
    `policy_fp8_max_error` of transformers' `sample_actions`; else the prefix runs in the model dtype and
    `/readyz` says why (`detail.policy.fp8`). Pays on GPUs with FP8 tensor cores (Hopper and later)."""
    policy_fp8_max_error: float = 0.05
    """`policy_fp8`'s guard: the largest relative L2 error (model-space actions of the probe) served."""
    policy_phase_steps: int = 0
    """`fast`: denoising steps each robot's chunk advances per worker step (phases). A robot that arrives
    while other chunks run then waits for one worker step of theirs, not for their whole chunks (on CUDA
    its prefix runs on a second stream beside their steps; elsewhere it delays them); 0 = one-shot
    chunks (the prefix and every step in one worker step), the default until a GPU run shows phases
    paying (docs/benchmarks.md: on the CPU they did not under load). With phases the worker holds no
    step open for more robots (`policy_max_wait_ms`)."""
    policy_rtc_beta: float = 5.0
    """Real-time chunking: clip of the guidance weight (the RTC paper's beta)."""
    policy_norm_stats: str | None = None
    """Statistics file: openpi's norm_stats.json, LeRobot's stats.json / normalizer safetensors, or
    transformers' processor_config.json; None = the one inside `policy_path`, if any."""
    policy_norm_mode: Literal["auto", "zscore", "quantile"] = "auto"
    """`zscore` (PI0) or `quantile` (PI0-FAST, PI0.5) normalization; `auto` = what the checkpoint's
    config.json names (`use_quantile_norm`, LeRobot's `normalization_mapping`), else `zscore`."""
    policy_state_in_prompt: Literal["auto", "on", "off"] = "auto"
    """Write the normalized state into the prompt as openpi's discrete state tokens; `auto` = the
    checkpoint's config.json `discrete_state_input`."""
    robot: Literal["generic", "droid", "libero", "aloha"] = "generic"
    """openpi robot preset: the observation keys, image conventions, state layout and action space of
    openpi's DROID / LIBERO / ALOHA policies; `generic` = the configurable `policy_*` keys below."""
    robot_delta_actions: bool | None = None
    """`libero` / `aloha`: joint actions relative to the state (openpi's DeltaActions); None = as openpi's
    PI0 checkpoint for the robot was trained (pi0_libero, pi0_aloha: on)."""
    robot_adapt_to_pi: bool = True
    """`aloha`: convert joints and grippers between standard ALOHA and the PI runtime (openpi's adapt_to_pi)."""
    robot_default_prompt: str | None = None
    """The prompt of observations that carry none (openpi's default_prompt)."""
    openpi_tracebacks: bool = False
    openpi_idle_timeout_s: float = 30.0
    openpi_max_sessions: int = 64
    openpi_max_frame_bytes: int = 64 * 1024 * 1024
    openpi_image_history: list[int] = msgspec.field(default_factory=lambda: [0])
    openpi_state_history: list[int] = msgspec.field(default_factory=lambda: [0])
    openpi_max_robots: int = 64
    """Distinct ``session_id`` histories one OpenPI connection may hold."""
    policy_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """`auto`: bfloat16 on CUDA, float32 on the CPU."""
    policy_state_dim: int = 8
    policy_action_dim: int = 8
    policy_cameras: list[str] = msgspec.field(
        default_factory=lambda: [
            "observation/exterior_image_1_left",
            "observation/wrist_image_left",
            "observation/exterior_image_2_left",
        ]
    )
    """Observation image keys in model camera-slot order (at most 3 for PI0)."""
    policy_optional_cameras: list[str] = msgspec.field(
        default_factory=lambda: ["observation/exterior_image_2_left"]
    )
    """Cameras a robot may leave out; their slot is masked."""


FIELDS = {f.name: f for f in msgspec.structs.fields(GatewayConfig)}


class ConfigError(ValueError):
    """The configuration cannot serve (a file missing, or not matching another); the message names the
    file and what to change. ``realtime-gw serve`` prints it and exits."""


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in FIELDS:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is None:
            continue
        # Lists come as JSON ("[-2,-1,0]"); everything else is converted from the string.
        out[name] = msgspec.json.decode(raw) if raw.startswith("[") else raw
    return out


def load_config(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> GatewayConfig:
    """Merge defaults, a TOML file, ``REALTIME_GW_*`` variables and explicit overrides, in that order."""
    merged: dict[str, Any] = {}
    if path is not None:
        merged.update(msgspec.toml.decode(Path(path).read_bytes()))
    merged.update(_from_env(os.environ if env is None else env))
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    # strict=False lets "9000" (env) become 9000 and "true" become True.
    return msgspec.convert(merged, GatewayConfig, strict=False)
