"""Server-side voices for the checkpoint kinds without named speakers (``--tts-voice-design``,
``--tts-voice-clone``): parsed from ``NAME=VALUE`` specs, computed once at start-up.

- VoiceDesign: ``NAME=description`` — a natural-language description, the ``instruct`` text.
- Base: ``NAME=path.wav`` — the x-vector of that recording (``speaker.py``). The reference reads the file
  as librosa does (float32, channels averaged) and resamples other rates to 24 kHz with soxr's HQ filter
  (librosa's default), so a WAV at any rate gives the reference's x-vector. ``NAME=path.wav:transcript``
  is the reference's ICL mode: also the recording's 12 Hz codes (``encoder.py``), kept as each frame's
  summed codec embeddings, and the transcript's tokens; each utterance's prompt then aligns transcript +
  text with those frames (``tts_qwen3.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from realtime_gw.models.speech.qwen3.checkpoint import Qwen3TtsCheckpoint
from realtime_gw.models.speech.qwen3.engine import Prompt
from realtime_gw.models.speech.qwen3.speaker import SPEAKER_RATE, speaker_embedding
from realtime_gw.models.speech.qwen3.talker import VECTOR_POSITION
from realtime_gw.protocols.voices import MIN_SAMPLE_S, decode_recording


def parse_voice_specs(specs: Iterable[str], flag: str) -> dict[str, str]:
    """``["name=value", ...]`` -> ``{name (lower case): value}``; ValueError naming ``flag`` when malformed."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        name = name.strip().lower()
        if not sep or not name or not value.strip():
            raise ValueError(f"{flag}: expected NAME=VALUE, got {spec!r}")
        if name in out:
            raise ValueError(f"{flag}: voice {name!r} given twice")
        out[name] = value.strip()
    return out


def read_clone_audio(path: str) -> np.ndarray:
    """A recording as mono float32 at 24 kHz, as the reference prepares it for its speaker encoder (the
    same decoding as a sample uploaded to ``/v1/audio/voices``)."""
    with open(path, "rb") as f:
        return decode_recording(f, path, bounded=False)


@dataclass(frozen=True)
class ClonedVoice:
    vector: tuple[float, ...]
    """The recording's x-vector (in the speaker's place)."""
    ref_ids: tuple[int, ...] = ()
    """ICL: the transcript's tokens."""
    frames: torch.Tensor | None = field(default=None, compare=False)
    """ICL: per 80 ms frame of the recording, the sum of its 16 codes' embeddings ``(F, H)``, the talker's
    dtype (registered with the engine: ``Qwen3Engine.add_recording``)."""
    codes: torch.Tensor | None = field(default=None, compare=False)
    """ICL: the recording's codes ``(F, 16)`` (decoded ahead of the speech)."""

    @property
    def icl(self) -> bool:
        return self.frames is not None


def clone_voice(ck: Qwen3TtsCheckpoint, spec: str, tokenize: Callable[[str], list[int]]) -> ClonedVoice:
    """A ``--tts-voice-clone`` value (``path.wav`` or ``path.wav:transcript``) under ``ck``'s encoders."""
    if ck.speaker_encoder is None:
        raise ValueError(f"--tts-voice-clone needs a Base checkpoint (this one is {ck.kind})")
    path, _, transcript = spec.partition(":")
    audio = read_clone_audio(path)
    if audio.shape[0] < MIN_SAMPLE_S * SPEAKER_RATE:
        raise ValueError(f"--tts-voice-clone {path}: under {MIN_SAMPLE_S:g} s of audio")
    vector = x_vector(ck, audio)
    if not transcript.strip():
        return ClonedVoice(vector)
    if ck.path is None:
        raise ValueError("--tts-voice-clone with a transcript needs the checkpoint's speech_tokenizer")
    from realtime_gw.models.speech.qwen3.encoder import SpeechEncoder

    codes = SpeechEncoder.from_dir(ck.path / "speech_tokenizer", ck.codec_config).encode(audio)
    ref_ids = tokenize(f"<|im_start|>assistant\n{transcript.strip()}<|im_end|>\n")[3:-2]  # as the reference
    return ClonedVoice(vector, tuple(ref_ids), frame_embeddings(ck, codes), codes)


def x_vector(ck: Qwen3TtsCheckpoint, audio: np.ndarray) -> tuple[float, ...]:
    """The x-vector of mono float32 audio at 24 kHz under a Base checkpoint's speaker encoder."""
    if ck.speaker_encoder is None:
        raise ValueError(f"cloning a voice needs a Base checkpoint (this one is {ck.kind})")
    return tuple(float(x) for x in speaker_embedding(ck.speaker_encoder, audio).float().tolist())


@torch.no_grad()
def frame_embeddings(ck: Qwen3TtsCheckpoint, codes: torch.Tensor) -> torch.Tensor:
    """Codes ``(frames, 16)`` -> per frame the sum of its codebooks' embeddings (codebook 0 the talker's,
    1..15 the code predictor's), summed in one reduction in the talker's dtype, as the reference's ICL
    prompt sums them."""
    t = ck.talker
    codes = codes.to(t.model.codec_embedding.weight.device)
    embs = [t.model.codec_embedding(codes[:, :1])]
    embs += [t.code_predictor.model.codec_embedding[i - 1](codes[:, i : i + 1]) for i in range(1, codes.shape[1])]
    return torch.cat(embs, dim=1).sum(1)


# -- ICL: each utterance's prompt ------------------------------------------------------------------------------
@dataclass(frozen=True)
class IclStart:
    prompt: Prompt
    consumed: int
    """Text tokens the prompt took (the stream feeds on from the next)."""
    eos_in_prompt: bool
    """The text ended inside the prompt: the stream feeds ``tts_pad`` from its first frame on."""
    lead: tuple[int, ...]
    """Transcript tokens past the prompt, fed before the text (a transcript longer than the recording)."""


def icl_tokens_needed(voice: ClonedVoice) -> int:
    """Text tokens an ICL prompt must see (unless the text has ended), one more for the first frame."""
    return max(0, len(voice.frames) - len(voice.ref_ids)) + 1


def icl_start(
    voice: ClonedVoice, key: str, head: Prompt, text: list[int], ended: bool, ids: dict[str, int]
) -> IclStart:
    """The reference's streaming ICL prompt (``generate_icl_prompt``) after ``head`` (role and codec prefix
    with the x-vector): text ``transcript + text + [tts_eos]`` (``tts_pad`` past its end) aligned with codec
    ``[codec_bos] + frames``, one position per recording frame; its last position (its text token and the
    last frame) is the first frame step's input, so the prompt holds the others. ``key``: the recording's
    name in the engine (``add_recording``); ``ids``: ``tts_eos``, ``tts_pad``, ``codec_bos``."""
    assert voice.frames is not None
    frames, ref = voice.frames, list(voice.ref_ids)
    n = len(frames)  # prompt positions: codec [bos, frame 0 .. frame n-2]; frame n-1 rides on the first step
    consumed = min(len(text), max(0, n - len(ref)))
    part = (ref + text[:consumed])[:n]
    eos_in = False
    if len(part) < n:  # the text ended inside the prompt (else the caller waits for more)
        if not ended:
            raise ValueError("ICL prompt started before enough text arrived")
        part += [ids["tts_eos"]] + [ids["tts_pad"]] * (n - len(part) - 1)
        eos_in = True
    prompt = Prompt(
        head.text_ids + tuple(part),
        head.codec_ids + (ids["codec_bos"],) + (VECTOR_POSITION,) * (n - 1),
        head.vectors,
        recording=key,
        cache=False,
    )
    return IclStart(prompt, consumed, eos_in, tuple(ref[n:]))
