"""Uploaded files to PCM16: every format apps send decodes to the same audio; broken, empty and
too-long files are an ``UploadError`` (a 400), never another exception."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import soundfile

from realtime_gw.server.upload_audio import UploadError, decode
from realtime_gw.testing.audio_files import FORMATS, encode

RATE = 24000


def tone(seconds: float, rate: int = RATE) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_decodes_to_the_same_audio(fmt: str) -> None:
    pcm, duration = decode(encode(tone(2.0), RATE, fmt), 16000, 60)
    assert abs(duration - 2.0) < 0.1, duration  # codecs pad a frame or two
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
    rms = np.sqrt(np.mean(x[1600:-3200] ** 2))
    assert abs(rms - 8000 / np.sqrt(2)) < 600, rms  # lossy codecs keep a steady tone's level


@pytest.mark.parametrize("fmt", FORMATS)
def test_broken_files_are_upload_errors(fmt: str) -> None:
    whole = encode(tone(1.0), RATE, fmt)
    for broken in (whole[: len(whole) // 3], whole[:40], b"\x00" * 1000, b"RIFF" + b"\xff" * 60):
        # A truncated stream may decode to what it holds, or be refused: both are fine, nothing else is.
        with contextlib.suppress(UploadError):
            decode(broken, 16000, 60)


def test_empty_and_too_long() -> None:
    with pytest.raises(UploadError, match="empty"):
        decode(b"", 16000, 60)
    with pytest.raises(UploadError, match="transcription_max_audio_s"):
        decode(encode(bytes(2 * 8000 * 70), 8000, "flac"), 16000, 60)
    with pytest.raises(UploadError, match="transcription_max_audio_s"):
        decode(encode(tone(70.0, 16000), 16000, "webm"), 16000, 60)  # FFmpeg: stopped while decoding


def test_high_rates_and_many_channels_are_held_as_mono_at_48k() -> None:
    """What a decode holds grows with the seconds only, not the file's rate or channels."""
    buf = io.BytesIO()
    t = np.arange(96000 * 2) / 96000
    x = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    soundfile.write(buf, np.stack([x] * 6, axis=1), 96000, format="FLAC")
    pcm, duration = decode(buf.getvalue(), 16000, 60)
    assert abs(duration - 2.0) < 0.01 and abs(len(pcm) / 2 - 2 * 16000) <= 16  # PCM16 at the stage's rate
