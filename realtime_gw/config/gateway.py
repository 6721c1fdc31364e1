"""The gateway's settings, section by section.

Each section is a struct adding its fields to the one before it (msgspec structs inherit along one line),
so ``GatewayConfig`` at the end holds every field flat (``config.tts_device``) while each field still
belongs to exactly one section, named by its class's ``SECTION``. A section's docstring is what users
read above its flags in ``realtime-gw serve --help`` and above its table in ``realtime-gw config --show``;
a field's docstring is its help. ``KEYS`` names a field in its TOML table where the field's name less
the section's prefix (``tts_device`` -> ``[tts] device``) would not read well. The line starts with the
front's sections (server, limits, realtime, speech, responder, mcp) in ``config.front``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from realtime_gw.config.front import ConfigError, McpSettings


class TtsSettings(McpSettings, kw_only=True):
    """Text to speech: the family, its voice and device; the batching families' (codec, qwen3) shape."""

    SECTION: ClassVar[str] = "tts"
    KEYS: ClassVar[dict[str, str]] = {"tts": "family"}
    tts: Literal["piper", "tone", "codec", "qwen3"] = "piper"
    """`piper` (Piper VITS on the CPU), `tone` (a beep per sentence, for measuring the gateway),
    `codec` (a streaming codec LM, tests and GPU benches), `qwen3` (Qwen3-TTS-12Hz)."""
    tts_voice: str = "joe"
    """The voice of requests and sessions that name none: Piper's `joe`; `qwen3`: one of the checkpoint's
    voices (a name it does not have falls back to its default voice)."""
    tts_device: str = "cpu"
    """`codec`, `qwen3`: torch device (e.g. `cuda`, `cuda:1`)."""
    tts_path: str | None = None
    """`codec`: local weight directory (see realtime_gw/models/speech/codec/spec.py); `qwen3`: a
    published Qwen3-TTS-12Hz checkpoint directory, CustomVoice, VoiceDesign or Base (see
    models/speech/qwen3/checkpoint.py); unset = random init at ``tts_config``'s shape."""
    tts_config: Literal["auto", "tiny", "full", "0.6b", "1.7b"] = "auto"
    """Random-init shape: `codec` has `tiny` (CPU tests) and `full` (Qwen3-TTS-0.6B-shaped); `qwen3` has the
    published `0.6b` and `1.7b`; `auto` = the family's first. A shape the family lacks is refused."""
    tts_max_batch: int = 8
    """`codec`, `qwen3`: slots, the streams synthesising at once, all advanced together each step (one
    more is refused, "no free slot"); 64 suits a GPU. Piper and tone speak one sentence a step and admit
    ``worker_max_active`` streams."""
    tts_max_text_chars: int = 256 * 1024
    """Text one TTS stream (a response's audio, a speech request, a speech-stream utterance) may receive
    in all (Piper, tone); more fails that stream. Keep it >= ``speech_max_utterance_chars``."""

    @property
    def tts_shape(self) -> str:
        """``tts_config`` with `auto` resolved to the family's default shape."""
        shapes = TTS_SHAPES.get(self.tts, ())
        return shapes[0] if self.tts_config == "auto" and shapes else self.tts_config


TTS_SHAPES: dict[str, tuple[str, ...]] = {"codec": ("tiny", "full"), "qwen3": ("0.6b", "1.7b")}
"""Random-init shapes of the TTS families that have them, the default first."""


class PiperSettings(TtsSettings, kw_only=True):
    """Piper only."""

    SECTION: ClassVar[str] = "tts.piper"
    tts_deterministic: bool = False
    """Speak each sentence without VITS' sampling noise, so the same text always gives the same audio
    (reproducible output and tests, cacheable); slightly flatter prosody. Off: Piper's default,
    different audio on every call."""


class Qwen3Settings(PiperSettings, kw_only=True):
    """Qwen3-TTS only: language, voices, and how it runs on CUDA."""

    SECTION: ClassVar[str] = "tts.qwen3"
    tts_language: str = "auto"
    """The language of speech ("auto" or one of the checkpoint's, e.g. "english")."""
    tts_instructions: str | None = None
    """How to speak, in words, when a request gives no `instructions` (realtime sessions never do): a
    VoiceDesign checkpoint's default voice description; a CustomVoice checkpoint's style (1.7B)."""
    tts_voice_design: list[str] = msgspec.field(default_factory=list)
    """VoiceDesign checkpoint: named voices, `NAME=description` each; `voice: NAME` selects one."""
    tts_voice_clone: list[str] = msgspec.field(default_factory=list)
    """Base checkpoint: voices cloned at start-up from recordings, `NAME=path.wav` each (x-vector mode) or
    `NAME=path.wav:transcript` (ICL mode: the recording's codes and transcript in each prompt);
    `voice: NAME` selects one."""
    tts_compile: bool = False
    """On CUDA: torch.compile the code predictor's 15 passes a frame (four compiles at start-up, ~20 s):
    a little faster per frame at small batches, no faster at large ones, and its bf16 rounding differs
    from the uncompiled kernels' (docs/benchmarks.md). On, it replaces `tts_fused`'s kernels."""
    tts_fused: bool = False
    """On CUDA with Triton installed: a frame's decoder layers (the talker's stack and the code predictor's
    15 passes, sampling included) may run on fused Triton kernels (six a layer: norms, rotary, residuals
    inside them) in the frame's CUDA graph; the same codes as the eager layers in float32. At warm-up,
    per batch bucket, the talker's layers and the code predictor each run fused only if their graph
    replays faster that way (timed; the log says what was kept), the kernels' tiles tuned per shape on
    the device first (`loadtest/bench/fused_gpu.py` measures both paths). Off by default: faster alone
    at small batches, but with the ASR and VAD sharing the GPU under full load its reply frames came later
    (docs/benchmarks.md). Costs seconds of warm-up (tuning and timing). Ignored on the CPU and without
    Triton."""
    tts_pipelined: bool = True
    """On CUDA: each frame's codec decoder runs behind the next frame's talker step (its own CUDA
    stream), overlapping it and the host's work between steps; a frame's audio leaves one step after its
    codes. Off: talker and decoder in one graph per step."""
    tts_max_frames: int = 2048
    """The longest reply one stream speaks, in frames (12.5 a second: 2048 = 164 s; at least 256), prompt
    included; longer text is cut there. Each slot holds this many positions of K/V from the start (0.6B:
    112 KiB a position, 224 MiB a slot at 2048), so slots x frames is the stage's memory: 320 slots at 2048
    need ~70 GiB, 1024 frames half that."""


class AsrSettings(Qwen3Settings, kw_only=True):
    """Speech to text of the realtime sessions' input audio."""

    SECTION: ClassVar[str] = "asr"
    KEYS: ClassVar[dict[str, str]] = {"asr": "family"}
    asr: Literal["pocketsphinx", "kyutai"] = "pocketsphinx"
    """`pocketsphinx` (CPU, transcribes each committed turn) or `kyutai` (streaming, transcribes while
    the user speaks; for a GPU)."""
    asr_max_utterance_s: float = 60.0
    """Longest committed utterance transcribed; a longer one fails its transcription with a clear error
    (the decode's cost grows with it; the input buffer itself may hold more)."""


class PocketsphinxSettings(AsrSettings, kw_only=True):
    """Pocketsphinx only."""

    SECTION: ClassVar[str] = "asr.pocketsphinx"
    asr_slots: int = 4
    """Decoders, the utterances transcribed at once; one more is refused at once ("no free slot")."""


class KyutaiSettings(PocketsphinxSettings, kw_only=True):
    """Kyutai streaming speech to text only."""

    SECTION: ClassVar[str] = "asr.kyutai"
    asr_path: str | None = None
    """A transformers `save_pretrained` directory of KyutaiSpeechToTextForConditionalGeneration
    (e.g. kyutai/stt-1b-en_fr-trfs; see realtime_gw/models/speech/kyutai/checkpoint.py); unset = random
    init."""
    asr_config: Literal["tiny", "1b"] = "tiny"
    """Random-init shape: `tiny` (CPU tests) or `1b` (kyutai/stt-1b-en_fr)."""
    asr_device: str = "cpu"
    """Torch device (e.g. `cuda`, `cuda:1`)."""
    asr_max_batch: int = 64
    """Slots, the streams transcribed at once, all advanced one 80 ms frame per step
    (loadtest/bench/asr_kyutai_gpu.py measures how many keep up with real time on a GPU)."""
    asr_flush_s: float | None = None
    """Seconds of silence after a turn's speech to flush the text, which lags the audio by the model's
    delay; the silence server VAD heard before it ended the turn counts toward it, the rest is run at
    once. Unset = the reference's (delay + 1 s), but after a heard silence no more than Kyutai's Unmute
    runs after a pause (the delay in whole frames plus one: 0.64 s for 1b). Down to the delay (0.5 s for
    1b): the transcript sooner, the last word possibly cut."""
    asr_catchup_steps: int = 0
    """Once a turn's input has ended, extra sub-steps per worker step that advance only the ending streams
    (one frame each, moved into the lowest slots so that their batch is small), so the flush does not wait
    one full-batch step per frame; 0 = off. The tokens are the same either way. It pays for a GPU that
    serves ASR alone (e.g. 7); with TTS on the same GPU it can make whole turns slower
    (docs/benchmarks.md)."""
    asr_catchup_budget_ms: float = 50.0
    """No catch-up sub-step starts once the worker step would pass this (its main step included), so the
    step stays inside the 80 ms frame; 0 = no time bound."""


class VadSettings(KyutaiSettings, kw_only=True):
    """Voice activity detection of the realtime sessions' input audio (server VAD turns)."""

    SECTION: ClassVar[str] = "vad"
    KEYS: ClassVar[dict[str, str]] = {"vad": "family"}
    vad: Literal["silero"] = "silero"
    """Silero VAD, the only family."""
    vad_max_batch: int = 64
    """Streams whose next 32 ms window is judged in one batched call."""
    vad_step_ms: float = 32.0
    """The VAD steps at most once per this many ms while audio flows, every stream's windows completed
    since the last step in one batched call: calls send 20 ms at a time, each at its own phase, and
    stepping on every arrival runs many one-row calls (docs/benchmarks.md). A window waits at most this
    long while the worker keeps up, however many streams (the first of a run after a pause: no tick at
    all). 0 = step whenever any stream has new audio; at most 100."""
    vad_device: str | None = None
    """Silero VAD in torch on this device (`cuda`, `cuda:1`, `cpu`): every session's next window in one
    batched forward, CUDA graphs on CUDA (models/speech/vad_silero_torch.py). Unset = onnxruntime's CPU
    provider (no torch import), right for CPU-only deployments; give `cuda` when ASR and TTS are on a GPU."""


class WorkerSettings(VadSettings, kw_only=True):
    """The stage workers that run every model (TTS, ASR, VAD, turn detection, policy)."""

    SECTION: ClassVar[str] = "workers"
    KEYS: ClassVar[dict[str, str]] = {
        "worker_max_active": "max_active", "worker_step_timeout_s": "step_timeout_s",
    }  # fmt: skip
    warmup: bool = True
    """Run every model once before the gateway reports ready, so the first users do not pay for it."""
    worker_max_active: int = 256
    """Streams a worker without fixed slots admits at once (Piper TTS, VAD, turn detection); one more is
    refused at once ("no free slot")."""
    worker_step_timeout_s: float = 30.0
    """A backend step running longer is a hang: the supervisor kills the backend's child process and
    starts a fresh one (in-thread backends: abandons the thread), and every slot comes back."""
    cpu_backends_in_process: bool = False
    """Run the GIL-holding CPU backends (pocketsphinx ASR, Piper TTS) on threads of the gateway process
    instead of one child process per worker (the default), e.g. where processes cannot be spawned.
    In-process, a long decode stalls the event loop and a hung step cannot be killed."""
    cpu_backend_spare: bool = True
    """Keep a second child per CPU worker built and warmed, so a killed step's worker is back at once
    instead of after a fresh start and warm-up. Costs that backend's memory twice (hundreds of MB for
    pocketsphinx, less for Piper)."""
    device_clock: list[str] = msgspec.field(default_factory=list)
    """Devices whose stages share one clock: their steps run one at a time, earliest deadline first
    (each stream's 80 ms frame, docs/architecture.md), instead of time-slicing the device from each
    stage's thread. `cuda` = every CUDA device (one clock each), `cuda:1` = that one, `cpu` = the stages
    on the CPU; `[]` (the default) = off everywhere: on a GPU the voice pipeline did worse with it
    (docs/benchmarks.md), since stages whose steps overlap keep the device busier."""
    gil_switch_interval_ms: float | None = None
    """Python's GIL switch interval in the gateway process (`sys.setswitchinterval`); unset = Python's 5 ms.
    Smaller: a stage's thread that the device clock granted the device (or whose step's results are
    ready) takes the GIL from a busy event loop sooner, at some cost in switching."""
    fault_injection: list[str] = msgspec.field(default_factory=list)
    """Tests only: e.g. ["tts:raise@3"], see realtime_gw/models/faults.py."""


class PolicySettings(WorkerSettings, kw_only=True):
    """The robot policy model behind the OpenPI socket, and how it samples actions."""

    SECTION: ClassVar[str] = "policy"
    KEYS: ClassVar[dict[str, str]] = {"policy": "model"}
    policy: Literal["pi0", "pi05", "noop", "none"] = "pi0"
    """`pi0` (transformers' PI0ForConditionalGeneration), `pi05` (π0.5, PI05ForConditionalGeneration),
    `noop` (zero actions, for tests without torch); `none` disables the robot socket and skips loading
    torch."""
    policy_config: Literal["tiny", "pi0"] = "tiny"
    """Random-init shape when ``policy_path`` is unset: `tiny` (CPU tests) or `pi0` (the published
    architecture of the chosen model, PI0's or π0.5's)."""
    policy_path: str | None = None
    """A transformers `save_pretrained` directory of the chosen model (its config.json `model_type` is
    `pi0` or `pi05`), with its tokenizer and normalization statistics; unset = random init at
    ``policy_config``."""
    policy_device: str = "cpu"
    """Torch device (e.g. `cuda`, `cuda:1`)."""
    policy_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """`auto`: bfloat16 on CUDA, float32 on the CPU."""
    policy_max_batch: int = 16
    """Robots whose action chunks are sampled in one batch."""
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
    policy_fused: bool = False
    """`fast` on CUDA with Triton installed: the action expert's denoising step may run on fused Triton
    kernels (six a layer, norms and residuals inside the GEMMs) instead of compiled or eager code, the
    RTC-guided step too (its backward written out, torch GEMMs). At warm-up, per batch bucket and step
    kind, the fused step is kept only if its graph replays faster than today's (timed; `/readyz`'s
    warm-up report and the log say which), the kernels' tiles tuned per shape on the device first.
    Ignored on the CPU and without Triton."""
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
    chunks (the prefix and every step in one worker step). With phases the worker holds no step open for
    more robots (`policy_max_wait_ms`)."""
    policy_rtc_beta: float = 5.0
    """Real-time chunking: clip of the guidance weight (the RTC paper's beta)."""
    policy_norm_stats: str | None = None
    """Statistics file: openpi's norm_stats.json, LeRobot's stats.json / normalizer safetensors, or
    transformers' processor_config.json; unset = the one inside `policy_path`, if any."""
    policy_norm_mode: Literal["auto", "zscore", "quantile"] = "auto"
    """`zscore` (PI0) or `quantile` (PI0-FAST, PI0.5) normalization; `auto` = what the checkpoint's
    config.json names (`use_quantile_norm`, LeRobot's `normalization_mapping`), else the model's own
    (`quantile` for `pi05`, `zscore` for `pi0`)."""
    policy_state_in_prompt: Literal["auto", "on", "off"] = "auto"
    """Write the normalized state into the prompt as openpi's discrete state tokens; `auto` = the
    checkpoint's config.json `discrete_state_input`, else on for `pi05` (openpi's π0.5 configs) except
    with the `libero` robot (openpi's `pi05_libero`), off for `pi0`."""


class RobotSettings(PolicySettings, kw_only=True):
    """The robots' observations and actions: an openpi preset, or the generic layout below."""

    SECTION: ClassVar[str] = "robot"
    KEYS: ClassVar[dict[str, str]] = {
        "robot": "preset", "openpi_image_history": "image_history", "openpi_state_history": "state_history",
        "policy_state_dim": "state_dim", "policy_action_dim": "action_dim", "policy_cameras": "cameras",
        "policy_optional_cameras": "optional_cameras",
    }  # fmt: skip
    robot: Literal["generic", "droid", "libero", "aloha"] = "generic"
    """openpi robot preset: the observation keys, image conventions, state layout and action space of
    openpi's DROID / LIBERO / ALOHA policies; `generic` = the state, action and camera layout below."""
    robot_delta_actions: bool | None = None
    """`libero` / `aloha`: joint actions relative to the state (openpi's DeltaActions); unset = as openpi's
    checkpoint of the model for the robot was trained (pi0_libero, pi0_aloha, pi05 on ALOHA: on;
    pi05_libero: off)."""
    robot_adapt_to_pi: bool = True
    """`aloha`: convert joints and grippers between standard ALOHA and the PI runtime (openpi's
    adapt_to_pi)."""
    robot_default_prompt: str | None = None
    """The prompt of observations that carry none (openpi's default_prompt)."""
    robot_control_hz: float | None = None
    """The control rate the robot is expected to execute actions at, stated in the metadata frame's
    `action_contract`; unset = the preset's (DROID 15, LIBERO 20, ALOHA 50 Hz), none for `generic`."""
    openpi_image_history: list[int] = msgspec.field(default_factory=lambda: [0])
    """Frames the model sees of every camera, as offsets from the current one (0), oldest first; e.g.
    [-2, -1, 0] = the last three observations' images."""
    openpi_state_history: list[int] = msgspec.field(default_factory=lambda: [0])
    """States the model sees, as offsets from the current one (0), oldest first."""
    policy_state_dim: int = 8
    """`generic`: length of the observation's state vector."""
    policy_action_dim: int = 8
    """`generic`: length of each action the policy returns."""
    policy_cameras: list[str] = msgspec.field(
        default_factory=lambda: [
            "observation/exterior_image_1_left",
            "observation/wrist_image_left",
            "observation/exterior_image_2_left",
        ]
    )
    """`generic`: observation image keys in model camera-slot order (at most 3 for PI0)."""
    policy_optional_cameras: list[str] = msgspec.field(
        default_factory=lambda: ["observation/exterior_image_2_left"]
    )
    """`generic`: cameras a robot may leave out; their slot is masked."""


class OpenpiSettings(RobotSettings, kw_only=True):
    """The OpenPI robot socket (openpi's websocket policy server protocol)."""

    SECTION: ClassVar[str] = "openpi"
    openpi_max_sessions: int = 64
    """OpenPI connections open at once (within ``max_sessions``); the policy worker keeps two slots for
    each."""
    openpi_max_robots: int = 64
    """Distinct ``session_id`` histories one OpenPI connection may hold."""
    openpi_idle_timeout_s: float = 30.0
    """A robot connection that sends no frame for this long (while no reply is due) is closed; 0 = never."""
    openpi_max_frame_bytes: int = 64 * 1024 * 1024
    """Largest observation message accepted on the robot socket (images make it larger than
    ``max_frame_bytes``)."""
    openpi_tracebacks: bool = False
    """On an internal error, send the Python traceback as the last text frame before close 1011 (as
    openpi's server does); off: one line naming the error."""


class RaySettings(OpenpiSettings, kw_only=True):
    """Scale-out: stages served by Ray actors that several front-ends share (docs/architecture.md)."""

    SECTION: ClassVar[str] = "ray"
    remote_stages: str = ""
    """Comma-separated stages served by Ray actors shared by every front-end of the cluster: any of
    ``tts``, ``asr``, ``vad``, ``turn``, ``policy``, ``s2s`` (e.g. "tts,policy"); the others stay in
    process. ``s2s``: one actor steps the conversations of every front-end in its 80 ms lockstep; a
    session is answered open or full as by a local stage, one round trip later; the stage's metrics
    (late steps, concealed frames) are the actor's, not the front-end's."""
    ray_address: str = ""
    """Ray cluster to join (e.g. "10.0.0.5:6379", or "auto"); used only when ``remote_stages`` names a
    stage. Needs the ``ray`` extra; without remote stages Ray is never imported."""
    ray_namespace: str = "realtime_gw"
    """Ray namespace of the named stage actors: front-ends in one namespace share the same actors."""
    ray_replicas: int = 1
    """Actors per remote stage (a stream sticks to the replica that opened it)."""
    ray_num_cpus: float = 1.0
    """CPUs Ray reserves for each stage actor."""
    ray_num_gpus: float | None = None
    """GPUs Ray reserves for each stage actor; unset = 1 for a stage on a CUDA device, else 0."""
    ray_max_restarts: int = -1
    """Times Ray restarts a dead stage actor (-1: always)."""
    ray_lease_s: float = 0.9
    """A front-end silent this long (it polls every ~0.2 s) is dead: the actors end its streams."""


class S2sSettings(RaySettings, kw_only=True):
    """The full-duplex speech-to-speech stage: one model that listens and speaks at once, every live
    conversation advanced in one batched step per 80 ms (models/s2s)."""

    SECTION: ClassVar[str] = "s2s"
    KEYS: ClassVar[dict[str, str]] = {"s2s": "family"}
    s2s: Literal["none", "moshi", "personaplex"] = "none"
    """`none` (no speech-to-speech stage), `moshi` (Kyutai's Moshi) or `personaplex` (NVIDIA's PersonaPlex:
    Moshi with a voice prompt and a text persona, a session's instructions); for a GPU, `tiny` runs on a
    CPU."""
    s2s_path: str | None = None
    """A directory of the published files (model.safetensors, the Mimi tokenizer-*.safetensors, the
    SentencePiece tokenizer_spm_32k_3.model; e.g. kyutai/moshiko-pytorch-bf16 or nvidia/personaplex-7b-v1),
    loaded strictly; unset = random init at `s2s_config`."""
    s2s_config: Literal["tiny", "7b"] = "tiny"
    """Random-init shape: `tiny` (CPU tests) or `7b` (moshiko/moshika or personaplex-7b-v1 as published)."""
    s2s_voices_dir: str | None = None
    """PersonaPlex's voices: a directory of voice samples (NAME.wav/.flac/.ogg), each encoded once into
    its prompt's codes, kept beside it (NAME.prompt.npz), and NVIDIA's published voices as shipped
    (voices.tgz: NAME.pt); a session names one as its voice."""
    s2s_voice: str | None = None
    """PersonaPlex: the voice (of `s2s_voices_dir`) of a session that names none; unset = no voice prompt."""
    s2s_device: str = "cpu"
    """Torch device (e.g. `cuda`, `cuda:1`)."""
    s2s_slots: int = 4
    """Conversations held at once (each holds a slot, its ring KV, for its whole life); one more is
    refused at once. loadtest/bench/s2s_gpu.py measures how many keep the 80 ms step on a GPU."""
    s2s_batch_buckets: list[int] = msgspec.field(default_factory=list)
    """Batch sizes with a CUDA graph (one per KV-length bucket, captured at start); live conversations run
    padded to the next one (`s2s_slots` is always one). Empty: powers of two to 32, then four per doubling
    (40, 48, 56, 64, 80, ...), since at a full context a padded row costs as much as a live one; 64 slots
    then take 70 graphs (49 with powers of two alone)."""
    s2s_seed: int | None = None
    """Sampling seed of a conversation opened without one: this plus the count of conversations opened
    before it; unset = random."""
    s2s_temperature: float = 0.8
    """Audio sampling temperature (Moshi's published 0.8); <= 0 is greedy."""
    s2s_top_k: int = 250
    """Audio top-k (Moshi's published 250)."""
    s2s_text_temperature: float = 0.7
    """Text sampling temperature (Moshi's published 0.7); <= 0 is greedy."""
    s2s_text_top_k: int = 25
    """Text top-k (Moshi's published 25)."""
    s2s_kv_dtype: Literal["model", "fp8"] = "model"
    """The temporal transformer's ring K/V: `model` (the LM's dtype: bf16 on a GPU) or `fp8` (e4m3 with
    a float32 scale per slot, head and position: half the bytes each step reads and holds, so 64
    full-context 7B conversations fit an 80 GB GPU; about 3 % relative L2 error in attention's output)."""


class GatewayConfig(S2sSettings, kw_only=True, forbid_unknown_fields=True):
    """Every setting of the gateway, flat: ``config.<field>``. Its sections are the classes above."""

    def __post_init__(self) -> None:
        if self.tts_max_frames < 256:
            raise ConfigError(
                f"tts_max_frames must be >= 256 (a voice's prompt and a sentence), got {self.tts_max_frames}"
            )
        shapes = TTS_SHAPES.get(self.tts)
        if shapes and self.tts_config not in ("auto", *shapes):
            raise ConfigError(
                f"tts_config {self.tts_config!r} is not a shape of tts {self.tts!r}: "
                f"use one of {', '.join(shapes)} (or auto = {shapes[0]})"
            )


SECRETS = (
    "api_key",
    "api_keys",
    "responder_api_key",
    "webrtc_client_secret_key",
    "webrtc_client_secret_previous_keys",
)
"""Fields that are credentials: never sent to stage actors, never printed by ``config --show``."""
