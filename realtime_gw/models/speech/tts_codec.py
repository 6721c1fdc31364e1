"""Codec-LM TTS backend (the GPU speech stage): Qwen3 talker + code predictor + streaming Mimi decoder.

Same contract as ``PiperTtsBackend``: text arrives in pieces (``Stream.push(str)``), then
``END_OF_INPUT``; audio leaves as 24 kHz PCM16 ``TtsFrame`` deltas of exactly 1920 samples, the last
one ``final=True`` (it may be empty). Unlike Piper it does not wait for sentences: every step advances
every stream that has text by one 80 ms codec frame, all streams in one batched talker + decoder step,
so the first frame leaves after one talker step and one decoder step.

Per stream: one text token is consumed per frame (text leads the audio). A word is released to the
talker once whitespace follows it (or at end of input), and its text rides on the frame that speaks its
first token. Stopping rule, once the text has ended and every token is spoken:
- random-init weights (no EOS is ever learned): ``tail_frames`` more frames with the pad text token;
  an utterance is exactly ``tokens + tail_frames`` frames (capped by the slot length);
- loaded weights: until codebook 0 emits EOS (allowed only from then on), or at most
  ``max_frames_per_token * tokens + tail_frames`` frames (and the slot length) in all.
A stream whose text has not ended and whose tokens are all spoken waits (no frame) for more text.

Voice names, the speed check and text input are ``tts_base.TtsBackendBase``'s, as for Piper; ``speed``
is validated but not applied (a codec LM has no length scale).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from realtime_gw.config import GatewayConfig
from realtime_gw.models.families import StagePlan
from realtime_gw.models.runtime import StepResult
from realtime_gw.models.speech.codec.engine import CodecEngine, LoadedModels, load_models
from realtime_gw.models.speech.streaming.text_feed import TextFeed
from realtime_gw.models.speech.tts_base import FrameTtsLoop, TtsBackendBase
from realtime_gw.records.voice import TtsFrame, TtsRequest

log = logging.getLogger(__name__)

CONFIGS = ("tiny", "full")
"""The codec LM's sizes (``codec.spec.named_spec``)."""


@dataclass(eq=False)
class CodecTtsState:
    request: TtsRequest
    slot: int
    text: TextFeed
    frames: int = 0
    spoken: int = 0
    """Text tokens consumed (one per frame while text lasts)."""
    tail: int = 0
    """Frames after the text ran out (pad text token)."""
    done: bool = False
    released: bool = False
    flight: Any = None
    """A pipelined engine's frame in flight (``FrameTtsLoop``)."""


class CodecTtsBackend(FrameTtsLoop, TtsBackendBase[CodecTtsState]):
    # voices, native_rate and default_voice are the base's: one "default" voice at 24 kHz
    name = "tts-codec"

    def __init__(
        self,
        config: str = "tiny",
        path: str | None = None,
        device: str = "cpu",
        slots: int = 8,
        *,
        dtype: torch.dtype | None = None,
        temperature: float = 0.9,
        top_k: int = 50,
        tail_frames: int = 3,
        max_frames_per_token: int = 8,
        cuda_graphs: bool | None = None,
        models: LoadedModels | None = None,
    ) -> None:
        """``models``: already loaded weights (tests and benchmarks share one load); else load them here."""
        if slots < 1:
            raise ValueError("slots must be >= 1")
        dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
        if models is None:
            models = load_models(config, path, device, dtype)
        else:
            param = next(models.talker.parameters())
            dtype, device = param.dtype, str(param.device)
        self.spec = models.spec
        self.tokenizer = models.tokenizer
        self.random_init = models.random_init
        self.tail_frames = tail_frames
        self.max_frames_per_token = max_frames_per_token
        self.slots = slots
        # EOS is only meaningful for trained weights; random init would stop at a random frame.
        self.allow_eos = not models.random_init
        self.engine = CodecEngine(
            models,
            slots,
            temperature=temperature,
            top_k=top_k,
            allow_eos=self.allow_eos,
            cuda_graphs=cuda_graphs,
        )
        self.info: dict[str, Any] = {
            "model": models.description,
            "random_init": models.random_init,
            "device": device,
            "talker_dtype": str(dtype).removeprefix("torch."),
            "decoder_dtype": "float32",
            "slots": slots,
            "tokenizer": models.tokenizer.name,
            "frame_rate_hz": 12.5,
            "codebooks": self.spec.num_codebooks,
            "max_frames": self.spec.max_positions,
            "cuda_graphs": self.engine.use_graphs,
            "speed": "accepted, not applied",
        }
        if models.random_init:
            self.info["note"] = "random-init weights: real architecture and cost, but the audio is noise"
            log.warning("%s: %s", self.name, self.info["note"])
        log.info("%s: %s", self.name, self.info)

    # -- Backend protocol ------------------------------------------------------------------------------
    def open(self, request: TtsRequest) -> CodecTtsState:
        self.check_request(request)  # voice and speed are checked, not used: one voice, no length scale
        slot = self.engine.alloc()  # NoFreeSlot when full
        return CodecTtsState(request=request, slot=slot, text=TextFeed(self.tokenizer))

    def _next_token(self, st: CodecTtsState) -> tuple[int, bool]:
        if st.text.tokens:
            st.spoken += 1
            return st.text.tokens.popleft(), False  # EOS only once every token has been spoken
        st.tail += 1
        return self.tokenizer.pad_id, True

    # -- internals -------------------------------------------------------------------------------------
    def _limit(self, state: CodecTtsState) -> int:
        """Most frames this utterance may take (known once the text has ended)."""
        cap = self.spec.max_positions
        if state.text.ended:
            per_token = 1 if not self.allow_eos else self.max_frames_per_token
            cap = min(cap, per_token * state.text.queued + self.tail_frames)
        return cap

    def _emit(self, state: CodecTtsState, codes: np.ndarray, pcm: np.ndarray, spoken: int) -> StepResult:
        state.frames += 1
        text = state.text
        words = text.take_marks(spoken)
        finished_text = text.ended and not text.tokens
        if self.allow_eos and state.tail > 0 and int(codes[0]) == self.spec.eos_id:
            # EOS is not audio: the utterance ends with an empty final frame
            words += [w for _, w in text.marks]
            text.marks.clear()
            state.done = True
            return StepResult(outputs=[TtsFrame(pcm=b"", text=" ".join(words), final=True)], done=True)
        done = state.frames >= self._limit(state)
        if finished_text and not self.allow_eos and state.tail >= self.tail_frames:
            done = True
        if done:
            if text.tokens or not text.ended:
                log.warning("%s: utterance cut at %d frames (slot length)", self.name, state.frames)
            words += [w for _, w in text.marks]
            text.marks.clear()
            state.done = True
        frame = TtsFrame(pcm=pcm.astype("<i2", copy=False).tobytes(), text=" ".join(words), final=done)
        return StepResult(outputs=[frame], done=done)


def from_config(config: GatewayConfig) -> StagePlan:
    """Every stream holds a slot and all of them advance each step: slots = batch = admission limit, so
    a full worker refuses at submit ("no free slot") instead of queueing."""
    slots = config.tts_max_batch
    codec = CodecTtsBackend(
        config=config.tts_shape, path=config.tts_path, device=config.tts_device, slots=slots
    )
    return StagePlan(backend=codec, device=config.tts_device, max_batch=slots, max_active=slots)
