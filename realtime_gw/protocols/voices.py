"""Custom voices and voice consents (``/v1/audio/voices``, ``/v1/audio/voice_consents``) as the ``openai``
SDK shapes them (``openai.types.audio.Voice``, ``VoiceConsent``): the objects, their lists, the checks of a
create request, and an uploaded recording decoded the way a Base checkpoint's speaker encoder reads a file.
Pure (no I/O beyond decoding bytes already in memory)."""

from __future__ import annotations

import io
import math
import re
from typing import Any, Literal

import msgspec
import numpy as np
import soundfile
import soxr

from realtime_gw.protocols import loudness

VOICE_RATE = 24000
"""The rate a recording is decoded to (a Base checkpoint's speaker encoder listens at 24 kHz)."""
MAX_UPLOAD_BYTES = 10 * 1024 * 1024
"""A recording's most bytes (OpenAI's limit: 10 MiB)."""
MIN_SAMPLE_S = 0.25
MAX_SAMPLE_S = 60.0
"""A voice sample's shortest and longest duration, seconds."""
MAX_NAME_CHARS = 256
MAX_PROMPT_CHARS = 4096
VOICE_ID = re.compile(r"voice_[0-9a-f]{24}")
CONSENT_ID = re.compile(r"cons_[0-9a-f]{24}")


class VoiceObject(msgspec.Struct, kw_only=True):
    """``openai.types.audio.Voice``."""

    id: str
    created_at: int
    name: str
    type: Literal["audio_sample", "prompt"]
    object: Literal["audio.voice"] = "audio.voice"
    prompt: str | None = None
    model: str | None = None
    """This gateway's: the speech-to-speech model whose voice prompt it is (``personaplex``: named by its
    id in ``audio.output.voice`` of that model's realtime sessions); None: a voice of the TTS stage."""


class VoiceDeleted(msgspec.Struct, kw_only=True):
    id: str
    deleted: bool = True
    object: Literal["audio.voice.deleted"] = "audio.voice.deleted"


class ConsentObject(msgspec.Struct, kw_only=True):
    """``openai.types.audio.VoiceConsent``."""

    id: str
    created_at: int
    language: str
    name: str
    object: Literal["audio.voice_consent"] = "audio.voice_consent"


class ConsentDeleted(msgspec.Struct, kw_only=True):
    id: str
    deleted: bool = True
    object: Literal["audio.voice_consent"] = "audio.voice_consent"


class VoiceInputError(ValueError):
    """A request the client must change (HTTP 400 naming ``param``)."""

    def __init__(self, message: str, param: str | None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def page(objects: list[Any], after: str | None, limit: int) -> dict[str, Any]:
    """OpenAI's cursor list (``object: list``, ``data``, ``first_id``, ``last_id``, ``has_more``) of
    ``objects`` (oldest first) after the id ``after``, at most ``limit``."""
    if not 1 <= limit <= 100:
        raise VoiceInputError("limit must be between 1 and 100", "limit")
    start = 0
    if after:
        ids = [o.id for o in objects]
        if after not in ids:
            raise VoiceInputError(f"No object with id '{after}'", "after")
        start = ids.index(after) + 1
    data = objects[start : start + limit]
    return {
        "object": "list",
        "data": [msgspec.to_builtins(o) for o in data],
        "first_id": data[0].id if data else None,
        "last_id": data[-1].id if data else None,
        "has_more": start + limit < len(objects),
    }


def check_name(name: str | None, param: str = "name") -> str:
    if name is None or not name.strip():
        raise VoiceInputError(f"{param} is required", param, "missing_required_parameter")
    if len(name) > MAX_NAME_CHARS:
        raise VoiceInputError(f"{param} is longer than {MAX_NAME_CHARS} characters", param)
    return name


def check_prompt(prompt: str | None) -> str:
    if prompt is None or not prompt.strip():
        raise VoiceInputError("prompt is required and must not be only whitespace", "prompt",
                              "missing_required_parameter")  # fmt: skip
    if len(prompt) > MAX_PROMPT_CHARS:
        raise VoiceInputError(f"prompt is longer than {MAX_PROMPT_CHARS} characters", "prompt")
    return prompt.strip()


def check_language(language: str | None) -> str:
    """A BCP 47 tag's shape (``en``, ``en-US``, ``zh-Hant-TW``)."""
    if language is None or not re.fullmatch(r"[A-Za-z]{2,3}(-[A-Za-z0-9]{2,8})*", language):
        raise VoiceInputError("language must be a BCP 47 tag such as en-US", "language")
    return language


MAX_RECORDING_S = 120.0
"""Longest upload decoded at all (a sample or a consent recording), read from its header before decoding,
so a small compressed file cannot expand into gigabytes of samples."""
MAX_RECORDING_SAMPLES = int(MAX_RECORDING_S * 48_000 * 2)
"""The same bound in decoded samples (all channels): a high rate or many channels count too."""


def decode_recording(
    data: bytes | io.IOBase, param: str = "audio_sample", bounded: bool = True
) -> np.ndarray:
    """An audio file (WAV, FLAC, OGG: what libsndfile reads) -> mono float32 at ``VOICE_RATE``, as the
    Qwen3-TTS reference prepares a reference recording (librosa: channels averaged, soxr HQ resampling,
    then ``fix_length``), so a file given here or at start-up gives the same x-vector. CPU-bound for long
    files: callers on an event loop run it in a thread."""
    source = io.BytesIO(data) if isinstance(data, bytes) else data
    try:
        if bounded:  # an upload: judged by its header first (``bounded=False``: the operator's own file)
            info = soundfile.info(source)
            source.seek(0)
            if (
                info.frames > MAX_RECORDING_S * info.samplerate
                or info.frames * info.channels > MAX_RECORDING_SAMPLES
            ):
                raise VoiceInputError(f"{param}: longer than {MAX_RECORDING_S:g} s of audio", param)
        wav, rate = soundfile.read(source, dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as e:
        raise VoiceInputError(f"{param}: not an audio file this server can read ({e})", param) from None
    if wav.shape[0] == 0:
        raise VoiceInputError(f"{param}: the recording is empty", param)
    mono = wav.mean(axis=1, dtype=np.float32) if wav.shape[1] > 1 else wav[:, 0]
    if rate == VOICE_RATE:
        return np.ascontiguousarray(mono)
    out = soxr.resample(mono, rate, VOICE_RATE, quality="soxr_hq")
    n = int(math.ceil(mono.shape[0] * VOICE_RATE / rate))  # librosa's fix_length
    out = out[:n] if out.shape[0] >= n else np.pad(out, (0, n - out.shape[0]))
    return np.asarray(out, dtype=np.float32)


def check_sample(audio: np.ndarray, param: str = "audio_sample") -> bytes:
    """A decoded voice sample within the duration bounds, as the float32 bytes ``VoiceRegistration`` takes."""
    seconds = audio.shape[0] / VOICE_RATE
    if seconds < MIN_SAMPLE_S or seconds > MAX_SAMPLE_S:
        raise VoiceInputError(
            f"{param}: {seconds:.1f} s of audio; a voice sample lasts {MIN_SAMPLE_S:g} to {MAX_SAMPLE_S:g} s",
            param,
        )
    if not np.isfinite(audio).all() or float(np.abs(audio).max()) == 0.0:
        raise VoiceInputError(f"{param}: the recording is silent", param)
    return np.ascontiguousarray(audio, dtype="<f4").tobytes()


def prompt_sample(audio: np.ndarray, param: str = "audio_sample") -> bytes:
    """``check_sample``, then brought to a voice prompt's loudness (-24 LUFS: ``loudness.normalized``): what
    a speech-to-speech stage encodes. CPU work of a few hundred ms for a long sample: call it in a thread."""
    checked = np.frombuffer(check_sample(audio, param), "<f4")
    try:
        return np.ascontiguousarray(loudness.normalized(checked), dtype="<f4").tobytes()
    except ValueError as e:  # silent once K-weighted: nothing to bring to the prompt's level
        raise VoiceInputError(f"{param}: {e}", param) from None
