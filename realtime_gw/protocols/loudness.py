"""Loudness as ITU-R BS.1770 measures it (``pyloudnorm.Meter``: K-weighting, gated blocks), and a voice
sample brought to a target loudness: what PersonaPlex's voice prompts are made from (its reference's
``load_voice_prompt`` normalizes a sample to -24 LUFS).

Pure numpy (no I/O): the gateway normalizes an upload in a thread before a stage sees it, and the
speech-to-speech stage normalizes its voice directory's samples at start with the same function.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["RATE", "TARGET_LUFS", "integrated_loudness", "k_weighted", "normalized"]

TARGET_LUFS = -24.0
RATE = 24000
ABSOLUTE_GATE_LUFS = -70.0
"""BS.1770's absolute gate: blocks quieter than this are not counted (none louder: the sample is silent)."""


def _biquad(x: np.ndarray, b: tuple[float, float, float], a: tuple[float, float, float]) -> np.ndarray:
    """Direct form I (``a[0] = 1``), as ``scipy.signal.lfilter`` runs a biquad."""
    y = np.empty_like(x)
    x1 = x2 = y1 = y2 = 0.0
    b0, b1, b2 = b
    _, a1, a2 = a
    for i, xi in enumerate(x.tolist()):
        yi = b0 * xi + b1 * x1 + b2 * x2 - a1 * y1 - a2 * y2
        x2, x1, y2, y1 = x1, xi, y1, yi
        y[i] = yi
    return y


def _shelf_and_highpass(rate: int) -> list[tuple[tuple[float, float, float], tuple[float, float, float]]]:
    """The K-weighting filters of ``pyloudnorm.Meter`` (its ``IIRfilter`` high shelf and high pass)."""
    out = []
    for gain_db, q, fc, kind in ((4.0, 1 / np.sqrt(2), 1500.0, "shelf"), (0.0, 0.5, 38.0, "hp")):
        a_gain = 10 ** (gain_db / 40)
        w0 = 2 * np.pi * fc / rate
        alpha = np.sin(w0) / (2 * q)
        cw = np.cos(w0)
        if kind == "shelf":
            s = 2 * np.sqrt(a_gain) * alpha
            b = (a_gain * ((a_gain + 1) + (a_gain - 1) * cw + s), -2 * a_gain * ((a_gain - 1) + (a_gain + 1) * cw),
                 a_gain * ((a_gain + 1) + (a_gain - 1) * cw - s))  # fmt: skip
            a = ((a_gain + 1) - (a_gain - 1) * cw + s, 2 * ((a_gain - 1) - (a_gain + 1) * cw),
                 (a_gain + 1) - (a_gain - 1) * cw - s)  # fmt: skip
        else:
            b = ((1 + cw) / 2, -(1 + cw), (1 + cw) / 2)
            a = (1 + alpha, -2 * cw, 1 - alpha)
        out.append((tuple(v / a[0] for v in b), (1.0, a[1] / a[0], a[2] / a[0])))
    return out  # type: ignore[return-value]


IMPULSE_S = 0.7
"""The K-weighting's impulse response kept (its slowest pole, the 38 Hz high pass, has decayed by e^-167)."""


@functools.lru_cache(maxsize=8)
def _k_weighting_response(rate: int) -> np.ndarray:
    """The K-weighting filters' impulse response: the filters run as one FFT convolution, not sample by
    sample in Python (a voice registered while conversations run must not hold the stage's thread)."""
    h = np.zeros(max(1024, int(IMPULSE_S * rate)))
    h[0] = 1.0
    for b, a in _shelf_and_highpass(rate):
        h = _biquad(h, b, a)
    return h


def k_weighted(x: np.ndarray, rate: int) -> np.ndarray:
    """``x`` through the K-weighting filters (``lfilter`` of each biquad, from rest)."""
    h = _k_weighting_response(rate)
    n = 1 << int(len(x) + len(h) - 1).bit_length()
    return np.fft.irfft(np.fft.rfft(x.astype(np.float64), n) * np.fft.rfft(h, n), n)[: len(x)]


def integrated_loudness(x: np.ndarray, rate: int) -> float:
    """Mono integrated loudness (LUFS): K-weighting, 400 ms blocks at 75% overlap, the absolute gate at
    -70 LUFS and the relative gate 10 LU below (``pyloudnorm.Meter.integrated_loudness``)."""
    y = k_weighted(x, rate)
    block, hop = int(0.4 * rate), int(0.1 * rate)
    starts = range(0, max(len(y) - block, 0) + 1, hop)
    z = np.array([np.mean(y[s : s + block] ** 2) for s in starts])
    with np.errstate(divide="ignore"):
        lk = -0.691 + 10 * np.log10(z)
    z = z[lk >= ABSOLUTE_GATE_LUFS]
    if not len(z):
        return float("-inf")
    relative = -0.691 + 10 * np.log10(np.mean(z)) - 10.0
    with np.errstate(divide="ignore"):
        z = z[-0.691 + 10 * np.log10(z) > relative]
    return float(-0.691 + 10 * np.log10(np.mean(z)))


def normalized(mono: np.ndarray) -> np.ndarray:
    """Mono float PCM at 24 kHz brought to -24 LUFS; ValueError when empty or silent."""
    if not len(mono):
        raise ValueError("an empty voice sample")
    loudness = integrated_loudness(mono, RATE)
    if not np.isfinite(loudness):
        raise ValueError(f"the voice sample is silent or too quiet to measure (below {ABSOLUTE_GATE_LUFS:g} LUFS "
                         "once K-weighted: nothing audible)")
    return (mono * 10 ** ((TARGET_LUFS - loudness) / 20)).astype(np.float32)


