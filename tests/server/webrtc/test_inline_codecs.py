"""Calls' audio coded on the loop gives what aiortc's own threads give: the same Opus packets, RTP
timestamps and audio levels out, the same decoded frames (and the same mono) in, the track's end passed
on; and the installed aiortc has the hooks, so calls take this path."""

from __future__ import annotations

import asyncio
import fractions
import threading

import numpy as np
from aiortc import RTCPeerConnection
from aiortc.codecs import get_capabilities
from aiortc.codecs.opus import OpusDecoder, OpusEncoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtp import compute_audio_level_dbov
from av import AudioFrame

from realtime_gw.server.webrtc.inline_codecs import (
    DECODER_QUEUE,
    OpusReplyEncoder,
    audio_level_dbov,
    decode_on_loop,
    encode_on_loop,
)
from realtime_gw.server.webrtc.media import FRAME_SAMPLES, RATE, ReplyTrack, downmix
from realtime_gw.server.webrtc.metrics import MediaLedger


def speech_like_frames(count: int) -> list[bytes]:
    """Frames of 48 kHz mono PCM16: a chirp with noise, the full range, and silence."""
    rng = np.random.default_rng(7)
    frames = []
    for k in range(count):
        t = np.arange(FRAME_SAMPLES) + k * FRAME_SAMPLES
        x = 9000 * np.sin(2 * np.pi * (200 + k * 20) * t / RATE) + rng.normal(0, 800, FRAME_SAMPLES)
        frames.append(np.clip(x, -32768, 32767).astype("<i2").tobytes())
    frames[5] = bytes(FRAME_SAMPLES * 2)
    frames[6] = np.tile(np.array([32767, -32768], dtype="<i2"), FRAME_SAMPLES // 2).tobytes()
    return frames


def mono_frame(pcm: bytes, pts: int) -> AudioFrame:
    """What ``ReplyTrack.recv`` hands aiortc."""
    frame = AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
    frame.planes[0].update(pcm)
    frame.pts, frame.sample_rate, frame.time_base = pts, RATE, fractions.Fraction(1, RATE)
    return frame


def test_the_opus_packets_and_timestamps_are_aiortcs() -> None:
    theirs, ours = OpusEncoder(), OpusReplyEncoder()
    for k, pcm in enumerate(speech_like_frames(60)):
        assert ours.encode(pcm) == theirs.encode(mono_frame(pcm, k * FRAME_SAMPLES))


def test_the_audio_level_is_aiortcs() -> None:
    for pcm in [*speech_like_frames(12), np.full(FRAME_SAMPLES, 3, dtype="<i2").tobytes()]:
        assert audio_level_dbov(pcm) == compute_audio_level_dbov(mono_frame(pcm, 0))


def test_stereo_is_downmixed_as_the_float_mean_truncated() -> None:
    rng = np.random.default_rng(3)
    samples = rng.integers(-32768, 32768, size=(1, 2 * 48000)).astype(np.int16)
    samples[0, :8] = [-1, 0, -3, 0, 32767, 32767, -32768, -32768]
    expected = samples.reshape(-1, 2).mean(axis=1).astype("<i2")
    assert np.array_equal(downmix(samples, 2), expected)


async def answering_peer() -> tuple[RTCPeerConnection, RTCPeerConnection]:
    """A peer connection given an aiortc caller's audio offer (nothing connects), and the caller."""
    caller, answering = RTCPeerConnection(), RTCPeerConnection()
    caller.addTransceiver("audio", direction="sendrecv")
    await caller.setLocalDescription(await caller.createOffer())
    await answering.setRemoteDescription(caller.localDescription)
    return answering, caller


async def test_frames_decode_into_the_tracks_queue_as_aiortcs_decoder_makes_them() -> None:
    answering, caller = await answering_peer()
    try:
        receiver = answering.getTransceivers()[0].receiver
        assert decode_on_loop(receiver)
        decoding = getattr(receiver, DECODER_QUEUE)
        opus = next(c for c in get_capabilities("audio").codecs if c.mimeType == "audio/opus")
        encoder, reference = OpusEncoder(), OpusDecoder()
        for k, pcm in enumerate(speech_like_frames(20)):
            (payload,), timestamp = encoder.encode(mono_frame(pcm, k * FRAME_SAMPLES))
            decoding.put((opus, JitterFrame(data=payload, timestamp=timestamp)))
            (expected,) = reference.decode(JitterFrame(data=payload, timestamp=timestamp))
            got = receiver.track._queue.get_nowait()
            assert (got.pts, got.sample_rate, got.layout.name) == (expected.pts, 48000, "stereo")
            assert np.array_equal(got.to_ndarray(), expected.to_ndarray())
        assert receiver.track._queue.empty()
        ended: list[None] = []
        waiting = threading.Thread(target=lambda: ended.append(decoding.get()))
        waiting.start()
        waiting.join(0.05)
        assert waiting.is_alive()  # the receiver's decoder thread idles until the receiver stops
        decoding.put(None)
        waiting.join(1.0)
        assert ended == [None]
    finally:
        await asyncio.gather(answering.close(), caller.close())


async def test_the_reply_tracks_sender_encodes_on_the_loop() -> None:
    answering, caller = await answering_peer()
    try:
        track = ReplyTrack(lambda rid: None, lambda rid, ms: None, lambda rid: None, MediaLedger(publish=False))
        sender = answering.addTrack(track)
        assert encode_on_loop(sender, track)
        opus = next(c for c in get_capabilities("audio").codecs if c.mimeType == "audio/opus")
        reference = OpusEncoder()
        first = await sender._next_encoded_frame(opus)  # silence: nothing is queued
        (payload,), timestamp = reference.encode(mono_frame(bytes(FRAME_SAMPLES * 2), 0))
        assert (first.payloads, first.timestamp, first.audio_level) == ([payload], timestamp, -127)
    finally:
        await asyncio.gather(answering.close(), caller.close())
