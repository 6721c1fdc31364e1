"""A call's audio encoded and decoded on the loop that runs its peer connection, not in aiortc's threads.

aiortc (1.14-1.16) encodes every outgoing 20 ms frame in the loop's default executor, after a PyAV
resampler turned our mono into stereo and a pure-Python loop measured its level; and it decodes every
incoming frame in a thread of its own per call, which hands each frame back to the loop with
``run_coroutine_threadsafe``. Per frame and call those hops (a thread wake-up, futures, the loop's
self-pipe) and that loop cost more than the codec itself. Here:

- ``encode_on_loop``: the Opus sender asks the ``ReplyTrack`` for its paced PCM and encodes it with its
  own libopus context, set as aiortc's (96 kbit/s, ``voip``, 48 kHz stereo), fed the same stereo
  samples aiortc's resampler makes of mono (each at -3 dB, in the resampler's Q15 arithmetic), so the
  packets are the very bytes aiortc would send; the audio level (RFC 6464) is the same formula in
  numpy. Other codecs (PCMU/PCMA) keep aiortc's path.
- ``decode_on_loop``: the receiver's frames are decoded, by aiortc's own decoders, as the jitter
  buffer releases them, straight into the track's queue. The receiver's decoder thread still starts
  and ends with it, idle in between: it only passes on the end of the track.

Both lean on aiortc's private attributes (checked; where one is missing, aiortc's own path runs).
"""

from __future__ import annotations

import fractions
import logging
import math
import threading
from queue import Queue
from typing import Any

import av
import numpy as np
from aiortc.codecs import get_decoder
from aiortc.rtcrtpsender import RTCEncodedFrame

from realtime_gw.server.webrtc.media import FRAME_SAMPLES, RATE, ReplyTrack

log = logging.getLogger(__name__)

OPUS_BIT_RATE = 96000
"""aiortc's Opus encoder's."""
MONO_TO_STEREO_Q15 = 23170
"""1/sqrt(2) in Q15: FFmpeg's resampler upmixes mono to stereo at -3 dB, rounding so."""
MIN_AUDIO_LEVEL = -127
DECODER_QUEUE = "_RTCRtpReceiver__decoder_queue"
_DECODER_ERROR = "_RTCRtpReceiver__decoder_error"


class OpusReplyEncoder:
    """20 ms frames of 48 kHz mono PCM16 -> Opus packets and their RTP timestamps, as aiortc's
    ``OpusEncoder`` makes them of the same frames."""

    def __init__(self) -> None:
        codec = self.codec = av.CodecContext.create("libopus", "w")
        codec.bit_rate = OPUS_BIT_RATE
        codec.format = "s16"
        codec.layout = "stereo"
        codec.options = {"application": "voip"}
        codec.sample_rate = RATE
        codec.time_base = fractions.Fraction(1, RATE)
        self._pts = 0
        self._first_packet_pts: int | None = None

    def encode(self, pcm: bytes) -> tuple[list[bytes], int | None]:
        mono = np.frombuffer(pcm, dtype="<i2").astype(np.int32)
        mono *= MONO_TO_STEREO_Q15
        mono += 1 << 14
        mono >>= 15
        frame = av.AudioFrame(format="s16", layout="stereo", samples=FRAME_SAMPLES)
        frame.planes[0].update(mono.astype("<i2").repeat(2).tobytes())
        frame.pts = self._pts
        frame.sample_rate = RATE
        frame.time_base = self.codec.time_base
        self._pts += FRAME_SAMPLES
        packets = self.codec.encode(frame)
        if not packets:
            return [], None
        if self._first_packet_pts is None:  # libopus's first pts is negative (its look-ahead)
            self._first_packet_pts = packets[0].pts
        return [bytes(p) for p in packets], packets[0].pts - self._first_packet_pts


def audio_level_dbov(pcm: bytes) -> int:
    """RFC 6465's level of a mono PCM16 frame, as aiortc's ``compute_audio_level_dbov`` computes it."""
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.int64)
    energy = float(np.dot(samples, samples))
    if energy == 0.0:
        return MIN_AUDIO_LEVEL
    rms = math.sqrt(energy / (len(samples) * 32767 * 32767))
    return round(min(max(20 * math.log10(rms), MIN_AUDIO_LEVEL), 0))


def encode_on_loop(sender: Any, track: ReplyTrack) -> bool:
    """Makes ``sender`` (the RTCRtpSender of ``track``) encode Opus itself on the loop; other codecs go
    aiortc's way. False where this aiortc has no such hook (its own path runs)."""
    default = getattr(sender, "_next_encoded_frame", None)
    if default is None or not hasattr(sender, "_enabled"):
        return False
    encoder: OpusReplyEncoder | None = None

    async def next_encoded_frame(codec: Any) -> RTCEncodedFrame | None:
        nonlocal encoder
        if codec.mimeType.lower() != "audio/opus":
            return await default(codec)
        pcm = await track.next_pcm()
        if not sender._enabled:  # aiortc's: a disabled sender drops its frames
            return None
        if encoder is None:
            encoder = OpusReplyEncoder()
        payloads, timestamp = encoder.encode(pcm)
        if not payloads or timestamp is None:
            return None
        return RTCEncodedFrame(payloads, timestamp, audio_level_dbov(pcm))

    sender._next_encoded_frame = next_encoded_frame
    return True


class _DecodeOnPut:
    """Stands in for a receiver's decoder queue: what aiortc puts in it (codec, encoded frame) is decoded
    there and then into the receiver's track's queue; its decoder thread's ``get`` waits for the
    receiver's stop (``None``), which it passes on, so the track ends as before."""

    def __init__(self, receiver: Any, decode_error: threading.Event) -> None:
        self.receiver = receiver
        self.decode_error = decode_error
        self.codec_name: str | None = None
        self.decoder: Any = None
        self._stopped = threading.Event()

    def put(self, task: tuple[Any, Any] | None) -> None:
        if task is None:
            self._stopped.set()
            return
        codec, encoded_frame = task
        if codec.name != self.codec_name:
            self.decoder, self.codec_name = get_decoder(codec), codec.name
        try:
            frames = self.decoder.decode(encoded_frame)
        except av.FFmpegError as e:  # aiortc's: warn, keep the decoder's state, go on
            log.warning("caller audio: a %s frame failed to decode: %s", codec.name, e)
            self.decode_error.set()
            return
        track_queue = self.receiver.track._queue
        for frame in frames:
            track_queue.put_nowait(frame)

    def get(self, block: bool = True, timeout: float | None = None) -> None:
        self._stopped.wait()


def decode_on_loop(receiver: Any) -> bool:
    """Makes ``receiver`` (an audio RTCRtpReceiver that has not started) decode on the loop. False where
    this aiortc has no such hook (its decoder thread decodes)."""
    queue = getattr(receiver, DECODER_QUEUE, None)
    error = getattr(receiver, _DECODER_ERROR, None)
    if not isinstance(queue, Queue) or not queue.empty() or not isinstance(error, threading.Event):
        return False
    setattr(receiver, DECODER_QUEUE, _DecodeOnPut(receiver, error))
    return True
