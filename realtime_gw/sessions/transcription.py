"""Streamed transcription of the user's turn: which ASR stream is live, what it was sent, and which
words already went out as deltas. Pure.

A turn's stream starts when the user starts speaking (server VAD's ``speech_started``, with the
audio kept before it) or, when the client commits itself, with the first append after a commit. It
hears every append, ends at the commit (``Transcribe(streamed=True)``: the transcript comes back
within a worker step) and is cancelled by ``input_audio_buffer.clear``, a dropped backchannel, a
newer turn or the end of the session. Its item id is the one ``speech_started`` announced, so the
deltas and the committed item agree.

Deltas carry the words two consecutive partial hypotheses agree on, each without its last word (the
one most likely to change: "to" may yet become "tomorrow"), past the number already sent. Agreement
of two hypotheses over different lengths of audio ("local agreement", as in whisper-streaming) keeps
the deltas within a word or two of the transcript however the audio was chunked; the last word alone
(the simpler rule) let a third of the words differ. Sent words cannot be taken back: where the
recogniser later revises one, the deltas keep it and go on with the words after it. The final delta carries the transcript's words
past those sent; ``.completed`` has the whole transcript.

A commit without a stream (a turn that began without one, an idle timeout) transcribes its audio in
one shot. When the transport reports that a turn's stream could not be opened (``AsrUnavailable``: no
free decoder), the turn keeps its item id but is no longer fed, and its commit asks for the one-shot
decode (``Transcribe(streamed=False)``), which waits for the session's earlier turns, then a moment
for a decoder (``server/listen_effects.py``); if none frees, the transcription fails
(``...input_audio_transcription.failed``) while the turn itself goes on.
``Transcribe`` always carries the committed audio, so a stream whose refusal was still on its way at
the commit is decoded in one shot too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from realtime_gw.protocols import realtime as rt
from realtime_gw.sessions.events import (
    AsrUnavailable,
    CancelAsr,
    Effect,
    FeedAsr,
    Ids,
    Send,
    StartAsr,
    Transcribe,
    TranscriptionDelta,
    TranscriptionDone,
)


@dataclass(slots=True)
class TurnStream:
    item_id: str
    rate: int
    sent: list[str] = field(default_factory=list)
    """Words already sent as deltas."""
    heard: list[str] = field(default_factory=list)
    """The last partial hypothesis but its last word."""
    streamed: bool = True
    """False once the transport reported that no stream could be opened (``AsrUnavailable``)."""


class Transcriber:
    def __init__(self, ids: Ids) -> None:
        self.ids = ids
        self.live: TurnStream | None = None
        """The stream hearing the turn in progress."""
        self.ending: dict[str, TurnStream] = {}
        """Committed turns whose transcript is on its way, by item id."""

    @property
    def live_item_id(self) -> str | None:
        return self.live.item_id if self.live is not None else None

    def start(self, item_id: str, rate: int, backlog: bytes) -> list[Effect]:
        """A turn begins; ``backlog``: its audio already appended."""
        out = self.cancel()
        self.live = TurnStream(item_id, rate)
        return [*out, StartAsr(item_id, rate), *([FeedAsr(item_id, backlog)] if backlog else [])]

    def feed(self, pcm: bytes) -> list[Effect]:
        s = self.live
        return [FeedAsr(s.item_id, pcm)] if s is not None and s.streamed and pcm else []

    def unavailable(self, ev: AsrUnavailable) -> list[Effect]:
        """The turn's stream could not be opened: it is heard in one shot at its commit instead."""
        s = self._stream(ev.item_id)
        if s is not None:
            s.streamed = False
        return []

    def end(self, item_id: str, pcm: bytes, rate: int, silence_s: float = 0.0) -> list[Effect]:
        """The turn was committed as ``item_id`` with ``pcm`` (ending in ``silence_s`` of silence, as
        the VAD heard it): its stream ends, or (no stream heard it) the audio is transcribed in one shot."""
        s = self.live
        if s is None or s.item_id != item_id:
            return [*self.cancel(), Transcribe(item_id, pcm, rate)]
        self.live = None
        if not s.streamed:
            return [Transcribe(item_id, pcm, rate)]
        self.ending[item_id] = s
        return [Transcribe(item_id, pcm, rate, streamed=True, silence_s=silence_s)]

    def cancel(self) -> list[Effect]:
        """The turn in progress will not be committed (cleared, dropped, replaced)."""
        s, self.live = self.live, None
        return [CancelAsr(s.item_id)] if s is not None and s.streamed else []

    def close(self) -> list[Effect]:
        out = self.cancel() + [CancelAsr(item_id) for item_id in self.ending]
        self.ending.clear()
        return out

    def partial(self, ev: TranscriptionDelta, wanted: bool) -> list[Effect]:
        """A partial hypothesis: the words it adds, as a delta (``wanted``: the client asked for
        transcription)."""
        s = self._stream(ev.item_id)
        if s is None or not wanted:
            return []
        s.heard, new = settled_words(s.heard, s.sent, ev.text)
        if not new:
            return []
        delta = (" " if s.sent else "") + " ".join(new)
        s.sent += new
        event = rt.ConversationItemInputAudioTranscriptionDeltaEvent(item_id=ev.item_id, content_index=0, delta=delta)
        return [self.ids.send(event)]

    def finished(self, ev: TranscriptionDone, effects: list[Effect]) -> list[Effect]:
        """The session's effects for a transcript, with its delta cut to the words not yet sent."""
        s = self.ending.pop(ev.item_id, None)
        if s is None or not s.sent:
            return effects
        rest = (ev.text or "").split()[len(s.sent) :]
        out: list[Effect] = []
        for e in effects:
            if isinstance(e, Send) and isinstance(e.event, rt.ConversationItemInputAudioTranscriptionDeltaEvent):
                if e.event.item_id == ev.item_id and not rest:
                    continue
                if e.event.item_id == ev.item_id:
                    e.event.delta = " " + " ".join(rest)
            out.append(e)
        return out

    def _stream(self, item_id: str) -> TurnStream | None:
        if self.live is not None and self.live.item_id == item_id:
            return self.live
        return self.ending.get(item_id)


def settled_words(heard: list[str], sent: list[str], hypothesis: str) -> tuple[list[str], list[str]]:
    """Local agreement: (the new hypothesis but its last word, to be ``heard`` next time; the words it
    and the previous one agree on past the ``sent`` ones)."""
    words = hypothesis.split()[:-1]
    stable = _common_prefix(heard, words)
    return words, stable[len(sent) :]


def _common_prefix(a: list[str], b: list[str]) -> list[str]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]
