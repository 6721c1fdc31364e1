"""Audio files as apps upload them, made from PCM16 at test time (no binary fixtures): WAV, FLAC and
Ogg/Opus through libsndfile (``soundfile``), MP3, WebM/Opus and M4A/AAC through FFmpeg (PyAV)."""

from __future__ import annotations

import io

import numpy as np

FORMATS = ("wav", "flac", "ogg", "mp3", "webm", "m4a")
_SOUNDFILE = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "ogg": ("OGG", "OPUS")}
_FFMPEG = {"mp3": ("mp3", "libmp3lame", 24000), "webm": ("webm", "libopus", 48000), "m4a": ("ipod", "aac", 24000)}
"""container, encoder, the encoder's rate."""
MEDIA_TYPES = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "ogg": "audio/ogg",
    "mp3": "audio/mpeg",
    "webm": "audio/webm",
    "m4a": "audio/mp4",
}


def encode(pcm16: bytes, rate: int, fmt: str) -> bytes:
    """Mono PCM16 at ``rate`` as a file in ``fmt`` (one of ``FORMATS``)."""
    x = np.frombuffer(pcm16, dtype="<i2")
    if fmt in _SOUNDFILE:
        import soundfile

        container, subtype = _SOUNDFILE[fmt]
        out = io.BytesIO()
        if fmt == "ogg":  # Opus takes 8/12/16/24/48 kHz
            x, rate = _resampled(x, rate, 48000), 48000
        soundfile.write(out, x, rate, format=container, subtype=subtype)
        return out.getvalue()
    return _ffmpeg(x, rate, *_FFMPEG[fmt])


def _resampled(x: np.ndarray, rate: int, to: int) -> np.ndarray:
    import soxr

    return x if rate == to else np.asarray(soxr.resample(x, rate, to), dtype="<i2")


def _ffmpeg(x: np.ndarray, rate: int, container: str, codec: str, codec_rate: int) -> bytes:
    import av

    x = _resampled(x, rate, codec_rate)
    out = io.BytesIO()
    with av.open(out, mode="w", format=container) as f:
        stream = f.add_stream(codec, rate=codec_rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(x.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = codec_rate
        resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=codec_rate, frame_size=stream.frame_size or None)
        for piece in [*resampler.resample(frame), *resampler.resample(None)]:
            for packet in stream.encode(piece):
                f.mux(packet)
        for packet in stream.encode(None):
            f.mux(packet)
    return out.getvalue()
