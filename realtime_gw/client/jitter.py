"""A playback jitter buffer for 24 kHz PCM16 frames. Pure: no I/O, no clock of its own.

Frames arrive tagged ``(response_id, seq)``; playback pulls a number of samples at a time (a sound
card callback, or a virtual clock in tests and load generators). Keeping the playback position per
response is what makes barge-in exact: ``played_ms(response_id)`` is the ``audio_end_ms`` a client
sends in ``conversation.item.truncate`` and the ``played_ms`` of ``playback.ack``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

BYTES_PER_SAMPLE = 2


@dataclass
class _Stream:
    """Per-response bookkeeping."""

    next_seq: int = 0
    pending: dict[int, bytes] = field(default_factory=dict)  # out-of-order frames waiting for a gap
    played_samples: int = 0
    received_samples: int = 0
    ended: bool = False
    muted: bool = False
    """Flushed by barge-in: frames still in flight from the server are dropped, not played."""
    lost: int = 0
    duplicates: int = 0


class JitterBuffer:
    """Reorders frames per response, holds ``prebuffer_ms`` before starting, counts underruns.

    Responses play back to back in the order their first frame arrived.
    """

    def __init__(self, rate: int = 24000, prebuffer_ms: float = 120.0, max_pending: int = 8) -> None:
        self.rate = rate
        self.prebuffer_samples = int(rate * prebuffer_ms / 1000)
        self.max_pending = max_pending
        self._queue: deque[tuple[str, memoryview]] = deque()
        self._queued_samples = 0
        self._streams: dict[str, _Stream] = {}
        self._playing = False
        self.underruns = 0
        """Pulls that ran dry while a response was still expected to continue."""
        self.current: str | None = None
        """The response whose audio was pulled last."""

    # -- input ---------------------------------------------------------------------------------------
    def push(self, response_id: str, seq: int, pcm: bytes) -> str:
        """Add one frame. Returns 'ok', 'duplicate', 'gap' (frames before it are missing so far) or
        'muted' (the response was flushed)."""
        s = self._streams.setdefault(response_id, _Stream())
        if s.muted:
            return "muted"
        if seq < s.next_seq or seq in s.pending:
            s.duplicates += 1
            return "duplicate"
        status = "ok" if seq == s.next_seq else "gap"
        s.pending[seq] = pcm
        self._drain(response_id, s)
        if len(s.pending) > self.max_pending:
            # The missing frame is not coming (a WebSocket does not reorder): skip past the hole.
            self._skip_gap(response_id, s)
        return status

    def end(self, response_id: str) -> None:
        """No more frames will come for this response (response.done): play out what is held."""
        s = self._streams.setdefault(response_id, _Stream())
        if s.pending:
            self._skip_gap(response_id, s)
        s.ended = True

    def flush(self, response_id: str | None = None) -> None:
        """Drop queued audio (barge-in): of one response, or all of it."""
        kept = deque((r, pcm) for r, pcm in self._queue if response_id is not None and r != response_id)
        self._queue = kept
        self._queued_samples = sum(len(p) // BYTES_PER_SAMPLE for _, p in kept)
        for rid, s in self._streams.items():
            if response_id is None or rid == response_id:
                s.pending.clear()
                s.ended = s.muted = True
        if not self._queue:
            self._playing = False

    def _drain(self, response_id: str, s: _Stream) -> None:
        while s.next_seq in s.pending:
            pcm = s.pending.pop(s.next_seq)
            s.next_seq += 1
            s.received_samples += len(pcm) // BYTES_PER_SAMPLE
            self._queue.append((response_id, memoryview(pcm)))
            self._queued_samples += len(pcm) // BYTES_PER_SAMPLE

    def _skip_gap(self, response_id: str, s: _Stream) -> None:
        first = min(s.pending)
        s.lost += first - s.next_seq
        s.next_seq = first
        self._drain(response_id, s)

    # -- output --------------------------------------------------------------------------------------
    def pull(self, n_samples: int) -> bytes:
        """Exactly ``n_samples`` of audio; silence where nothing is ready (before prebuffer, or dry)."""
        if not self._playing:
            ready = self._queued_samples >= self.prebuffer_samples or self._all_ended()
            if not (ready and self._queue):
                return b"\x00\x00" * n_samples
            self._playing = True
        out = bytearray()
        need = n_samples
        while need and self._queue:
            rid, pcm = self._queue[0]
            take = min(need, len(pcm) // BYTES_PER_SAMPLE)
            out += pcm[: take * BYTES_PER_SAMPLE]
            self._streams[rid].played_samples += take
            self.current = rid
            self._queued_samples -= take
            need -= take
            if take * BYTES_PER_SAMPLE == len(pcm):
                self._queue.popleft()
            else:
                self._queue[0] = (rid, pcm[take * BYTES_PER_SAMPLE :])
        if need:
            if not self._all_ended():
                self.underruns += 1
            self._playing = False  # re-prebuffer before resuming, rather than stutter
            out += b"\x00\x00" * need
        return bytes(out)

    def _all_ended(self) -> bool:
        return all(s.ended for s in self._streams.values())

    # -- queries -------------------------------------------------------------------------------------
    def played_ms(self, response_id: str) -> float:
        s = self._streams.get(response_id)
        return 0.0 if s is None else s.played_samples * 1000.0 / self.rate

    def received_ms(self, response_id: str) -> float:
        s = self._streams.get(response_id)
        return 0.0 if s is None else s.received_samples * 1000.0 / self.rate

    def is_playing(self, response_id: str) -> bool:
        """True while audio of this response is queued or has started and not finished."""
        return any(r == response_id for r, _ in self._queue)

    def stats(self, response_id: str) -> tuple[int, int]:
        """(lost, duplicate) frames of one response."""
        s = self._streams.get(response_id)
        return (0, 0) if s is None else (s.lost, s.duplicates)

    @property
    def buffered_ms(self) -> float:
        return self._queued_samples * 1000.0 / self.rate

    def finished(self) -> list[str]:
        """Responses that ended and whose audio has all been played (or flushed)."""
        queued = {r for r, _ in self._queue}
        return [rid for rid, s in self._streams.items() if s.ended and rid not in queued]

    def forget(self, response_id: str) -> None:
        """Drop bookkeeping of a finished response (long sessions must not grow without bound)."""
        if not self.is_playing(response_id):
            self._streams.pop(response_id, None)
            if self.current == response_id:
                self.current = None
