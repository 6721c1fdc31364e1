"""WAV in and out for clients: everything becomes PCM16 mono at the rate the session wants."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

from realtime_gw.protocols.audio import OUTPUT_RATE, resample

SESSION_RATES = (16000, 24000)


def read_wav(path: str | Path, rate: int | None = None) -> tuple[bytes, int]:
    """PCM16 mono of a sound file (channels averaged), resampled to ``rate`` when given.

    Without ``rate`` a 16 or 24 kHz file keeps its rate (the server takes both); others go to 24 kHz.
    """
    data, file_rate = sf.read(str(path), dtype="int16", always_2d=True)
    mono = data[:, 0] if data.shape[1] == 1 else data.mean(axis=1).astype(np.int16)
    pcm = np.ascontiguousarray(mono, dtype="<i2").tobytes()
    target = rate or (file_rate if file_rate in SESSION_RATES else OUTPUT_RATE)
    return resample(pcm, file_rate, target), target


def write_wav(path: str | Path, pcm: bytes, rate: int = OUTPUT_RATE) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.frombuffer(pcm, dtype="<i2"), rate, subtype="PCM_16")


def silence(ms: float, rate: int) -> bytes:
    return b"\x00\x00" * int(rate * ms / 1000)
