"""Audio codecs for the wire: PCM16 <-> float, G.711 mu-law/A-law, resampling, 80 ms framing.

Pure functions and small stateful objects (numpy + soxr only, no I/O), so sessions, transports and
backends can share them and they can be tested without a server.

All PCM here is 16-bit signed little-endian mono ("PCM16 bytes").
"""

from __future__ import annotations

import numpy as np
import soxr

__all__ = [
    "FRAME_SAMPLES",
    "MAX_SPEED",
    "MIN_SPEED",
    "SPEED_ERROR",
    "OUTPUT_RATE",
    "INPUT_FORMATS",
    "Reframer",
    "StreamingResampler",
    "OutputEncoder",
    "alaw_decode",
    "alaw_encode",
    "decode_input",
    "float32_to_pcm16",
    "input_rate",
    "pcm16_to_float32",
    "resample",
    "ulaw_decode",
    "speed_in_range",
    "ulaw_encode",
]

FRAME_SAMPLES = 1920
"""80 ms at 24 kHz: the unit of every audio output (the one definition; records re-export it)."""
OUTPUT_RATE = 24000

MIN_SPEED = 0.25
MAX_SPEED = 4.0
SPEED_ERROR = f"speed must be between {MIN_SPEED} and {MAX_SPEED}"
"""The speech-rate range of every TTS surface (OpenAI's): the one definition."""


def speed_in_range(speed: float) -> bool:
    """True for a speed inside [MIN_SPEED, MAX_SPEED] (NaN is outside)."""
    return MIN_SPEED <= speed <= MAX_SPEED

_PCM_RATES = (16000, 24000)
_G711_RATE = 8000
INPUT_FORMATS = ("audio/pcm", "audio/pcmu", "audio/pcma")

_LE_INT16 = np.dtype("<i2")


# -- PCM16 <-> float ---------------------------------------------------------------------------------
def _as_int16(pcm16: bytes) -> np.ndarray:
    if len(pcm16) % 2:
        raise ValueError(f"PCM16 data must have an even number of bytes, got {len(pcm16)}")
    return np.frombuffer(pcm16, dtype=_LE_INT16)


def pcm16_to_float32(pcm16: bytes) -> np.ndarray:
    """PCM16 bytes -> float32 samples in [-1, 1)."""
    return _as_int16(pcm16).astype(np.float32) / 32768.0


def float32_to_pcm16(samples: np.ndarray) -> bytes:
    """Float samples (nominally [-1, 1]) -> PCM16 bytes, clipped (no wrap-around on overshoot).

    Scaling by 32768 with rounding makes ``pcm16 -> float32 -> pcm16`` exact.
    """
    x = np.rint(np.asarray(samples, dtype=np.float32) * 32768.0)
    return np.clip(x, -32768, 32767).astype(_LE_INT16).tobytes()


def level_dbfs(pcm16: bytes) -> float:
    """RMS level of PCM16 audio in dB below full scale (-inf for digital silence or no audio)."""
    x = pcm16_to_float32(pcm16)
    if x.size == 0:
        return float("-inf")
    power = float(np.mean(np.square(x, dtype=np.float64)))
    return 10.0 * float(np.log10(power)) if power > 0 else float("-inf")


# -- G.711 (bit-exact to ITU-T G.711 as implemented by Sun's g711.c / CPython audioop) ------------------
# Encoders are 64 Ki-entry lookup tables indexed by the raw uint16 bit pattern of each sample, decoders
# 256-entry tables: one vectorised gather per call, and the tables are built with the reference
# algorithm so they agree with audioop on every input (the test checks all 65536).
_SEG_UEND = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)
_SEG_AEND = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int32)
_ULAW_BIAS = 0x84
_ULAW_CLIP = 8159


def _build_ulaw_encode() -> np.ndarray:
    lin = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.int16).astype(np.int32)
    v = lin >> 2  # mu-law works on 14-bit magnitudes
    mask = np.where(v < 0, 0x7F, 0xFF)
    v = np.minimum(np.abs(v), _ULAW_CLIP) + (_ULAW_BIAS >> 2)
    seg = np.searchsorted(_SEG_UEND, v, side="left")  # first segment whose end >= v
    uval = (seg << 4) | ((v >> (seg + 1)) & 0xF)
    uval = np.where(seg >= 8, 0x7F, uval)
    return (uval ^ mask).astype(np.uint8)


def _build_ulaw_decode() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + _ULAW_BIAS) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS).astype(_LE_INT16)


def _build_alaw_encode() -> np.ndarray:
    lin = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.int16).astype(np.int32)
    v = lin >> 3  # A-law works on 13-bit magnitudes
    mask = np.where(v >= 0, 0xD5, 0x55)
    v = np.where(v >= 0, v, -v - 1)
    seg = np.searchsorted(_SEG_AEND, v, side="left")
    quant = np.where(seg < 2, v >> 1, v >> np.maximum(seg, 1)) & 0x0F
    aval = (seg << 4) | quant
    aval = np.where(seg >= 8, 0x7F, aval)
    return (aval ^ mask).astype(np.uint8)


def _build_alaw_decode() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = (a & 0x0F) << 4
    t = np.where(seg == 0, t + 8, np.where(seg == 1, t + 0x108, (t + 0x108) << np.maximum(seg - 1, 0)))
    return np.where(a & 0x80, t, -t).astype(_LE_INT16)


_ULAW_ENC = _build_ulaw_encode()
_ULAW_DEC = _build_ulaw_decode()
_ALAW_ENC = _build_alaw_encode()
_ALAW_DEC = _build_alaw_decode()


def ulaw_encode(pcm16: bytes) -> bytes:
    """PCM16 bytes -> G.711 mu-law bytes (one byte per sample)."""
    return _ULAW_ENC[_as_int16(pcm16).view(np.uint16)].tobytes()


def ulaw_decode(data: bytes) -> bytes:
    """G.711 mu-law bytes -> PCM16 bytes."""
    return _ULAW_DEC[np.frombuffer(data, dtype=np.uint8)].tobytes()


def alaw_encode(pcm16: bytes) -> bytes:
    """PCM16 bytes -> G.711 A-law bytes (one byte per sample)."""
    return _ALAW_ENC[_as_int16(pcm16).view(np.uint16)].tobytes()


def alaw_decode(data: bytes) -> bytes:
    """G.711 A-law bytes -> PCM16 bytes."""
    return _ALAW_DEC[np.frombuffer(data, dtype=np.uint8)].tobytes()


# -- resampling ---------------------------------------------------------------------------------------
def resample(pcm16: bytes, in_rate: int, out_rate: int) -> bytes:
    """One-shot resample of a whole clip (PCM16 in, PCM16 out; soxr clips on int16 output)."""
    x = _as_int16(pcm16)
    if in_rate == out_rate or x.size == 0:
        return bytes(pcm16)
    return np.ascontiguousarray(soxr.resample(x, in_rate, out_rate), dtype=_LE_INT16).tobytes()


class StreamingResampler:
    """Chunked resampling without clicks at chunk edges: the filter state carries across pushes.

    soxr withholds its filter delay until ``flush()``, so the concatenated output equals (up to the
    filter's edge effects) a one-shot resample of the concatenated input.
    """

    def __init__(self, in_rate: int, out_rate: int) -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream: soxr.ResampleStream | None = None
        self._odd = b""  # a dangling byte of a split sample, kept for the next push
        if in_rate != out_rate:
            self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="int16")

    @property
    def identity(self) -> bool:
        return self._stream is None

    def push(self, pcm16: bytes) -> bytes:
        if self._odd:
            pcm16 = self._odd + pcm16
            self._odd = b""
        if len(pcm16) % 2:
            pcm16, self._odd = pcm16[:-1], pcm16[-1:]
        if self._stream is None:
            return bytes(pcm16)
        if not pcm16:
            return b""
        return self._stream.resample_chunk(np.frombuffer(pcm16, dtype=_LE_INT16)).astype(_LE_INT16).tobytes()

    def flush(self) -> bytes:
        """Drain the filter delay; the resampler is spent afterwards (create a new one to reuse)."""
        self._odd = b""
        if self._stream is None:
            return b""
        out = self._stream.resample_chunk(np.zeros(0, dtype=_LE_INT16), last=True)
        return out.astype(_LE_INT16).tobytes()


# -- framing ------------------------------------------------------------------------------------------
class Reframer:
    """Cuts a PCM16 byte stream into frames of exactly ``frame_samples`` samples.

    Whatever does not fill a frame is carried to the next ``push``; ``flush`` returns it.
    """

    def __init__(self, frame_samples: int = FRAME_SAMPLES) -> None:
        if frame_samples <= 0:
            raise ValueError(f"frame_samples must be positive, got {frame_samples}")
        self.frame_samples = frame_samples
        self._frame_bytes = 2 * frame_samples
        self._buf = bytearray()

    @property
    def buffered_samples(self) -> int:
        return len(self._buf) // 2

    def push(self, pcm16: bytes) -> list[bytes]:
        self._buf += pcm16
        n = len(self._buf) // self._frame_bytes
        if n == 0:
            return []
        fb = self._frame_bytes
        frames = [bytes(self._buf[i * fb : (i + 1) * fb]) for i in range(n)]
        del self._buf[: n * fb]
        return frames

    def flush(self) -> bytes:
        """The remainder (shorter than a frame, possibly empty); a dangling odd byte is dropped."""
        out = bytes(self._buf[: len(self._buf) // 2 * 2])
        self._buf.clear()
        return out


# -- wire formats -------------------------------------------------------------------------------------
def _check_format(fmt: str) -> None:
    if fmt not in INPUT_FORMATS:
        raise ValueError(f"unsupported audio format {fmt!r}; supported: {', '.join(INPUT_FORMATS)}")


def input_rate(fmt: str, rate: int | None = None) -> int:
    """Sample rate of an input audio format: PCM16 at 16 or 24 kHz (default 24 kHz), G.711 at 8 kHz."""
    _check_format(fmt)
    if fmt == "audio/pcm":
        if rate is None:
            return OUTPUT_RATE
        if rate not in _PCM_RATES:
            raise ValueError(f"unsupported rate {rate} Hz for audio/pcm; supported: 16000, 24000")
        return rate
    if rate is not None and rate != _G711_RATE:
        raise ValueError(f"unsupported rate {rate} Hz for {fmt}; G.711 is 8000 Hz only")
    return _G711_RATE


def decode_input(data: bytes, fmt: str) -> bytes:
    """Wire bytes -> PCM16 bytes at the format's native rate (see ``input_rate``)."""
    _check_format(fmt)
    if fmt == "audio/pcmu":
        return ulaw_decode(data)
    if fmt == "audio/pcma":
        return alaw_decode(data)
    if len(data) % 2:
        raise ValueError(f"audio/pcm data must have an even number of bytes, got {len(data)}")
    return bytes(data)


class OutputEncoder:
    """24 kHz PCM16 -> wire bytes for one output stream (stateful: the 24k -> 8k filter carries over)."""

    def __init__(self, fmt: str) -> None:
        _check_format(fmt)
        self.format = fmt
        self.rate = OUTPUT_RATE if fmt == "audio/pcm" else _G711_RATE
        self._resampler = None if fmt == "audio/pcm" else StreamingResampler(OUTPUT_RATE, _G711_RATE)

    def _encode(self, pcm16: bytes) -> bytes:
        return ulaw_encode(pcm16) if self.format == "audio/pcmu" else alaw_encode(pcm16)

    def encode(self, pcm16: bytes) -> bytes:
        if self._resampler is None:
            return bytes(pcm16)
        return self._encode(self._resampler.push(pcm16))

    def flush(self) -> bytes:
        """The resampler's withheld tail, encoded; call once at the end of an utterance."""
        if self._resampler is None:
            return b""
        out = self._encode(self._resampler.flush())
        self._resampler = StreamingResampler(OUTPUT_RATE, _G711_RATE)  # ready for the next utterance
        return out
