"""The input audio buffer: what the client appended and has not yet committed or cleared. Pure.

Audio is kept as PCM16 at the session's input rate (G.711 is decoded on append) and placed on the
session's input-audio timeline: ``start_ms`` is where its first byte sits, so the positions VAD reports
(ms since its stream opened, plus that stream's origin) map to byte offsets. ``append`` returns the
PCM it kept: that, and nothing else, is what VAD hears.
"""

from __future__ import annotations

import base64
import binascii

from realtime_gw.protocols import audio
from realtime_gw.sessions.settings import SessionError

MIN_COMMIT_MS = 100
"""As OpenAI: a commit needs at least 100 ms of audio."""


class InputBuffer:
    def __init__(self, max_bytes: int, input_format: str = "audio/pcm", rate: int = 24000) -> None:
        self.max_bytes = max_bytes
        self.format = input_format
        """The wire format appends arrive in."""
        self.rate = rate
        """Sample rate of the PCM held."""
        self.pcm = bytearray()
        self.start_ms = 0.0

    def __len__(self) -> int:
        return len(self.pcm)

    @property
    def bytes_per_ms(self) -> float:
        return self.rate * 2 / 1000.0

    @property
    def end_ms(self) -> float:
        return self.start_ms + len(self.pcm) / self.bytes_per_ms

    def reformat(self, input_format: str, rate: int) -> bool:
        """Take appends in a new format from now on. Audio in the old one cannot be mixed with the
        new and is dropped. Returns whether anything changed."""
        if (input_format, rate) == (self.format, self.rate):
            return False
        self.format, self.rate = input_format, rate
        self.pcm.clear()
        return True

    def append(self, data: bytes) -> bytes:
        """Decode ``data`` and keep it; returns the PCM kept. Raises ``SessionError`` (keeping nothing)
        when it does not decode or would overflow the buffer."""
        try:
            pcm = audio.decode_input(data, self.format)
        except ValueError as e:
            raise SessionError(str(e), "invalid_value", "audio") from None
        if len(self.pcm) + len(pcm) > self.max_bytes:
            raise SessionError(
                f"Input audio buffer would exceed {self.max_bytes} bytes; commit or clear it first",
                "input_audio_buffer_full",
                "audio",
            )
        self.pcm += pcm
        return pcm

    def check_commit(self) -> None:
        """A client commit needs ``MIN_COMMIT_MS`` of audio."""
        if len(self.pcm) < MIN_COMMIT_MS * self.bytes_per_ms:
            raise SessionError(
                f"Error committing input audio buffer: buffer too small. Expected at least {MIN_COMMIT_MS}ms "
                f"of audio, but buffer only has {len(self.pcm) / self.bytes_per_ms:.2f}ms of audio.",
                "input_audio_buffer_commit_empty",
            )

    def take(self, start_ms: float, end_ms: float) -> bytes:
        """Remove the audio up to ``end_ms`` and return the part of it from ``start_ms``."""
        lo = max(0, int((start_ms - self.start_ms) * self.bytes_per_ms) & ~1)
        hi = max(lo, min(len(self.pcm), int((end_ms - self.start_ms) * self.bytes_per_ms) & ~1))
        pcm = bytes(self.pcm[lo:hi])
        del self.pcm[:hi]
        self.start_ms += hi / self.bytes_per_ms
        return pcm

    def peek(self, start_ms: float, end_ms: float | None = None) -> bytes:
        """A copy of the audio held from ``start_ms`` (to ``end_ms``, or the end); nothing is removed."""
        lo = max(0, int((start_ms - self.start_ms) * self.bytes_per_ms) & ~1)
        hi = len(self.pcm) if end_ms is None else int((end_ms - self.start_ms) * self.bytes_per_ms) & ~1
        return bytes(self.pcm[lo : max(lo, min(len(self.pcm), hi))])

    def drop_before(self, ms: float) -> None:
        """Forget the audio before ``ms`` (nobody is talking: only the next turn's prefix is kept)."""
        if ms > self.start_ms:
            self.take(ms, ms)

    def clear(self) -> None:
        self.start_ms = self.end_ms
        self.pcm.clear()


def decode_audio_part(data: str, input_format: str) -> bytes:
    """The PCM of an ``input_audio`` content part: base64 in the session's input format."""
    try:
        return audio.decode_input(base64.b64decode(data, validate=True), input_format)
    except (ValueError, binascii.Error) as e:
        raise SessionError(f"Invalid input_audio: {e}", "invalid_value", "item.content.audio") from None
