"""Server-side voices for the checkpoint kinds without named speakers (``--tts-voice-design``,
``--tts-voice-clone``): parsed from ``NAME=VALUE`` specs, computed once at start-up.

- VoiceDesign: ``NAME=description`` — a natural-language description, the ``instruct`` text.
- Base: ``NAME=path.wav`` — the x-vector of that recording (``speaker.py``). The reference reads the file
  as librosa does (float32, channels averaged) and resamples other rates to 24 kHz with soxr's HQ filter
  (librosa's default), so a WAV at any rate gives the reference's x-vector. ``NAME=path.wav:transcript``
  asks for the reference's ICL mode (the recording's codes and transcript in the prompt), not supported.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from realtime_gw.models.speech.qwen3.checkpoint import Qwen3TtsCheckpoint
from realtime_gw.models.speech.qwen3.speaker import SPEAKER_RATE, speaker_embedding


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
    """A recording as mono float32 at 24 kHz, as the reference prepares it for its speaker encoder."""
    import soundfile
    import soxr

    wav, rate = soundfile.read(path, dtype="float32", always_2d=True)
    mono = wav.mean(axis=1, dtype=np.float32) if wav.shape[1] > 1 else wav[:, 0]
    if rate == SPEAKER_RATE:
        return np.ascontiguousarray(mono)
    out = soxr.resample(mono, rate, SPEAKER_RATE, quality="soxr_hq")
    n = int(math.ceil(mono.shape[0] * SPEAKER_RATE / rate))  # librosa's fix_length
    out = out[:n] if out.shape[0] >= n else np.pad(out, (0, n - out.shape[0]))
    return np.asarray(out, dtype=np.float32)


def clone_vector(ck: Qwen3TtsCheckpoint, spec: str) -> tuple[float, ...]:
    """The x-vector of ``path.wav`` (a ``--tts-voice-clone`` value) under ``ck``'s speaker encoder."""
    if ck.speaker_encoder is None:
        raise ValueError(f"--tts-voice-clone needs a Base checkpoint (this one is {ck.kind})")
    path, _, transcript = spec.partition(":")
    if transcript.strip():
        raise ValueError(
            f"--tts-voice-clone {spec!r}: a transcript selects the reference's ICL mode, which is not "
            "supported yet; give NAME=path.wav (x-vector cloning)"
        )
    audio = read_clone_audio(path)
    if audio.shape[0] < SPEAKER_RATE // 4:
        raise ValueError(f"--tts-voice-clone {path}: under 0.25 s of audio")
    return tuple(float(x) for x in speaker_embedding(ck.speaker_encoder, audio).float().tolist())
