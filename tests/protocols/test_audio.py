"""Audio codecs: PCM16/float, G.711 against CPython's audioop, resampling, framing, wire formats."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from realtime_gw.protocols import audio as A

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # audioop is deprecated (removed in 3.13)
    try:
        import audioop
    except ImportError:  # Python >= 3.13
        audioop = None

needs_audioop = pytest.mark.skipif(audioop is None, reason="audioop not available")

ALL_PCM = np.arange(-32768, 32768, dtype="<i2").tobytes()
ALL_CODES = bytes(range(256))


def tone(freq: float, rate: int, seconds: float, amp: float = 0.5) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    return A.float32_to_pcm16(amp * np.sin(2 * np.pi * freq * t))


def rms(pcm: bytes) -> float:
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    return float(np.sqrt(np.mean(x**2)))


# -- PCM16 <-> float ---------------------------------------------------------------------------------
def test_pcm_float_round_trip_is_exact() -> None:
    x = A.pcm16_to_float32(ALL_PCM)
    assert x.dtype == np.float32 and x.min() == -1.0 and x.max() < 1.0
    assert A.float32_to_pcm16(x) == ALL_PCM


def test_float_to_pcm_clips() -> None:
    out = np.frombuffer(A.float32_to_pcm16(np.array([-3.0, -1.0, 0.0, 1.0, 3.0])), dtype="<i2")
    assert out.tolist() == [-32768, -32768, 0, 32767, 32767]


def test_odd_byte_count_rejected() -> None:
    with pytest.raises(ValueError, match="even number of bytes"):
        A.pcm16_to_float32(b"\x00\x01\x02")


# -- G.711 -------------------------------------------------------------------------------------------
@needs_audioop
def test_g711_encoders_match_audioop_on_every_sample() -> None:
    assert A.ulaw_encode(ALL_PCM) == audioop.lin2ulaw(ALL_PCM, 2)
    assert A.alaw_encode(ALL_PCM) == audioop.lin2alaw(ALL_PCM, 2)


@needs_audioop
def test_g711_decoders_match_audioop_on_every_code() -> None:
    assert A.ulaw_decode(ALL_CODES) == audioop.ulaw2lin(ALL_CODES, 2)
    assert A.alaw_decode(ALL_CODES) == audioop.alaw2lin(ALL_CODES, 2)


def test_g711_known_values() -> None:
    # ITU-T G.711 reference points: silence codes and the extremes.
    assert A.ulaw_encode(np.array([0, 32767, -32768], dtype="<i2").tobytes()) == bytes([0xFF, 0x80, 0x00])
    assert A.alaw_encode(np.array([0, 32767, -32768], dtype="<i2").tobytes()) == bytes([0xD5, 0xAA, 0x2A])
    assert np.frombuffer(A.ulaw_decode(bytes([0xFF, 0x7F, 0x80, 0x00])), "<i2").tolist() == [
        0,
        0,
        32124,
        -32124,
    ]
    assert np.frombuffer(A.alaw_decode(bytes([0xD5, 0x55, 0xAA, 0x2A])), "<i2").tolist() == [
        8,
        -8,
        32256,
        -32256,
    ]


@pytest.mark.parametrize(("enc", "dec"), [(A.ulaw_encode, A.ulaw_decode), (A.alaw_encode, A.alaw_decode)])
def test_g711_round_trip(enc, dec) -> None:  # type: ignore[no-untyped-def]
    # Every code word is a fixed point, except mu-law's "negative zero" 0x7F, which decodes to 0 -> 0xFF.
    expect = ALL_CODES.replace(b"\x7f", b"\xff") if enc is A.ulaw_encode else ALL_CODES
    assert enc(dec(ALL_CODES)) == expect
    x = tone(440, 8000, 0.5)
    y = dec(enc(x))
    err = np.frombuffer(y, "<i2").astype(float) - np.frombuffer(x, "<i2")
    assert len(y) == len(x) and rms(y) == pytest.approx(rms(x), rel=0.02)
    assert np.sqrt(np.mean(err**2)) / rms(x) < 0.03  # ~ 38 dB SNR for a loud tone


# -- resampling --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("src", "dst"), [(24000, 16000), (16000, 24000), (22050, 24000), (24000, 8000), (8000, 24000)]
)
def test_resample_length_and_energy(src: int, dst: int) -> None:
    x = tone(300, src, 1.0)
    y = A.resample(x, src, dst)
    assert len(y) // 2 == dst
    assert rms(y) == pytest.approx(rms(x), rel=0.02)


def test_resample_identity() -> None:
    x = tone(300, 16000, 0.1)
    assert A.resample(x, 16000, 16000) == x
    r = A.StreamingResampler(16000, 16000)
    assert r.identity and r.push(x) == x and r.flush() == b""


@pytest.mark.parametrize(("src", "dst"), [(22050, 24000), (24000, 8000), (8000, 16000)])
def test_streaming_resampler_matches_one_shot(src: int, dst: int) -> None:
    x = tone(440, src, 1.0)
    r = A.StreamingResampler(src, dst)
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.integers(0, len(x), size=30))  # odd byte offsets too: samples split across pushes
    out = b"".join(r.push(x[a:b]) for a, b in zip([0, *cuts], [*cuts, len(x)], strict=True)) + r.flush()
    ref = A.resample(x, src, dst)
    assert abs(len(out) - len(ref)) <= 4
    n = min(len(out), len(ref)) // 2
    diff = np.frombuffer(out[: 2 * n], "<i2").astype(float) - np.frombuffer(ref[: 2 * n], "<i2")
    assert np.abs(diff[100:-100]).max() <= 2  # same filter, no seams at chunk edges


# -- framing -----------------------------------------------------------------------------------------
def test_reframer_exact_frames_and_remainder_across_pushes() -> None:
    rf = A.Reframer(1920)
    x = np.arange(5000, dtype="<i2").tobytes()
    frames = rf.push(x[:1000]) + rf.push(x[1000:3841]) + rf.push(x[3841:])  # odd split mid-sample
    assert [len(f) for f in frames] == [3840, 3840]
    assert rf.buffered_samples == 5000 - 3840
    tail = rf.flush()
    assert b"".join(frames) + tail == x
    assert rf.flush() == b"" and rf.push(b"") == []


def test_reframer_many_frames_in_one_push() -> None:
    rf = A.Reframer(4)
    frames = rf.push(bytes(2 * 13))
    assert len(frames) == 3 and all(len(f) == 8 for f in frames) and len(rf.flush()) == 2


# -- wire formats ------------------------------------------------------------------------------------
def test_input_rate() -> None:
    assert A.input_rate("audio/pcm", None) == 24000
    assert A.input_rate("audio/pcm", 16000) == 16000
    assert A.input_rate("audio/pcmu", None) == 8000 == A.input_rate("audio/pcma", 8000)
    with pytest.raises(ValueError, match="16000, 24000"):
        A.input_rate("audio/pcm", 44100)
    with pytest.raises(ValueError, match="8000 Hz only"):
        A.input_rate("audio/pcmu", 16000)
    with pytest.raises(ValueError, match="unsupported audio format 'audio/opus'"):
        A.input_rate("audio/opus", None)


def test_decode_input() -> None:
    x = tone(440, 8000, 0.1)
    assert A.decode_input(x, "audio/pcm") == x
    assert A.decode_input(A.ulaw_encode(x), "audio/pcmu") == A.ulaw_decode(A.ulaw_encode(x))
    assert A.decode_input(A.alaw_encode(x), "audio/pcma") == A.alaw_decode(A.alaw_encode(x))
    with pytest.raises(ValueError):
        A.decode_input(b"\x00", "audio/pcm")
    with pytest.raises(ValueError, match="unsupported"):
        A.decode_input(x, "audio/wav")


def test_output_encoder_pcm_is_identity() -> None:
    enc = A.OutputEncoder("audio/pcm")
    x = tone(440, 24000, 0.08)
    assert enc.rate == 24000 and enc.encode(x) == x and enc.flush() == b""


@pytest.mark.parametrize(("fmt", "dec"), [("audio/pcmu", A.ulaw_decode), ("audio/pcma", A.alaw_decode)])
def test_output_encoder_g711(fmt: str, dec) -> None:  # type: ignore[no-untyped-def]
    enc = A.OutputEncoder(fmt)
    assert enc.rate == 8000
    x = tone(440, 24000, 1.0)
    frames = [x[i : i + 3840] for i in range(0, len(x), 3840)]  # 80 ms frames, as the TTS emits them
    wire = b"".join(enc.encode(f) for f in frames) + enc.flush()
    assert abs(len(wire) - 8000) <= 2  # one byte per 8 kHz sample
    pcm = dec(wire)
    assert rms(pcm[800:-800]) == pytest.approx(rms(x), rel=0.05)
    # reusable for the next utterance after flush
    assert abs(len(enc.encode(x) + enc.flush()) - 8000) <= 2
