"""Uploaded audio files to PCM16 mono at the ASR stage's rate, bounded in duration. Blocking: the
caller runs ``decode`` on a thread, never on the event loop.

Two maintained decoders, tried in this order: libsndfile (``soundfile``; the wheel bundles 1.2) for
WAV, FLAC, Ogg (Vorbis, Opus) and MP3, read whole once its header says how long the audio is; FFmpeg's
libraries (PyAV, ``av``) for the rest apps upload (WebM/Opus, M4A/MP4 AAC, and any file libsndfile
refuses), decoded frame by frame and stopped as soon as the audio passes the bound.
"""

from __future__ import annotations

import io

import numpy as np
import soxr

from realtime_gw.protocols.audio import float32_to_pcm16


class UploadError(Exception):
    """Audio that cannot be transcribed: the client's to fix (HTTP 400)."""


def decode(data: bytes, rate: int, max_seconds: float) -> tuple[bytes, float]:
    """(PCM16 mono at ``rate``, the file's duration in seconds)."""
    if not data:
        raise UploadError("The uploaded file is empty")
    try:
        try:
            mono, source_rate = _soundfile(data, max_seconds)
        except _NotMine:
            mono, source_rate = _ffmpeg(data, max_seconds)
    except (ValueError, RuntimeError, OSError, EOFError, MemoryError) as e:  # a file that lies about itself
        raise UploadError(f"The uploaded audio could not be decoded: {e}") from None
    duration = len(mono) / source_rate
    if duration == 0:
        raise UploadError("The uploaded file holds no audio samples")
    out = mono if source_rate == rate else soxr.resample(mono, source_rate, rate)
    return float32_to_pcm16(out), duration


MAX_RATE = 48_000
"""Decoded audio is held as mono at no more than this rate (the ASR stages listen at 16 or 24 kHz)."""


class _NotMine(Exception):
    pass


def _too_long(seconds: float, max_seconds: float) -> UploadError:
    return UploadError(
        f"Audio of {seconds:.1f} s is longer than the {max_seconds:g} s this gateway transcribes "
        "(transcription_max_audio_s)"
    )


def _soundfile(data: bytes, max_seconds: float) -> tuple[np.ndarray, int]:
    import soundfile

    try:
        f = soundfile.SoundFile(io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as e:
        raise _NotMine from e
    with f:
        if f.frames / f.samplerate > max_seconds:
            raise _too_long(f.frames / f.samplerate, max_seconds)
        # Block by block, to mono and at most MAX_RATE: what is held grows with the seconds only, not with
        # the file's rate or channels (a small compressed file must not expand into gigabytes).
        rate = min(f.samplerate, MAX_RATE)
        down = soxr.ResampleStream(f.samplerate, rate, 1, dtype="float32") if rate != f.samplerate else None
        chunks: list[np.ndarray] = []
        try:
            for block in f.blocks(blocksize=f.samplerate * 10, dtype="float32", always_2d=True):
                mono = block.mean(axis=1, dtype=np.float32)
                chunks.append(down.resample_chunk(mono) if down is not None else mono)
        except (soundfile.LibsndfileError, RuntimeError) as e:
            raise _NotMine from e
        if down is not None:
            chunks.append(down.resample_chunk(np.zeros(0, np.float32), last=True))
        return (np.concatenate(chunks) if chunks else np.zeros(0, np.float32)), rate


def _ffmpeg(data: bytes, max_seconds: float) -> tuple[np.ndarray, int]:
    import av

    try:
        container = av.open(io.BytesIO(data), mode="r")
    except (av.FFmpegError, ValueError) as e:
        raise UploadError(f"The uploaded file is not audio in a format this gateway decodes: {e}") from None
    with container:
        if not container.streams.audio:
            raise UploadError("The uploaded file has no audio stream")
        stream = container.streams.audio[0]
        rate = stream.rate or stream.codec_context.sample_rate
        if not rate:
            raise UploadError("The uploaded file's audio stream has no sample rate")
        rate = min(rate, MAX_RATE)  # held as mono at most MAX_RATE, whatever the file's rate and channels
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        chunks: list[np.ndarray] = []
        samples = 0
        try:
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunk = out.to_ndarray().reshape(-1)
                    chunks.append(chunk)
                    samples += len(chunk)
                if samples / rate > max_seconds:
                    raise _too_long(samples / rate, max_seconds)
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
        except av.FFmpegError as e:
            raise UploadError(f"The uploaded audio could not be decoded: {e}") from None
    return (np.concatenate(chunks) if chunks else np.zeros(0, np.float32)), rate
