"""A call's audio: the caller's track into the session's input format, replies out on a paced track.

``ReplyTrack`` is the outgoing track: aiortc's sender asks it for a frame every 20 ms (48 kHz mono
PCM16; aiortc's Opus/PCMU/PCMA encoders convert from there). It plays the queued reply audio, or
silence when there is none, and knows exactly what it has put on the wire: it reports a response's
first frame (``started``), what of it has been sent (``sent``: the session truncates to that on
barge-in) and, once the response is complete and its last frame sent, ``stopped``.

``CallerAudio`` turns decoded frames of the caller's track (Opus 48 kHz stereo, G.711 8 kHz...) into
mono PCM, and ``InputConverter`` that into the session's input format (soxr resampling), as
``input_audio_buffer.append`` would carry it. ``ReplyFeed`` converts reply audio the other way, into the
track. Both resample where the call's media runs (``peer.Peer``).

``ReplyTrack`` and ``CallerAudio`` count what they had to make up (``MediaLedger``): the track, reply
frames it filled with silence because the reply's audio had not arrived in time (an underrun
mid-reply); ``CallerAudio``, the caller's audio that never arrived (a gap in the decoded frames' timestamps: lost packets), which it fills with
silence so that the session's clock (VAD, ``audio_start_ms``) stays the caller's.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame

from realtime_gw.protocols import audio
from realtime_gw.server.webrtc.metrics import MediaLedger

RATE = 48000
FRAME_MS = 20
FRAME_SAMPLES = RATE * FRAME_MS // 1000
FRAME_BYTES = FRAME_SAMPLES * 2
TIME_BASE = fractions.Fraction(1, RATE)
SENT_REPORT_MS = 100
"""How often a playing response's sent position is reported (the session's playback ledger)."""
MAX_CONCEALED_GAP_S = 1.0
"""The longest gap in the caller's audio filled with silence; a longer one (the caller's stream was
restarted, or paused) is passed over, not made up."""


@dataclass(slots=True)
class _Reply:
    queued: int = 0
    """Bytes of it waiting in the track's queue."""
    sent_ms: float = 0.0
    reported_ms: float = 0.0
    complete: bool = False
    """All its audio has been queued (its ``response.done`` went out)."""


class ReplyTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(
        self,
        started: Callable[[str], None],
        sent: Callable[[str, float], None],
        stopped: Callable[[str], None],
        ledger: MediaLedger,
    ) -> None:
        super().__init__()
        self.on_started, self.on_sent, self.on_stopped = started, sent, stopped
        self.ledger = ledger
        self._queue: deque[tuple[str, bytearray]] = deque()
        self._replies: dict[str, _Reply] = {}
        self._start: float | None = None
        self._pts = 0

    # -- what the connection calls ---------------------------------------------------------------------
    def push(self, response_id: str, pcm48: bytes) -> None:
        if not pcm48:
            return
        reply = self._replies.setdefault(response_id, _Reply())
        reply.queued += len(pcm48)
        if self._queue and self._queue[-1][0] == response_id:
            self._queue[-1][1].extend(pcm48)
        else:
            self._queue.append((response_id, bytearray(pcm48)))

    def complete(self, response_id: str) -> None:
        """The response's audio is all queued: ``stopped`` follows its last frame (if it had any)."""
        if (reply := self._replies.get(response_id)) is not None:
            reply.complete = True

    def purge(self, response_id: str | None) -> bool:
        """Drop unsent audio (of one response, or all): the next frame is silence. A purged response
        gets no ``stopped`` (``output_audio_buffer.cleared`` instead). True when it was playing."""
        self._queue = deque((r, b) for r, b in self._queue if response_id is not None and r != response_id)
        playing = False
        for rid in [r for r in self._replies if response_id is None or r == response_id]:
            playing = playing or self._replies.pop(rid).sent_ms > 0
        return playing

    def sent_ms(self, response_id: str) -> float:
        reply = self._replies.get(response_id)
        return 0.0 if reply is None else reply.sent_ms

    # -- what aiortc's sender calls ----------------------------------------------------------------------
    async def recv(self) -> AudioFrame:
        pcm = await self.next_pcm()
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(pcm)
        frame.pts = self._pts
        frame.sample_rate = RATE
        frame.time_base = TIME_BASE
        return frame

    async def next_pcm(self) -> bytes:
        """The next 20 ms frame (48 kHz mono PCM16) once its slot comes: ``recv`` without the frame
        object (the Opus sender in ``inline_codecs`` encodes these)."""
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:
            self._pts += FRAME_SAMPLES
            due = self._start + self._pts / RATE
            self.ledger.frame_late(max(0.0, now - due))
            await asyncio.sleep(max(0.0, due - now))
        return self._next_frame_bytes()

    def _next_frame_bytes(self) -> bytes:
        out = bytearray()
        while len(out) < FRAME_BYTES and self._queue:
            rid, buf = self._queue[0]
            take = bytes(buf[: FRAME_BYTES - len(out)])
            del buf[: len(take)]
            if not buf:
                self._queue.popleft()
            out += take
            reply = self._replies[rid]
            if reply.sent_ms == 0.0:
                self.on_started(rid)
            reply.queued -= len(take)
            reply.sent_ms += len(take) / 2 / RATE * 1000
            if reply.sent_ms - reply.reported_ms >= SENT_REPORT_MS:
                reply.reported_ms = reply.sent_ms
                self.on_sent(rid, reply.sent_ms)
        for rid in [r for r, reply in self._replies.items() if reply.complete and reply.queued <= 0]:
            reply = self._replies.pop(rid)
            if reply.sent_ms > 0:
                self.on_sent(rid, reply.sent_ms)
                self.on_stopped(rid)
        if out:
            self.ledger.reply_frame(underrun=len(out) < FRAME_BYTES and self._mid_reply())
        elif self._mid_reply():
            self.ledger.reply_frame(underrun=True)
        return bytes(out.ljust(FRAME_BYTES, b"\x00"))

    def _mid_reply(self) -> bool:
        """A reply has started playing and more of it is still to come."""
        return any(r.sent_ms > 0 and not (r.complete and r.queued <= 0) for r in self._replies.values())


class CallerAudio:
    """Decoded frames of the caller's track -> mono PCM16 at the codec's rate, the missing audio (gaps in
    the frames' timestamps: lost packets) filled with silence and counted. Runs beside the peer
    connection (the gateway's process or a media worker)."""

    def __init__(self, ledger: MediaLedger) -> None:
        self.ledger = ledger
        self.clock_rate = RATE
        """The caller's codec's sample rate (RTP timestamps count in it)."""
        self._next_pts: int | None = None

    def mono(self, frame: AudioFrame) -> bytes:
        self.clock_rate = frame.sample_rate
        samples = frame.to_ndarray()
        channels = len(frame.layout.channels)
        if samples.dtype != np.int16:  # planar/float layouts some decoders give
            samples = (np.clip(samples.astype(np.float32), -1.0, 1.0) * 32767).astype(np.int16)
        mono = downmix(samples, channels)
        self.ledger.input_received(frame.samples / frame.sample_rate)
        if (missing := self._missing_samples(frame)) > 0:
            self.ledger.input_concealed(missing / frame.sample_rate)
            mono = np.concatenate([np.zeros(missing, dtype="<i2"), mono])
        return np.ascontiguousarray(mono, dtype="<i2").tobytes()

    def _missing_samples(self, frame: AudioFrame) -> int:
        """Samples between the previous frame's end and this one's start (RTP timestamps, which aiortc
        makes monotonic): the caller's audio that never came."""
        if frame.pts is None or frame.time_base is None:
            return 0
        pts_per_sample = float(frame.time_base * frame.sample_rate)  # 1 for RTP's clock
        expected, self._next_pts = self._next_pts, frame.pts + round(frame.samples / pts_per_sample)
        if expected is None or frame.pts <= expected:
            return 0
        missing = round((frame.pts - expected) * pts_per_sample)
        return missing if missing <= MAX_CONCEALED_GAP_S * frame.sample_rate else 0


def downmix(samples: np.ndarray, channels: int) -> np.ndarray:
    """Interleaved int16 samples -> mono, the channels' mean truncated toward zero. Stereo (Opus) in
    integers: the same samples as the float mean, without its float64 arrays."""
    if channels == 1:
        return samples.reshape(-1)
    if channels == 2:
        pairs = samples.reshape(-1, 2)
        total = np.add(pairs[:, 0], pairs[:, 1], dtype=np.int32)
        total += total < 0
        total >>= 1
        return total.astype("<i2")
    return samples.reshape(-1, channels).mean(axis=1).astype("<i2")


class InputConverter:
    """The caller's mono PCM16 -> bytes in the session's input format at its rate (``audio/pcm`` at 16 or
    24 kHz, G.711 at 8 kHz: the session's settings pair them, ``audio.input_rate``). The resampler keeps
    its filter state across frames (no clicks); audio already at the session's rate (resampled where the
    media runs) passes through."""

    def __init__(self) -> None:
        self._resampler: audio.StreamingResampler | None = None

    def convert(self, mono: bytes, rate: int, input_format: str, input_rate: int) -> bytes:
        r = self._resampler
        if r is None or r.in_rate != rate or r.out_rate != input_rate:
            r = self._resampler = audio.StreamingResampler(rate, input_rate)
        pcm = r.push(mono)
        if input_format == "audio/pcmu":
            return audio.ulaw_encode(pcm)
        if input_format == "audio/pcma":
            return audio.alaw_encode(pcm)
        return pcm


class OutputConverter:
    """Reply audio in the session's output format -> 48 kHz PCM16 for ``ReplyTrack``."""

    def __init__(self) -> None:
        self._resampler: audio.StreamingResampler | None = None

    def convert(self, data: bytes, output_format: str) -> bytes:
        if output_format == "audio/pcmu":
            pcm, rate = audio.ulaw_decode(data), 8000
        elif output_format == "audio/pcma":
            pcm, rate = audio.alaw_decode(data), 8000
        else:
            pcm, rate = data, audio.OUTPUT_RATE
        r = self._resampler
        if r is None or r.in_rate != rate:
            r = self._resampler = audio.StreamingResampler(rate, RATE)
        return r.push(pcm)

    def flush(self) -> bytes:
        """At a reply's end: the filter's withheld tail (48 kHz)."""
        r, self._resampler = self._resampler, None
        return b"" if r is None else r.flush()


class ReplyFeed:
    """What a call's connection pushes into its ``ReplyTrack``: reply audio in the session's output
    format, converted to the track's 48 kHz here, where the media runs (in a media worker: off the
    sessions' loop). Each response has its own converter: another response's end or purge (an
    out-of-band one finishing mid-reply) never takes or cuts this one's filter state."""

    def __init__(self, track: ReplyTrack) -> None:
        self.track = track
        self._to_track: dict[str, OutputConverter] = {}

    def push(self, response_id: str, audio: bytes, output_format: str) -> None:
        converter = self._to_track.setdefault(response_id, OutputConverter())
        self.track.push(response_id, converter.convert(audio, output_format))

    def complete(self, response_id: str) -> None:
        """The reply's last audio, the resampler's withheld tail included, goes out under its id."""
        if (converter := self._to_track.pop(response_id, None)) is not None:
            self.track.push(response_id, converter.flush())
        self.track.complete(response_id)

    def purge(self, response_id: str | None) -> bool:
        if response_id is None:
            self._to_track.clear()
        else:
            self._to_track.pop(response_id, None)
        return self.track.purge(response_id)
