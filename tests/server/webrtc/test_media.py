"""The call media path's own accounting: gaps in the caller's audio filled (and counted), reply frames
that ran dry mid-reply counted, and each call's figures on /metrics when it ends."""

from __future__ import annotations

import asyncio
import fractions

import numpy as np
from av import AudioFrame
from prometheus_client import REGISTRY

from realtime_gw.server.webrtc.media import FRAME_SAMPLES, InputConverter, ReplyTrack
from realtime_gw.server.webrtc.metrics import MediaLedger


def opus_frame(pts: int, samples: int = 960, value: int = 1000) -> AudioFrame:
    """A decoded Opus frame as aiortc hands it over: 48 kHz stereo, pts in RTP clock units."""
    frame = AudioFrame.from_ndarray(np.full((1, samples * 2), value, dtype=np.int16), format="s16", layout="stereo")
    frame.sample_rate = 48000
    frame.pts = pts
    frame.time_base = fractions.Fraction(1, 48000)
    return frame


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_a_gap_in_the_callers_audio_is_filled_with_silence_and_counted() -> None:
    ledger = MediaLedger()
    converter = InputConverter(ledger)
    concealed_before = sample("realtime_gw_call_input_concealed_seconds_total")
    out = b"".join(converter.convert(opus_frame(pts), "audio/pcm", 48000) for pts in (0, 960, 1920))
    assert ledger.input_concealed_s == 0.0
    # Two packets (40 ms) lost: the next frame starts 40 ms late; the session still gets every sample.
    out += converter.convert(opus_frame(2880 + 1920), "audio/pcm", 48000)
    out += converter.convert(opus_frame(2880 + 2880), "audio/pcm", 48000)
    assert abs(ledger.input_concealed_s - 0.04) < 1e-9
    assert abs(ledger.input_s - 0.14) < 1e-9
    pcm = np.frombuffer(out, dtype="<i2")
    assert abs(len(pcm) - 0.14 * 48000) <= 64  # the resampler's delay
    assert (np.abs(pcm[4 * 960 : 4 * 960 + 1500]) < 50).any(), "the gap is silence"
    assert sample("realtime_gw_call_input_concealed_seconds_total") - concealed_before > 0.039

    # A stream restarted far ahead (over a second) is passed over, not made up.
    converter.convert(opus_frame(10 * 48000), "audio/pcm", 48000)
    assert abs(ledger.input_concealed_s - 0.04) < 1e-9


def test_reply_frames_that_run_dry_mid_reply_are_underruns() -> None:
    async def run() -> MediaLedger:
        ledger = MediaLedger()
        track = ReplyTrack(lambda rid: None, lambda rid, ms: None, lambda rid: None, ledger)
        two_frames = b"\x01\x00" * (2 * FRAME_SAMPLES)
        track.push("resp_1", two_frames)
        for _ in range(4):  # two frames of reply, then two with nothing (the reply is not complete)
            await track.recv()
        track.push("resp_1", two_frames[: FRAME_SAMPLES])  # a half frame, the rest never came in time
        await track.recv()
        track.complete("resp_1")
        track.push("resp_2", two_frames[: FRAME_SAMPLES])  # a last half frame ends a reply: no underrun
        track.complete("resp_2")
        await track.recv()
        await track.recv()  # idle silence: no reply frame at all
        track.stop()
        return ledger

    ledger = asyncio.run(run())
    assert ledger.reply_frames == 6
    assert ledger.reply_underruns == 3
    assert ledger.frames == 6  # the first frame has no slot before it

    before = sample("realtime_gw_call_concealed_ratio_count", {"direction": "output"})
    ledger.close()
    assert sample("realtime_gw_call_concealed_ratio_count", {"direction": "output"}) == before + 1
