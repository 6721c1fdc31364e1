"""Turn-taking on the input audio: server VAD decisions, barge-in, the duplex overlap policy and the
playback ledger. Pure.

``Turns`` owns the live VAD stream (ids never reused: results of a replaced stream are stale), the
``TurnDetector`` that turns speech probabilities into starts and stops, the open ``Overlap`` (user
speech over assistant speech, duplex only), the idle timer, and ``Playbacks`` (what the client has
heard, from ``PlaybackStarted`` and ``playback.ack``). It decides; the session carries out what it
decides, in order, between the effects it returns: ``Interrupt`` (barge in now), ``UserTurn``
(commit this span of input audio as a user item, maybe answer it) and ``Backchannel`` (drop it),
each followed by ``TurnEnded``, the one outcome every end of a user's turn has (a client's commit and
the idle timeout too: ``committed``, ``timed_out``).

A VAD stream the transport cannot open or reopen (``VadUnavailable``) is reported once as
``server_busy``; the session then goes on without one, as with ``turn_detection: null`` (the client
commits), until a ``session.update`` sets turn detection again.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import VadProbs
from realtime_gw.sessions.conversation import Conversation
from realtime_gw.sessions.duplex import Decision, Overlap, OverlapPolicy, Playbacks
from realtime_gw.sessions.events import (
    Effect,
    FeedVad,
    Ids,
    PlaybackStarted,
    PurgeAudio,
    StartVad,
    StopVad,
    TurnVerdict,
    VadUnavailable,
)
from realtime_gw.sessions.settings import SEMANTIC_SILENCE_MS, SessionError, SessionSettings
from realtime_gw.sessions.turn_detection import PauseHeard, SpeechStarted, SpeechStopped, TurnDetector

ACK_TOLERANCE_MS = 80
"""One frame: a client may ack a frame it just received."""
SEMANTIC_PREFIX_MS = 300


@dataclass(frozen=True, slots=True)
class Interrupt:
    """Barge in: cancel the live response and cut the assistant audio back to what was heard."""


@dataclass(frozen=True, slots=True)
class UserTurn:
    """The user's turn ended: commit ``start_ms..end_ms`` of input audio as item ``item_id``."""

    item_id: str
    start_ms: float
    end_ms: float
    respond: bool
    """Answer it (``create_response``): now, or after the live response."""
    silence_ms: float = 0.0
    """The silence the audio ends with, heard by the VAD before it ended the turn."""


@dataclass(frozen=True, slots=True)
class Backchannel:
    """Speech over the assistant that is not a turn ("uh-huh", or its own echo): drop the audio."""

    start_ms: float
    end_ms: float


@dataclass(frozen=True, slots=True)
class TurnEnded:
    """The user's turn is over, however it ended (committed, dropped, timed out): what waits for the
    end of a turn may go on (a speech-to-speech model held silent may answer)."""


Decided = Interrupt | UserTurn | Backchannel | TurnEnded
Decided = Decided | PauseHeard  # semantic VAD: the session asks the turn model
TurnDetection = rt.ServerVad | rt.SemanticVad


def prefix_ms(td: TurnDetection) -> int:
    """Audio kept before the start of speech."""
    return td.prefix_padding_ms if isinstance(td, rt.ServerVad) else SEMANTIC_PREFIX_MS


class Turns:
    def __init__(self, ids: Ids, duplex: bool, now: float = 0.0) -> None:
        self.ids = ids
        self.duplex = duplex
        self.detector = TurnDetector()
        self.playbacks = Playbacks()
        self.overlap: Overlap | None = None
        self.speech_item_id: str | None = None
        """The item id announced in ``speech_started``, for the commit that ends the turn."""
        self.vad_stream = 0
        """The live VAD stream; 0: none (manual turns, or VAD unavailable)."""
        self.vad_origin_ms = 0.0
        """Where the live stream's audio starts on the input timeline."""
        self.last_activity = now
        self._vad_ids = itertools.count(1)

    # -- the VAD stream ------------------------------------------------------------------------------
    def configure(self, td: TurnDetection | None) -> None:
        if isinstance(td, rt.ServerVad):
            self.detector.threshold = td.threshold
            self.detector.silence_duration_ms = td.silence_duration_ms
            self.detector.semantic(None)
        elif isinstance(td, rt.SemanticVad):
            self.detector.threshold = 0.5
            # The turn model judges each pause; silence length alone only when it cannot answer.
            self.detector.semantic(td.eagerness, fallback_ms=SEMANTIC_SILENCE_MS[td.eagerness])

    def restart_vad(self, td: TurnDetection | None, rate: int, origin_ms: float) -> list[Effect]:
        """Replace the VAD stream (a new one hears audio from ``origin_ms`` on), or stop it."""
        out: list[Effect] = [StopVad(self.vad_stream)] if self.vad_stream else []
        self.reset()
        self.overlap = None
        if td is None:
            self.vad_stream = 0
            return out
        self.vad_stream = next(self._vad_ids)
        self.vad_origin_ms = origin_ms
        out.append(StartVad(self.vad_stream, rate))
        return out

    def vad_unavailable(self, ev: VadUnavailable) -> list[Effect]:
        """The live stream could not be opened or reopened: say so once, then go on without it."""
        if not self.vad_stream or ev.stream_id != self.vad_stream:
            return []  # a stream that was replaced or stopped meanwhile
        self.vad_stream = 0
        self.detector.reset()  # the turn in progress is the client's to commit now
        self.overlap = None
        message = f"Server VAD unavailable ({ev.reason}); commit input audio with input_audio_buffer.commit"
        return [self.ids.error(message, "server_busy", type="server_error"), StopVad(ev.stream_id)]

    def is_current(self, stream_id: int) -> bool:
        return stream_id != 0 and stream_id == self.vad_stream

    def listen(self, pcm: bytes) -> list[Effect]:
        """Appended audio: the live VAD stream hears it."""
        return [FeedVad(self.vad_stream, pcm)] if self.vad_stream else []

    def reset(self) -> None:
        """The buffer was committed or cleared: no turn is in progress."""
        self.detector.reset()
        self.speech_item_id = None

    def committed(self) -> list[Decided]:
        """The client committed the input buffer: that ended the user's turn."""
        self.reset()
        return [TurnEnded()]

    def timed_out(self, item_id: str, start_ms: float, end_ms: float) -> list[Decided]:
        """``idle_timeout_ms`` passed (``idle_timeout_due``): the buffer is the user's turn, answered."""
        return [UserTurn(item_id, start_ms, end_ms, respond=True), TurnEnded()]

    # -- hearing -------------------------------------------------------------------------------------
    def windows(self, probs: VadProbs) -> list[tuple[float, float, float]]:
        """``(start_ms, window_ms, prob)`` per window, on the input timeline."""
        origin = self.vad_origin_ms + probs.start_ms
        return [(origin + i * probs.window_ms, probs.window_ms, p) for i, p in enumerate(probs.probs)]

    def hear(
        self, s: SessionSettings, start_ms: float, window_ms: float, prob: float, now: float, responding: bool
    ) -> list[Effect | Decided]:
        """One VAD window (one at a time, so an overlap is decided at the window it crosses a
        threshold, and each decision sees the state the previous one left)."""
        td = s.turn_detection
        assert td is not None
        out: list[Effect | Decided] = []
        for d in self.detector.feed(start_ms, window_ms, [prob]):
            if isinstance(d, SpeechStarted):
                out += self._speech_started(s, td, d, now, responding)
            elif isinstance(d, PauseHeard):
                out.append(d)  # the session asks the turn model
            else:
                out += self._speech_stopped(s, td, d, now)
        overlap = self.overlap
        if overlap is not None and self.detector.speaking and self._barges_in(s, overlap):
            out.append(self._decided(overlap, Decision.BARGE_IN, "speech long enough to interrupt"))
            out.append(Interrupt())
        return out

    def _barges_in(self, s: SessionSettings, overlap: Overlap) -> bool:
        return OverlapPolicy(s.duplex).during(overlap, self.detector.last_voice_ms) is Decision.BARGE_IN

    def keep_from_ms(self, td: TurnDetection) -> float | None:
        """While nobody talks, only the next turn's prefix padding need be kept."""
        return None if self.detector.speaking else self.detector.position_ms - prefix_ms(td)

    def _speech_started(
        self, s: SessionSettings, td: TurnDetection, d: SpeechStarted, now: float, responding: bool
    ) -> list[Effect | Decided]:
        self.speech_item_id = self.ids.new("item")
        self.last_activity = now
        started = rt.InputAudioBufferSpeechStartedEvent(audio_start_ms=int(d.start_ms), item_id=self.speech_item_id)
        out: list[Effect | Decided] = [self.ids.send(started)]
        if not td.interrupt_response:
            return out
        playback = self.playbacks.audible(now)
        if self.duplex and playback is not None:
            # Over assistant speech: let the overlap policy decide instead of cutting in at once.
            assert playback.started_at is not None
            heard_for_ms = (now - playback.started_at) * 1000.0
            self.overlap = OverlapPolicy(s.duplex).begin(d.start_ms, heard_for_ms)
        elif responding or playback is not None:
            out.append(Interrupt())
        return out

    def _speech_stopped(self, s: SessionSettings, td: TurnDetection, d: SpeechStopped, now: float) -> list[Effect | Decided]:
        item_id = self.speech_item_id or self.ids.new("item")
        self.speech_item_id = None
        self.last_activity = now
        stopped = rt.InputAudioBufferSpeechStoppedEvent(audio_end_ms=int(d.end_ms), item_id=item_id)
        out: list[Effect | Decided] = [self.ids.send(stopped)]
        overlap, self.overlap = self.overlap, None
        decision = None if overlap is None else OverlapPolicy(s.duplex).end(overlap, d.end_ms)
        if overlap is not None and decision is not None:
            reason = (
                "speech began inside the echo guard"
                if overlap.echo
                else "short backchannel"
                if decision is Decision.DROP
                else "speech between backchannel and barge-in lengths"
            )
            out.append(self._decided(overlap, decision, reason, d.end_ms, item_id))
        start = d.start_ms - prefix_ms(td)
        if decision is Decision.DROP:
            out.append(Backchannel(start, d.commit_ms))  # not a user turn
        else:
            silence = max(d.commit_ms - d.end_ms, 0.0)
            out.append(UserTurn(item_id, start, d.commit_ms, respond=td.create_response, silence_ms=silence))
        return [*out, TurnEnded()]

    def verdict(self, s: SessionSettings, ev: TurnVerdict, now: float) -> list[Effect | Decided]:
        """The turn model's answer (semantic VAD): the turn ends if it is complete."""
        td = s.turn_detection
        if not isinstance(td, rt.SemanticVad) or not self.vad_stream:
            return []
        stops = self.detector.verdict(ev.pause_id, ev.probability)
        return [step for d in stops for step in self._speech_stopped(s, td, d, now)]

    def _decided(
        self, overlap: Overlap, decision: Decision, reason: str, end_ms: float | None = None, item_id: str | None = None
    ) -> Effect:
        playback = self.playbacks.latest()
        end = self.detector.last_voice_ms if end_ms is None else end_ms
        return self.ids.send(
            rt.OverlapDecisionEvent(
                decision=decision.value,
                item_id=item_id or self.speech_item_id or "",
                response_id=playback.response_id if playback else "",
                audio_start_ms=int(overlap.start_ms),
                speech_ms=int(end - overlap.start_ms),
                reason=reason,
            )
        )

    def idle_timeout_due(self, td: TurnDetection | None, now: float, busy: bool) -> bool:
        """``idle_timeout_ms`` of server VAD: nobody spoke, nothing was answered, for that long."""
        if not isinstance(td, rt.ServerVad) or not td.idle_timeout_ms or not self.vad_stream:
            return False
        if self.detector.speaking or busy:
            self.last_activity = now
            return False
        if (now - self.last_activity) * 1000 < td.idle_timeout_ms:
            return False
        self.last_activity = now
        return True

    # -- playback ------------------------------------------------------------------------------------
    def playback_started(self, ev: PlaybackStarted) -> list[Effect]:
        playback = self.playbacks.get(ev.response_id)
        if playback is not None and playback.started_at is None:
            playback.started_at = ev.at
        return []

    def ack(self, ev: rt.PlaybackAckEvent, now: float) -> list[Effect]:
        playback = self.playbacks.get(ev.response_id)
        if playback is None:
            raise SessionError(
                f"Unknown response '{ev.response_id}': no audio of it is being tracked", "unknown_response", "response_id"
            )
        if ev.played_ms > playback.audio_ms + ACK_TOLERANCE_MS:
            raise SessionError(
                f"played_ms {ev.played_ms} is past the response's audio ({int(playback.audio_ms)} ms)",
                "invalid_value",
                "played_ms",
            )
        played = playback.ack(min(float(ev.played_ms), playback.audio_ms), now)
        acked = rt.PlaybackAcknowledgedEvent(
            response_id=ev.response_id, played_ms=int(played), audio_ms=int(playback.audio_ms)
        )
        return [self.ids.send(acked)]

    def cut_playback(self, now: float, conversation: Conversation, response_cancelled: bool) -> list[Effect]:
        """Barge-in on the newest assistant audio: stop what still plays (unless cancelling the
        response already purged it) and cut its item back to what the client has heard."""
        playback = self.playbacks.latest()
        if playback is None:
            return []
        out: list[Effect] = []
        if not response_cancelled and playback.audible(now):
            cleared = rt.OutputAudioBufferClearedEvent(response_id=playback.response_id)
            out += [PurgeAudio(playback.response_id), self.ids.send(cleared)]
        playback.finished = True
        played = playback.played_ms(now)
        for item_id, start_ms in playback.items():  # one message per model round of the response
            if item_id not in conversation:
                continue
            entry = conversation.get(item_id)
            heard = max(0.0, played - start_ms)
            if heard < entry.audio_ms - 1e-6:
                entry.truncate(heard)
                truncated = rt.ConversationItemTruncatedEvent(
                    item_id=item_id, content_index=0, audio_end_ms=round(heard)
                )
                out.append(self.ids.send(truncated))
        playback.audio_ms = min(playback.audio_ms, played)
        return out

    def stop_item_playback(self, item_id: str, audio_end_ms: float, now: float) -> list[Effect]:
        """The client truncated an assistant item: it stopped listening at ``audio_end_ms``."""
        found = self.playbacks.of_item(item_id)
        if found is None:
            return []
        playback, start_ms = found
        out: list[Effect] = [PurgeAudio(playback.response_id)] if playback.audible(now) else []
        playback.finished = True
        playback.audio_ms = min(playback.audio_ms, start_ms + audio_end_ms)
        return out
