"""Qwen3-TTS backend (``--tts qwen3``): a published Qwen3-TTS-12Hz checkpoint, streaming.

Same contract as the other TTS backends (``tts_base``): text in pieces, then ``END_OF_INPUT``; 24 kHz
PCM16 ``TtsFrame`` deltas of 1920 samples, the last ``final=True`` (it may be empty). Every step advances
every stream that has text by one 80 ms frame, all streams in one batched talker + code predictor +
codec-decoder step (``qwen3/engine.py``); a new stream starts in its first step from its prompt's K/V
(prefilled once per voice and language, at warm-up, and cached), so its first audio is one frame step.

Text leads audio by one token per frame (the model's streaming mode); words are released to the talker
once whitespace follows them (``streaming/text_feed.TextFeed``). A stream whose text has not ended and whose
tokens are all spoken waits. Once the text has ended: ``tts_eos`` once, then ``tts_pad``, until the model
emits codec EOS (allowed from the third frame on, once every text token was fed), or at most
``max_frames_per_token * tokens + tail_frames`` frames (random-init weights never learned EOS: they stop
after ``tail_frames``), capped by the slot length.

Voices depend on the checkpoint kind (``tts_model_type``):

- CustomVoice: the checkpoint's speakers (``voice`` selects one, case-insensitive); "default" and
  OpenAI's voice names map onto speakers by ``OPENAI_SPEAKERS`` (else the default speaker). A request's
  ``instructions`` (else the server's ``instructions``) is the reference's ``instruct`` (speaking style),
  except at 0.6B, where the reference ignores it.
- VoiceDesign: the voice is a description (``instruct``): the request's ``instructions``, else the named
  design's (``designs``: name -> description, ``--tts-voice-design``) that ``voice`` selects, else the
  server's ``instructions``; "default" and OpenAI names select the default design (or none).
- Base: voices cloned from recordings at start-up (``clones``: name -> ``path.wav[:transcript]``,
  ``--tts-voice-clone``; ``qwen3/voices.py``): ``voice`` selects one, "default" and OpenAI names the
  default. ``instructions`` does not apply (the reference's clone prompt has none). With a transcript
  (ICL) the prompt holds the utterance's first text tokens: the stream holds its slot and waits for them
  (``step``, ``has_work``), then its prompt is built (``voices.icl_start``) and prefilled, uncached.

``language`` ("auto" or one of the checkpoint's) is a backend setting. ``speed`` is validated, not applied.
Every voice's prompt is prefilled at warm-up (its K/V cached; ``voice_prompts``), so a stream's first step
is one frame step; a request with its own ``instructions`` prefills its prompt at its first step (then
cached too). An ICL clone's per-utterance prompts are prefilled uncached (they evict no cached prompt), and
warm-up prefills none for it.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from realtime_gw.config import GatewayConfig
from realtime_gw.models import fused
from realtime_gw.models.families import StagePlan
from realtime_gw.models.runtime import StepResult
from realtime_gw.models.speech.custom_voices import VoiceRecords
from realtime_gw.models.speech.qwen3.checkpoint import Qwen3TtsCheckpoint, load_checkpoint, random_checkpoint
from realtime_gw.models.speech.qwen3.engine import Prompt, Qwen3Engine, build_prompt
from realtime_gw.models.speech.qwen3.talker import Sampling
from realtime_gw.models.speech.qwen3.voices import (
    ClonedVoice,
    clone_voice,
    icl_start,
    icl_tokens_needed,
    parse_voice_specs,
    x_vector,
)
from realtime_gw.models.speech.streaming.text_feed import TextFeed, TextTokenizer
from realtime_gw.models.speech.tts_base import (
    OPENAI_VOICES,
    FrameTtsLoop,
    TtsBackendBase,
    feed_inputs,
    request_check,
)
from realtime_gw.models.tokenizers import ByteTokenizer, HfTokenizer, has_tokenizer_files
from realtime_gw.records.voice import TtsFrame, TtsRequest, VoiceAdded, VoiceRegistration, VoiceRemoval

log = logging.getLogger(__name__)

OPENAI_SPEAKERS = {
    "alloy": "vivian",
    "ash": "ryan",
    "ballad": "aiden",
    "cedar": "eric",
    "coral": "serena",
    "echo": "dylan",
    "fable": "uncle_fu",
    "marin": "ono_anna",
    "nova": "sohee",
    "onyx": "eric",
    "sage": "serena",
    "shimmer": "vivian",
    "verse": "aiden",
}
"""OpenAI voice -> CustomVoice speaker (used when the checkpoint has that speaker)."""
GPU_DECODER_PRECISION = "tf32"
"""The codec decoder's precision on CUDA (``qwen3/decoder.py``): max abs waveform error vs float32 is in
docs/benchmarks-log.md; CPU runs stay float32 (the parity tests)."""
QWEN_ROLE_IDS = [151644, 77091, 198]
"""``<|im_start|>assistant\\n`` in Qwen's vocabulary (random init has no tokenizer files)."""
MAX_INSTRUCT_TOKENS = 512
"""An ``instructions`` text's most tokens (also at most half the slot length)."""


@dataclass(eq=False)
class Qwen3TtsState:
    request: TtsRequest
    slot: int
    text: TextFeed
    frames: int = 0
    spoken: int = 0
    tail: int = 0
    done: bool = False
    released: bool = False
    icl: ClonedVoice | None = None
    """An ICL clone's stream whose prompt (which holds the first text tokens) is not built yet."""
    lead: deque[int] = field(default_factory=deque)
    fed: int = 0
    """Frames launched (``frames`` counts those emitted: one fewer while a frame is in flight)."""
    flight: Any = None
    """A pipelined engine's frame in flight (``FrameTtsLoop``)."""


class Qwen3TtsBackend(FrameTtsLoop, TtsBackendBase[Qwen3TtsState]):
    name = "tts-qwen3"

    def __init__(
        self,
        path: str | None = None,
        size: str = "0.6b",
        device: str = "cpu",
        slots: int = 8,
        *,
        voice: str | None = None,
        language: str = "auto",
        dtype: torch.dtype | None = None,
        max_positions: int = 2048,
        tail_frames: int = 3,
        max_frames_per_token: int = 8,
        sampling: Sampling | None = None,
        cuda_graphs: bool | None = None,
        checkpoint: Qwen3TtsCheckpoint | None = None,
        decoder_precision: str | None = None,
        fuse_snake: bool | None = None,
        compile_predictor: bool = False,
        pipelined: bool | None = None,
        fused_predictor: bool = False,
        instructions: str | None = None,
        designs: dict[str, str] | None = None,
        clones: dict[str, str] | None = None,
    ) -> None:
        cuda = device.startswith("cuda")
        dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
        decoder_precision = decoder_precision or (GPU_DECODER_PRECISION if cuda else "fp32")
        fuse_snake = cuda if fuse_snake is None else fuse_snake
        if checkpoint is None:
            checkpoint = (
                load_checkpoint(path, device, dtype) if path else random_checkpoint(size, device, dtype)
            )
        ck = checkpoint
        self.random_init = ck.path is None
        root = ck.path
        self.tokenizer: TextTokenizer = (
            HfTokenizer(root) if root is not None and has_tokenizer_files(root) else ByteTokenizer()
        )
        self.role_ids = (
            QWEN_ROLE_IDS
            if isinstance(self.tokenizer, ByteTokenizer)
            else self.tokenizer.encode("<|im_start|>assistant\n")
        )
        self.ck = ck
        self.kind = ck.kind
        self.instructions = instructions or ""
        self.max_instruct_tokens = min(MAX_INSTRUCT_TOKENS, max_positions // 2)
        self._instruct_cache: dict[str, tuple[int, ...]] = {}
        self.designs: dict[str, str] = {}
        self.clones: dict[str, ClonedVoice] = {}  # custom voices (``Qwen3TtsStage``) join these two
        self._set_voices(voice, designs or {}, clones or {})
        self.language = language
        self._prompt(self.default_voice, None)  # unknown language fails here
        self.tts_eos = int(ck.config["tts_eos_token_id"])
        self.tts_pad = int(ck.config["tts_pad_token_id"])
        self.codec_eos = int(ck.talker_config["codec_eos_token_id"])
        self.tail_frames = tail_frames
        self.max_frames_per_token = max_frames_per_token
        self.slots = slots
        self.engine = Qwen3Engine(
            ck,
            slots,
            max_positions=max_positions,
            sampling=sampling,
            cuda_graphs=cuda_graphs,
            decoder_precision=decoder_precision,
            fuse_snake=fuse_snake,
            compile_predictor="inductor" if compile_predictor and cuda else None,
            pipelined=cuda if pipelined is None else pipelined,
            fused_predictor=fused_predictor,
        )
        for name, clone in self.clones.items():
            if clone.icl:  # the recording's frames sit in every prompt; its codes are decoded ahead
                if len(self._prompt(name, None)) + len(clone.frames) > max_positions // 2:
                    raise ValueError(f"--tts-voice-clone {name}: {len(clone.frames)} frames of recording leave "
                                     f"too little of the {max_positions} positions per stream")  # fmt: skip
                self.engine.add_recording(name, clone.frames, clone.codes)
        self.info: dict[str, Any] = {
            "model": f"qwen3-tts-{ck.config.get('tts_model_size', size)} "
            + (f"from {root}" if root else "(random init: audio is noise)"),
            "random_init": self.random_init,
            "device": device,
            "talker_dtype": str(dtype).removeprefix("torch."),
            "decoder_precision": decoder_precision,
            "fused_snake": fuse_snake,
            "compiled_code_predictor": compile_predictor and cuda and not fused_predictor,
            "fused_code_predictor": fused_predictor,
            "pipelined": self.engine.pipelined,
            "slots": slots,
            "tokenizer": self.tokenizer.name,
            "kind": self.kind,
            "speakers": list(self.voices),
            "instructions": self.instructions if ck.takes_instruct() else "not applied to this checkpoint",
            "language": language,
            "frame_rate_hz": 12.5,
            "max_frames": max_positions,
            "cuda_graphs": self.engine.use_graphs,
            "speed": "accepted, not applied",
        }
        log.info("%s: %s", self.name, self.info)

    def warmup(self) -> None:
        """The K/V of every prompt a stream without its own ``instructions`` starts from (in the backend's
        language) computed now, so no such stream's first step runs a prefill; then the graphs and a short
        utterance (``FrameTtsLoop.warmup``)."""
        with torch.no_grad():
            self.engine.cache_prompts(self.voice_prompts()[: self.engine.free_slots])
        super().warmup()
        if self.engine.fused_paths:  # per batch bucket: which parts of the frame run fused
            self.warmup_report["fused"] = {b: [p for p, r in parts.items() if r["chosen"] == "fused"]
                                           for b, parts in self.engine.fused_paths.items()}  # fmt: skip

    def voice_prompts(self) -> list[Prompt]:
        """The cached prompts of the voices a request can name, without its own ``instructions``: every
        speaker, design or x-vector clone, and for VoiceDesign the server's ``instructions`` alone when
        that is the default voice. Not an ICL clone's: its streams start from per-utterance prompts."""
        voices = [v for v in self.voices if not (v in self.clones and self.clones[v].icl)]
        if self.default_voice not in self.voices:  # VoiceDesign without a named default design
            voices.append(self.default_voice)
        return [self._prompt(v, None) for v in voices]

    def _set_voices(self, voice: str | None, designs: dict[str, str], clones: dict[str, str]) -> None:
        """The voices of this checkpoint kind (see the module doc); clones' x-vectors computed here."""
        kind, ck = self.kind, self.ck
        if designs and kind != "voice_design":
            raise ValueError(f"--tts-voice-design needs a VoiceDesign checkpoint (this one is {kind})")
        if clones and kind != "base":
            raise ValueError(f"--tts-voice-clone needs a Base checkpoint (this one is {kind})")
        if kind == "custom_voice":
            self.voices = tuple(sorted(ck.speakers()))
            if not self.voices:
                raise ValueError("tts-qwen3: the CustomVoice checkpoint has no speakers")
        elif kind == "voice_design":
            self.designs = {k.lower(): v for k, v in designs.items()}
            self.voices = tuple(sorted(self.designs))
        else:  # without start-up clones, "default" has no x-vector: voices come from /v1/audio/voices
            self.clones = {
                k.lower(): clone_voice(ck, spec, self.tokenizer.encode) for k, spec in clones.items()
            }
            self.voices = tuple(sorted(self.clones))
        v = (voice or "").lower()
        if v in self.voices:
            self.default_voice = v
        elif kind == "voice_design" or not self.voices:
            self.default_voice = "default"  # the server's instructions alone; Base: no x-vector
        else:
            self.default_voice = "vivian" if "vivian" in self.voices else self.voices[0]

    def resolve_voice(self, voice: str) -> str:
        v = voice.lower()
        if v in self.voices or v in self.clones or v in self.designs:  # the last two: custom voices too
            return v
        if v == "default":
            return self.default_voice
        if v in OPENAI_VOICES:
            mapped = OPENAI_SPEAKERS.get(v, "") if self.kind == "custom_voice" else ""
            return mapped if mapped in self.voices else self.default_voice
        return super().resolve_voice(voice)

    def instruct_ids(self, instructions: str | None) -> tuple[int, ...]:
        """``<|im_start|>user\\n{instructions}<|im_end|>\\n`` tokenized (the reference's instruct text), or
        none for an empty one; ValueError past ``max_instruct_tokens``."""
        if not instructions:
            return ()
        ids = self._instruct_cache.get(instructions)
        if ids is None:
            ids = tuple(self.tokenizer.encode(f"<|im_start|>user\n{instructions}<|im_end|>\n"))
            if len(self._instruct_cache) >= 256:  # bounded: requests bring their own texts
                self._instruct_cache.clear()
            self._instruct_cache[instructions] = ids
        if len(ids) > self.max_instruct_tokens:
            raise ValueError(f"instructions are {len(ids)} tokens; at most {self.max_instruct_tokens}")
        return ids

    def check_request(self, request: TtsRequest) -> tuple[str, float]:
        """As the base class, and the request's ``instructions`` within ``max_instruct_tokens`` where
        the checkpoint takes them (ValueError otherwise)."""
        voice, speed = super().check_request(request)
        if request.instructions and self.ck.takes_instruct():
            self.instruct_ids(request.instructions)
        return voice, speed

    def _prompt(self, voice: str, instructions: str | None) -> Prompt:
        """The prompt of a resolved ``voice`` with a request's ``instructions`` (None: the default)."""
        ck, kind = self.ck, self.kind
        text = (
            instructions or (self.designs.get(voice) if kind == "voice_design" else None) or self.instructions
        )
        instruct = self.instruct_ids(text) if ck.takes_instruct() else ()
        speaker = voice if kind == "custom_voice" else None
        vector = self.clones[voice].vector if kind == "base" and voice in self.clones else ()
        return build_prompt(ck, self.role_ids, speaker, self.language, instruct, vector)

    # -- Backend protocol ------------------------------------------------------------------------------
    def open(self, request: TtsRequest) -> Qwen3TtsState:
        voice, _ = self.check_request(request)
        clone = self.clones.get(voice)
        if clone is not None and clone.icl:  # the prompt holds the first text: built once it is in
            slot = self.engine.alloc_prompt(None)
            return Qwen3TtsState(request=request, slot=slot, text=TextFeed(self.tokenizer), icl=clone)
        prompt = self._prompt(voice, request.instructions)
        slot = self.engine.alloc_prompt(prompt)  # NoFreeSlot when full
        return Qwen3TtsState(request=request, slot=slot, text=TextFeed(self.tokenizer))

    def has_work(self, state: Qwen3TtsState) -> bool:
        if state.icl is not None and state.flight is None:
            return self._icl_ready(state)
        return super().has_work(state)

    def _icl_ready(self, st: Qwen3TtsState) -> bool:
        assert st.icl is not None
        return st.text.ended or len(st.text.tokens) >= icl_tokens_needed(st.icl)

    def step(self, work: list[tuple[Qwen3TtsState, list[Any]]]) -> list[StepResult]:
        """As ``FrameTtsLoop.step``; an ICL stream waits (its input taken) until its prompt's text is in."""
        waiting: dict[int, StepResult] = {}
        rest: list[tuple[Qwen3TtsState, list[Any]]] = []
        for i, (st, inputs) in enumerate(work):
            if st.icl is None or st.done:
                rest.append((st, inputs))
                continue
            try:
                feed_inputs(st.text, inputs)
            except Exception as e:  # bad input fails this stream only
                waiting[i] = self._failed(e)
                continue
            if self._icl_ready(st):
                rest.append((st, []))
            else:
                waiting[i] = StepResult()
        done = iter(super().step(rest) if rest else [])
        return [waiting[i] if i in waiting else next(done) for i in range(len(work))]

    def _start_icl(self, st: Qwen3TtsState) -> None:
        """Build the stream's ICL prompt from the text so far and start its slot from it."""
        assert st.icl is not None
        voice = self.resolve_voice(st.request.voice)
        ids = {
            "tts_eos": self.tts_eos,
            "tts_pad": self.tts_pad,
            "codec_bos": int(self.ck.talker_config["codec_bos_id"]),
        }
        head = self._prompt(voice, None)
        start = icl_start(st.icl, voice, head, list(st.text.tokens), st.text.ended, ids)
        for _ in range(start.consumed):
            st.text.tokens.popleft()
        st.spoken += start.consumed
        st.tail = 1 if start.eos_in_prompt else 0
        st.lead.extend(start.lead)
        st.icl = None
        self.engine.set_prompt(st.slot, start.prompt)

    def _next_token(self, st: Qwen3TtsState) -> tuple[int, bool]:
        if st.icl is not None:
            self._start_icl(st)
        st.fed += 1
        if st.lead:
            return st.lead.popleft(), False
        if st.text.tokens:
            token = st.text.tokens.popleft()
            st.spoken += 1
        else:
            token = self.tts_eos if st.tail == 0 else self.tts_pad
            st.tail += 1
        # the reference's min_new_tokens=2; and EOS only once every text token was fed (as the codec
        # LM): with text still streaming in, an early EOS would drop words
        return token, st.fed > 2 and st.tail > 0 and not self.random_init

    # -- internals -------------------------------------------------------------------------------------
    def _limit(self, state: Qwen3TtsState) -> int:
        cap = self.engine.max_positions
        if state.text.ended:
            per_token = 1 if self.random_init else self.max_frames_per_token
            cap = min(cap, per_token * state.text.queued + self.tail_frames)
        return cap

    def _finish(self, state: Qwen3TtsState, words: list[str], pcm: bytes) -> StepResult:
        words += [w for _, w in state.text.marks]
        state.text.marks.clear()
        state.done = True
        return StepResult(outputs=[TtsFrame(pcm=pcm, text=" ".join(words), final=True)], done=True)

    def _emit(self, state: Qwen3TtsState, codes: np.ndarray, pcm: np.ndarray, spoken: int) -> StepResult:
        state.frames += 1
        words = state.text.take_marks(spoken)
        if int(codes[0]) == self.codec_eos:  # EOS is not audio: an empty final frame
            return self._finish(state, words, b"")
        data = pcm.astype("<i2", copy=False).tobytes()
        in_flight = state.fed - state.frames  # a later frame launched already (pipelined engine)
        full = self.engine.frames[state.slot] - in_flight >= self.engine.max_positions
        if state.frames >= self._limit(state) or full:
            if not state.text.ended or state.text.tokens:
                log.warning("%s: utterance cut at %d frames", self.name, state.frames)
            return self._finish(state, words, data)
        return StepResult(outputs=[TtsFrame(pcm=data, text=" ".join(words))])


class Qwen3TtsStage(VoiceRecords, Qwen3TtsBackend):
    """Qwen3-TTS as the stage serves it: also custom voices added at run time (``custom_voices``): a Base
    checkpoint clones one from a recording (its x-vector, computed here once per voice, joins ``clones``),
    a VoiceDesign checkpoint designs one from a description (it joins ``designs``). A voice's prompt K/V
    is prefilled at its first stream and cached, as a request's own ``instructions`` are."""

    @property
    def voice_kinds(self) -> tuple[str, ...]:  # type: ignore[override]
        return {"base": ("audio_sample",), "voice_design": ("prompt",)}.get(self.kind, ())

    def check_voice_record(self, request: VoiceRegistration | VoiceRemoval) -> None:
        super().check_voice_record(request)
        if isinstance(request, VoiceRegistration) and request.kind == "prompt":
            self.instruct_ids(request.description)  # within the instruction tokens, or ValueError

    def add_voice(self, request: VoiceRegistration) -> VoiceAdded:
        vid = request.voice_id.lower()
        if vid in self.voices or vid in OPENAI_VOICES or vid == "default":
            raise ValueError(f"voice id {request.voice_id!r} names a built-in voice")
        if request.kind == "prompt":
            self.designs[vid] = request.description
            return VoiceAdded(vid)
        vector = request.vector or x_vector(self.ck, np.frombuffer(request.sample, dtype="<f4").copy())
        dim = int(self.ck.speaker_encoder.config["enc_dim"])  # type: ignore[union-attr]
        if len(vector) != dim:
            raise ValueError(f"an x-vector of {len(vector)} values; this checkpoint's have {dim}")
        self.clones[vid] = ClonedVoice(tuple(float(x) for x in vector))
        return VoiceAdded(vid, self.clones[vid].vector)

    def remove_voice(self, voice_id: str) -> None:
        vid = voice_id.lower()
        if vid not in self.voices:  # start-up voices stay
            self.designs.pop(vid, None)
            self.clones.pop(vid, None)


def from_config(config: GatewayConfig) -> StagePlan:
    """Slots = batch = admission limit, as for the codec LM; requests are checked at submit (voice,
    instruction tokens), so a bad one is refused before it takes a slot."""
    slots = config.tts_max_batch
    qwen = Qwen3TtsStage(
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
        # --tts-compile takes the frame from the fused kernels: one of the two paths, never both
        fused_predictor=fused.resolve(config.tts_fused and not config.tts_compile, config.tts_device),
        max_positions=config.tts_max_frames,
    )
    return StagePlan(
        backend=qwen, device=config.tts_device, max_batch=slots, max_active=slots, admit=request_check(qwen)
    )
