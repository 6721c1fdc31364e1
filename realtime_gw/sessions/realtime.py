"""The pure state machine of one ``/v1/realtime`` session: ``handle(event, now) -> list[Effect]``.

It owns the session config, the input audio buffer, server-VAD turn state, the conversation and the
one live response. It never awaits or calls a model; the transport runs its effects and feeds worker
results back in. Every rule about ordering (exactly one ``response.done`` per response, no output of a
cancelled epoch) lives here.
"""

from __future__ import annotations

import base64
import binascii
import itertools
from typing import Any

import msgspec
from msgspec import UNSET

from realtime_gw.protocols import audio
from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import OUTPUT_RATE, TtsFrame
from realtime_gw.sessions.conversation import (
    Conversation,
    ConversationError,
    Entry,
    SpokenSpan,
    assistant_part,
    heard_text,
    item_text,
)
from realtime_gw.sessions.duplex import Decision, Overlap, OverlapPolicy, Playback
from realtime_gw.sessions.events import (
    AudioDelivered,
    AwaitDelivery,
    CancelResponse,
    ChatMessage,
    Close,
    Effect,
    FeedVad,
    Limits,
    PlaybackStarted,
    PurgeAudio,
    ResponseAudio,
    ResponseFinished,
    ResponseTextDelta,
    Send,
    StartResponse,
    StartVad,
    StopVad,
    Tick,
    Transcribe,
    TranscriptionDone,
    VadResult,
)
from realtime_gw.sessions.response import LiveResponse
from realtime_gw.sessions.settings import (
    OUTPUT_RATES,
    SEMANTIC_SILENCE_MS,
    SessionError,
    SessionSettings,
    apply_session_update,
    check_voice,
)
from realtime_gw.sessions.turn_detection import SpeechStarted, SpeechStopped, TurnDetector

MAX_TRACKED_PLAYBACKS = 16  # responses whose playback can still be acked
ACK_TOLERANCE_MS = 80  # one frame: a client may ack a frame it just received
MIN_COMMIT_MS = 100  # as OpenAI: a commit needs at least 100 ms of audio


class RealtimeSession:
    def __init__(self, session_id: str, limits: Limits, now: float = 0.0, duplex: bool = False) -> None:
        self.id = session_id
        self.duplex = duplex
        self.limits = limits
        self.settings = SessionSettings()
        self.conversation = Conversation(limits.max_items)
        self.closed = False
        # input audio: PCM16 at settings.input_rate; buffer_start_ms is where it sits on the timeline
        self.buffer = bytearray()
        self.buffer_start_ms = 0.0
        self.turns = TurnDetector()
        self.speech_item_id: str | None = None
        self.vad_stream = 0
        self.vad_origin_ms = 0.0
        self.last_activity = now
        self.response: LiveResponse | None = None
        self.epoch = 0
        self.waiting_transcripts: set[str] = set()
        self.playbacks: dict[str, Playback] = {}
        """Assistant audio by response id, newest last (bounded): the playback.ack ledger."""
        self.overlap: Overlap | None = None
        self.respond_after = False
        """A 'listen' utterance arrived during a response: answer it when that response ends."""
        self._ids = itertools.count(1)
        self._vad_ids = itertools.count(1)

    # -- ids -----------------------------------------------------------------------------------------
    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_{self.id[-8:]}{next(self._ids):05d}"

    def _send(self, event: rt.ServerEvent, **kw: Any) -> Send:
        event.event_id = self._new_id("event")
        return Send(event, **kw)

    def _rsend(self, r: LiveResponse, event: rt.ServerEvent, audio_ms: float = 0.0) -> Send:
        """An event of response ``r``: it travels in that response's ordered (paced) lane."""
        return self._send(event, response_id=r.id, audio_ms=audio_ms)

    def error(self, message: str, code: str, param: str | None = None, event_id: str | None = None) -> Send:
        return self._send(rt.error_event(message, code=code, param=param, event_id=event_id))

    @property
    def bytes_per_ms(self) -> float:
        return self.settings.input_rate * 2 / 1000.0

    # -- entry points --------------------------------------------------------------------------------
    def start(self, now: float) -> list[Effect]:
        """Effects for a new connection: ``session.created`` and the default VAD stream."""
        out: list[Effect] = [self._send(rt.SessionCreatedEvent(session=self._wire()))]
        out += self._restart_vad()
        return out

    def handle(self, event: object, now: float) -> list[Effect]:
        if self.closed:
            return []
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise TypeError(f"no handler for {type(event).__name__}")
        try:
            return handler(self, event, now)
        except (SessionError, ConversationError) as e:
            event_id = getattr(event, "event_id", None)
            return [self.error(str(e), e.code, e.param, event_id)]

    def close(self) -> list[Effect]:
        """The connection is gone: cancel the live response and stop the VAD stream."""
        out: list[Effect] = []
        if self.response is not None:
            out += self._cancel("client_disconnected")
        out.append(StopVad(self.vad_stream))
        self.closed = True
        return out

    def _wire(self) -> rt.SessionOut:
        return self.settings.to_wire(self.id, self.limits.model, self.duplex)

    # -- session.update ------------------------------------------------------------------------------
    def _on_session_update(self, ev: rt.SessionUpdateEvent, now: float) -> list[Effect]:
        new = apply_session_update(self.settings, ev.session, self.limits.voices)
        old = self.settings
        restart_vad = (new.turn_detection is None) != (old.turn_detection is None) or (
            new.input_format,
            new.input_rate,
        ) != (old.input_format, old.input_rate)
        if (new.input_format, new.input_rate) != (old.input_format, old.input_rate):
            # Audio in the old format cannot be mixed with the new one.
            self.buffer.clear()
        self.settings = new
        self._configure_turns()
        out: list[Effect] = [self._send(rt.SessionUpdatedEvent(session=self._wire()))]
        if restart_vad:
            out += self._restart_vad()
        return out

    def _check_voice(self, voice: str, param: str) -> str:
        return check_voice(voice, self.limits.voices, param)

    def _configure_turns(self) -> None:
        td = self.settings.turn_detection
        if isinstance(td, rt.ServerVad):
            self.turns.threshold = td.threshold
            self.turns.silence_duration_ms = td.silence_duration_ms
        elif isinstance(td, rt.SemanticVad):
            self.turns.threshold = 0.5
            self.turns.silence_duration_ms = SEMANTIC_SILENCE_MS[td.eagerness]

    def _restart_vad(self) -> list[Effect]:
        out: list[Effect] = [StopVad(self.vad_stream)] if self.vad_stream else []
        self.turns.reset()
        self.speech_item_id = None
        if self.settings.turn_detection is None:
            self.vad_stream = 0
            return out
        self.vad_stream = next(self._vad_ids)
        self.vad_origin_ms = self._buffer_end_ms()
        out.append(StartVad(self.vad_stream, self.settings.input_rate))
        return out

    # -- input audio buffer --------------------------------------------------------------------------
    def _buffer_end_ms(self) -> float:
        return self.buffer_start_ms + len(self.buffer) / self.bytes_per_ms

    def _on_append(self, ev: rt.InputAudioBufferAppendEvent, now: float) -> list[Effect]:
        try:
            pcm = audio.decode_input(ev.audio, self.settings.input_format)
        except ValueError as e:
            raise SessionError(str(e), "invalid_value", "audio") from None
        if len(self.buffer) + len(pcm) > self.limits.max_input_buffer_bytes:
            raise SessionError(
                f"Input audio buffer would exceed {self.limits.max_input_buffer_bytes} bytes; "
                "commit or clear it first",
                "input_audio_buffer_full",
                "audio",
            )
        self.buffer += pcm
        if self.settings.turn_detection is None or not self.vad_stream:
            return []
        return [FeedVad(self.vad_stream, pcm)]

    def _on_commit(self, ev: rt.InputAudioBufferCommitEvent, now: float) -> list[Effect]:
        if len(self.buffer) < MIN_COMMIT_MS * self.bytes_per_ms:
            raise SessionError(
                f"Error committing input audio buffer: buffer too small. Expected at least {MIN_COMMIT_MS}ms "
                f"of audio, but buffer only has {len(self.buffer) / self.bytes_per_ms:.2f}ms of audio.",
                "input_audio_buffer_commit_empty",
            )
        end_ms = self._buffer_end_ms()
        item_id = self.speech_item_id or self._new_id("item")
        self.speech_item_id = None
        self.turns.reset()
        return self._commit_range(item_id, self.buffer_start_ms, end_ms)

    def _on_clear(self, ev: rt.InputAudioBufferClearEvent, now: float) -> list[Effect]:
        self.buffer_start_ms = self._buffer_end_ms()
        self.buffer.clear()
        self.turns.reset()
        self.speech_item_id = None
        return [self._send(rt.InputAudioBufferClearedEvent())]

    def _take(self, start_ms: float, end_ms: float) -> bytes:
        """Remove audio up to ``end_ms`` from the buffer and return the part from ``start_ms``."""
        lo = max(0, int((start_ms - self.buffer_start_ms) * self.bytes_per_ms) & ~1)
        hi = max(lo, min(len(self.buffer), int((end_ms - self.buffer_start_ms) * self.bytes_per_ms) & ~1))
        pcm = bytes(self.buffer[lo:hi])
        del self.buffer[:hi]
        self.buffer_start_ms += hi / self.bytes_per_ms
        return pcm

    def _commit_range(self, item_id: str, start_ms: float, end_ms: float) -> list[Effect]:
        pcm = self._take(start_ms, end_ms)
        previous = self.conversation.last_id()
        item = rt.Item(
            id=item_id,
            object="realtime.item",
            status="completed",
            role="user",
            content=[rt.ContentPart(type="input_audio", transcript=None)],
        )
        entry = self.conversation.add(item)
        entry.transcript_pending = True
        self.waiting_transcripts.add(item_id)
        return [
            self._send(rt.InputAudioBufferCommittedEvent(item_id=item_id, previous_item_id=previous)),
            self._send(rt.ConversationItemAdded(item=item, previous_item_id=previous)),
            self._send(rt.ConversationItemDone(item=item, previous_item_id=previous)),
            Transcribe(item_id, pcm, self.settings.input_rate),
        ]

    # -- server VAD ----------------------------------------------------------------------------------
    def _on_vad(self, ev: VadResult, now: float) -> list[Effect]:
        td = self.settings.turn_detection
        if td is None or ev.stream_id != self.vad_stream:
            return []  # a result of a stream that was replaced or stopped
        out: list[Effect] = []
        origin = self.vad_origin_ms + ev.probs.start_ms
        window = ev.probs.window_ms
        # Window by window, so an overlap can be decided at the exact window it crosses a threshold.
        for i, p in enumerate(ev.probs.probs):
            for d in self.turns.feed(origin + i * window, window, [p]):
                if isinstance(d, SpeechStarted):
                    out += self._speech_started(td, d, now)
                else:
                    out += self._speech_stopped(td, d, now)
            if self.overlap is not None and self.turns.speaking:
                decision = OverlapPolicy(self.settings.duplex).during(self.overlap, self.turns.last_voice_ms)
                if decision is Decision.BARGE_IN:
                    out += self._overlap_decided(decision, "speech long enough to interrupt", now)
                    out += self._interrupt(now)
        if not self.turns.speaking:
            # Nobody is talking: keep only the prefix padding the next turn may need.
            keep_from = self.turns.position_ms - self._prefix_ms(td)
            if keep_from > self.buffer_start_ms:
                self._take(keep_from, keep_from)
        return out

    @staticmethod
    def _prefix_ms(td: rt.ServerVad | rt.SemanticVad) -> int:
        return td.prefix_padding_ms if isinstance(td, rt.ServerVad) else 300

    def _speech_started(self, td: rt.ServerVad | rt.SemanticVad, d: SpeechStarted, now: float) -> list[Effect]:
        self.speech_item_id = self._new_id("item")
        self.last_activity = now
        out: list[Effect] = [
            self._send(
                rt.InputAudioBufferSpeechStartedEvent(audio_start_ms=int(d.start_ms), item_id=self.speech_item_id)
            )
        ]
        if not td.interrupt_response:
            return out
        playback = self._audible(now)
        if self.duplex and playback is not None:
            # Over assistant speech: let the overlap policy decide instead of cutting in at once.
            assert playback.started_at is not None
            heard_for_ms = (now - playback.started_at) * 1000.0
            self.overlap = OverlapPolicy(self.settings.duplex).begin(d.start_ms, heard_for_ms)
        elif self.response is not None or playback is not None:
            out += self._interrupt(now)
        return out

    def _speech_stopped(self, td: rt.ServerVad | rt.SemanticVad, d: SpeechStopped, now: float) -> list[Effect]:
        item_id = self.speech_item_id or self._new_id("item")
        self.speech_item_id = None
        self.last_activity = now
        out: list[Effect] = [
            self._send(rt.InputAudioBufferSpeechStoppedEvent(audio_end_ms=int(d.end_ms), item_id=item_id))
        ]
        overlap, self.overlap = self.overlap, None
        decision = None
        if overlap is not None:
            decision = OverlapPolicy(self.settings.duplex).end(overlap, d.end_ms)
            if decision is not None:
                self.overlap = overlap  # _overlap_decided reads it
                reason = (
                    "speech began inside the echo guard"
                    if overlap.echo
                    else "short backchannel"
                    if decision is Decision.DROP
                    else "speech between backchannel and barge-in lengths"
                )
                out += self._overlap_decided(decision, reason, now, end_ms=d.end_ms, item_id=item_id)
                self.overlap = None
        start = d.start_ms - self._prefix_ms(td)
        if decision is Decision.DROP:
            self._take(start, d.commit_ms)  # the backchannel is not a user turn
            return out
        out += self._commit_range(item_id, start, d.commit_ms)
        if td.create_response:
            if self.response is None:
                out += self._create_response(rt.ResponseParams(), None, now)
            else:
                self.respond_after = True
        return out

    def _overlap_decided(
        self, decision: Decision, reason: str, now: float, end_ms: float | None = None, item_id: str | None = None
    ) -> list[Effect]:
        overlap = self.overlap
        assert overlap is not None
        playback = self._latest_playback()
        end = self.turns.last_voice_ms if end_ms is None else end_ms
        return [
            self._send(
                rt.OverlapDecisionEvent(
                    decision=decision.value,
                    item_id=item_id or self.speech_item_id or "",
                    response_id=playback.response_id if playback else "",
                    audio_start_ms=int(overlap.start_ms),
                    speech_ms=int(end - overlap.start_ms),
                    reason=reason,
                )
            )
        ]

    def _latest_playback(self) -> Playback | None:
        return next(reversed(self.playbacks.values()), None)

    def _audible(self, now: float) -> Playback | None:
        playback = self._latest_playback()
        return playback if playback is not None and playback.audible(now) else None

    def _interrupt(self, now: float) -> list[Effect]:
        """Barge-in: stop the live response and the audio still queued, and cut the assistant item
        back to what the client has heard."""
        out: list[Effect] = []
        playback = self._latest_playback()
        if self.response is not None:
            out += self._cancel("turn_detected")
        elif playback is not None and playback.audible(now):
            out += [PurgeAudio(playback.response_id), self._send(rt.OutputAudioBufferClearedEvent(response_id=playback.response_id))]
        if playback is not None:
            playback.finished = True
        if playback is not None and playback.item_id in self.conversation:
            played = playback.played_ms(now)
            entry = self.conversation.get(playback.item_id)
            if played < entry.audio_ms - 1e-6:
                self._truncate_entry(entry, played)
                playback.audio_ms = played
                out.append(
                    self._send(
                        rt.ConversationItemTruncatedEvent(
                            item_id=playback.item_id, content_index=0, audio_end_ms=round(played)
                        )
                    )
                )
        return out

    def _on_playback_started(self, ev: PlaybackStarted, now: float) -> list[Effect]:
        playback = self.playbacks.get(ev.response_id)
        if playback is not None and playback.started_at is None:
            playback.started_at = ev.at
        return []

    def _on_playback_ack(self, ev: rt.PlaybackAckEvent, now: float) -> list[Effect]:
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
        return [
            self._send(
                rt.PlaybackAcknowledgedEvent(
                    response_id=ev.response_id, played_ms=int(played), audio_ms=int(playback.audio_ms)
                )
            )
        ]

    def _on_session_close(self, ev: rt.SessionCloseEvent, now: float) -> list[Effect]:
        out = self.close()
        out.append(self._send(rt.SessionClosedEvent(session_id=self.id)))
        out.append(Close(1000, "session closed by client"))
        return out

    def _on_decode_error(self, ev: rt.ErrorEvent, now: float) -> list[Effect]:
        """A frame that did not decode: the codec already explained it; number it and send it."""
        return [self._send(ev)]

    def _on_tick(self, ev: Tick, now: float) -> list[Effect]:
        td = self.settings.turn_detection
        if not isinstance(td, rt.ServerVad) or not td.idle_timeout_ms:
            return []
        if self.turns.speaking or self.response is not None or self.waiting_transcripts:
            self.last_activity = now
            return []
        if (now - self.last_activity) * 1000 < td.idle_timeout_ms:
            return []
        self.last_activity = now
        item_id = self._new_id("item")
        end = self._buffer_end_ms()
        start = self.buffer_start_ms
        out: list[Effect] = [
            self._send(
                rt.InputAudioBufferTimeoutTriggered(audio_start_ms=int(start), audio_end_ms=int(end), item_id=item_id)
            )
        ]
        out += self._commit_range(item_id, start, end)
        out += self._create_response(rt.ResponseParams(), None, now)
        return out

    def _on_transcription(self, ev: TranscriptionDone, now: float) -> list[Effect]:
        self.waiting_transcripts.discard(ev.item_id)
        out: list[Effect] = []
        if ev.item_id in self.conversation:
            entry = self.conversation.get(ev.item_id)
            entry.transcript_pending = False
            part = next(c for c in entry.item.content if c.type == "input_audio")
            if ev.error is None:
                part.transcript = ev.text or ""
            if self.settings.transcription is not None:
                if ev.error is None:
                    out.append(
                        self._send(
                            rt.ConversationItemInputAudioTranscriptionDeltaEvent(
                                item_id=ev.item_id, content_index=0, delta=part.transcript or ""
                            )
                        )
                    )
                    out.append(
                        self._send(
                            rt.ConversationItemInputAudioTranscriptionCompletedEvent(
                                item_id=ev.item_id,
                                content_index=0,
                                transcript=part.transcript or "",
                                usage=rt.TranscriptionUsage(seconds=0.0),
                            )
                        )
                    )
                else:
                    out.append(
                        self._send(
                            rt.ConversationItemInputAudioTranscriptionFailedEvent(
                                item_id=ev.item_id,
                                content_index=0,
                                error=rt.TranscriptionError(code="transcription_failed", message=ev.error),
                            )
                        )
                    )
        out += self._maybe_start()
        return out

    # -- conversation items --------------------------------------------------------------------------
    def _on_item_create(self, ev: rt.ConversationItemCreateEvent, now: float) -> list[Effect]:
        item = ev.item
        if item.type != "message":
            raise SessionError(
                f"Item type '{item.type}' is not supported (no tools are configured); send a message",
                "invalid_value",
                "item.type",
            )
        if item.role is None:
            raise SessionError("A message item needs a role", "missing_required_parameter", "item.role")
        allowed = {
            "user": {"input_text", "input_audio"},
            "system": {"input_text"},
            "assistant": {"output_text", "output_audio", "text", "audio"},
        }[item.role]
        for i, part in enumerate(item.content):
            if part.type not in allowed:
                raise SessionError(
                    f"Content type '{part.type}' is not valid for a {item.role} message",
                    "invalid_value",
                    f"item.content[{i}].type",
                )
        item.id = item.id or self._new_id("item")
        item.object = "realtime.item"
        item.status = "completed"
        transcribe: list[Effect] = []
        for part in item.content:
            if part.type == "input_audio" and part.audio:
                try:
                    pcm = audio.decode_input(base64.b64decode(part.audio, validate=True), self.settings.input_format)
                except (ValueError, binascii.Error) as e:
                    raise SessionError(f"Invalid input_audio: {e}", "invalid_value", "item.content.audio") from None
                part.audio = None  # the audio is not echoed back, as OpenAI does not echo it
                transcribe.append(Transcribe(item.id, pcm, self.settings.input_rate))
        previous = ev.previous_item_id
        entry = self.conversation.add(item, previous)
        if transcribe:
            entry.transcript_pending = True
            self.waiting_transcripts.add(item.id)
        prev_id = self.conversation.previous_id(item.id)
        return [
            self._send(rt.ConversationItemAdded(item=item, previous_item_id=prev_id)),
            self._send(rt.ConversationItemDone(item=item, previous_item_id=prev_id)),
            *transcribe[:1],
        ]

    def _on_item_retrieve(self, ev: rt.ConversationItemRetrieveEvent, now: float) -> list[Effect]:
        return [self._send(rt.ConversationItemRetrieved(item=self.conversation.get(ev.item_id).item))]

    def _on_item_delete(self, ev: rt.ConversationItemDeleteEvent, now: float) -> list[Effect]:
        if self.response is not None and self.response.item_id == ev.item_id:
            raise SessionError("Cannot delete the item of the response in progress", "item_in_use", "item_id")
        self.conversation.delete(ev.item_id)
        self.waiting_transcripts.discard(ev.item_id)
        return [self._send(rt.ConversationItemDeletedEvent(item_id=ev.item_id))] + self._maybe_start()

    def _on_item_truncate(self, ev: rt.ConversationItemTruncateEvent, now: float) -> list[Effect]:
        entry = self.conversation.get(ev.item_id)
        assistant_part(entry, ev.content_index)  # validates the item and part
        if ev.audio_end_ms < 0 or ev.audio_end_ms > entry.audio_ms + 1e-6:
            raise SessionError(
                f"audio_end_ms {ev.audio_end_ms} is past the item's audio ({int(entry.audio_ms)} ms)",
                "invalid_value",
                "audio_end_ms",
            )
        out: list[Effect] = []
        r = self.response
        if r is not None and r.item_id == ev.item_id:
            # The client stopped playback of what is still being generated.
            self._sync_entry(entry, r)
            out += self._cancel("client_cancelled")
        playback = next((p for p in self.playbacks.values() if p.item_id == ev.item_id), None)
        if playback is not None:
            if playback.audible(now):
                out.append(PurgeAudio(playback.response_id))  # the client stopped listening
            playback.finished = True
            playback.audio_ms = min(playback.audio_ms, float(ev.audio_end_ms))
        self._truncate_entry(entry, float(ev.audio_end_ms))
        out.append(
            self._send(
                rt.ConversationItemTruncatedEvent(
                    item_id=ev.item_id, content_index=ev.content_index, audio_end_ms=ev.audio_end_ms
                )
            )
        )
        return out

    # -- responses -----------------------------------------------------------------------------------
    def _on_response_create(self, ev: rt.ResponseCreateEvent, now: float) -> list[Effect]:
        if self.response is not None:
            raise SessionError(
                f"Conversation already has an active response in progress: {self.response.id}. "
                "Wait until the response is finished before creating a new one.",
                "conversation_already_has_active_response",
            )
        return self._create_response(ev.response or rt.ResponseParams(), ev.event_id, now)

    def _create_response(self, p: rt.ResponseParams, event_id: str | None, now: float) -> list[Effect]:
        s = self.settings
        modalities = p.output_modalities or s.output_modalities
        voice, speed = s.voice, s.speed
        if p.audio is not None and p.audio.output is not UNSET:
            if p.audio.output.voice is not UNSET:
                voice = self._check_voice(p.audio.output.voice, "response.audio.output.voice")
            if p.audio.output.speed is not UNSET:
                speed = p.audio.output.speed
                if not audio.speed_in_range(speed):
                    raise SessionError(audio.SPEED_ERROR, "invalid_value", "response.audio.output.speed")
        if p.conversation not in (None, "auto", "none"):
            raise SessionError(
                f"conversation must be 'auto' or 'none', got '{p.conversation}'", "invalid_value", "response.conversation"
            )
        in_conversation = p.conversation != "none"
        messages = self._messages(p.instructions if p.instructions is not None else s.instructions)
        if p.input is not None:
            # Out-of-band input replaces the conversation as the responder's context.
            try:
                items = msgspec.convert(p.input, list[rt.Item])
            except msgspec.ValidationError as e:
                raise SessionError(f"Invalid response.input: {e}", "invalid_value", "response.input") from None
            messages = messages[:1] if messages and messages[0].role == "system" else []
            messages += [ChatMessage(i.role or "user", item_text(i)) for i in items if i.type == "message"]
        max_tokens = p.max_output_tokens if p.max_output_tokens not in (None, "inf") else s.max_output_tokens
        if isinstance(max_tokens, int) and max_tokens < 1:
            raise SessionError("max_output_tokens must be at least 1", "invalid_value", "response.max_output_tokens")
        if in_conversation and len(self.conversation) >= self.conversation.max_items:
            # Checked before any state changes: a refused response must leave nothing behind.
            raise SessionError(
                f"Conversation is full ({self.conversation.max_items} items); delete items first",
                "conversation_full",
            )
        self.epoch += 1
        r = LiveResponse(
            id=self._new_id("resp"),
            epoch=self.epoch,
            item_id=self._new_id("item"),
            audio="audio" in modalities,
            in_conversation=in_conversation,
            metadata=p.metadata,
            conversation_id=f"conv_{self.id}",
        )
        r.params = StartResponse(
            r.id,
            r.epoch,
            messages,
            audio=r.audio,
            voice=voice,
            speed=speed,
            max_output_tokens=max_tokens if isinstance(max_tokens, int) else None,
        )
        if r.audio:
            r.encoder = audio.OutputEncoder(s.output_format)
            self.playbacks[r.id] = Playback(r.id, r.item_id)
            while len(self.playbacks) > MAX_TRACKED_PLAYBACKS:
                del self.playbacks[next(iter(self.playbacks))]
        self.response = r
        out: list[Effect] = [self._rsend(r, rt.ResponseCreatedEvent(response=r.wire("in_progress")))]
        item = r.item("in_progress")
        out.append(self._rsend(r, rt.ResponseOutputItemAddedEvent(response_id=r.id, output_index=0, item=item)))
        if in_conversation:
            previous = self.conversation.last_id()
            self.conversation.add(msgspec.structs.replace(item, content=[]))
            out.append(self._rsend(r, rt.ConversationItemAdded(item=item, previous_item_id=previous)))
        out.append(self._rsend(r, rt.ResponseContentPartAddedEvent(**r.ref(), part=r.part())))
        out += self._maybe_start()
        return out

    def _messages(self, instructions: str) -> list[ChatMessage]:
        msgs = [ChatMessage("system", instructions)] if instructions else []
        for entry in self.conversation.entries():
            text = item_text(entry.item)
            if text and entry.item.role is not None and entry.item.type == "message":
                msgs.append(ChatMessage(entry.item.role, text))
        return msgs

    def _maybe_start(self) -> list[Effect]:
        """Start the live response once every user transcript it depends on has arrived."""
        r = self.response
        if r is None or r.started or self.waiting_transcripts or r.params is None:
            return []
        r.started = True
        if r.in_conversation:
            # Rebuild the context now that transcripts are filled in.
            r.params.messages = self._messages(
                r.params.messages[0].content if r.params.messages and r.params.messages[0].role == "system" else ""
            )
        return [r.params]

    def _live(self, response_id: str, epoch: int) -> LiveResponse | None:
        r = self.response
        if r is None or r.id != response_id or r.epoch != epoch:
            return None  # stale: a result of a cancelled or finished response
        return r

    def _on_text_delta(self, ev: ResponseTextDelta, now: float) -> list[Effect]:
        r = self._live(ev.response_id, ev.epoch)
        if r is None or r.audio or not ev.text:
            return []  # with audio, the transcript travels with the frames
        r.text += ev.text
        return [self._rsend(r, rt.ResponseTextDeltaEvent(**r.ref(), delta=ev.text))]

    def _on_audio(self, ev: ResponseAudio, now: float) -> list[Effect]:
        r = self._live(ev.response_id, ev.epoch)
        if r is None or not r.audio:
            return []
        out: list[Effect] = []
        frame: TtsFrame = ev.frame
        if frame.text.strip():
            delta = (" " if r.text else "") + frame.text.strip()
            r.text += delta
            r.spans.append(SpokenSpan(r.audio_ms, frame.text.strip()))
            out.append(self._rsend(r, rt.ResponseAudioTranscriptDeltaEvent(**r.ref(), delta=delta)))
        if frame.pcm:
            ms = len(frame.pcm) / 2 / OUTPUT_RATE * 1000
            assert r.encoder is not None
            wire = r.encoder.encode(frame.pcm)
            out.append(
                self._rsend(r,
                    rt.ResponseAudioDeltaEvent(
                        **r.ref(), delta=wire, seq=r.frames, sample_rate_hz=OUTPUT_RATES[self.settings.output_format]
                    ),
                    audio_ms=ms,
                )
            )
            r.frames += 1
            r.audio_ms += ms
            playback = self.playbacks.get(r.id)
            if playback is not None:
                playback.audio_ms = r.audio_ms
        return out

    def _on_finished(self, ev: ResponseFinished, now: float) -> list[Effect]:
        r = self._live(ev.response_id, ev.epoch)
        if r is None:
            return []
        if ev.error is not None:
            # The session goes on: an error event says what happened, then the one response.done.
            failed = self.error(f"Response {r.id} failed: {ev.error}", "response_failed")
            failed.event.error.type = "server_error"  # type: ignore[attr-defined]
            return [
                failed,
                *self._finish(
                    r,
                    "failed",
                    rt.ResponseStatusDetails(type="failed", error={"type": "server_error", "message": ev.error}),
                ),
            ]
        if r.audio and r.frames:
            return [AwaitDelivery(r.id, r.epoch)]  # finished generating; live until its audio is out
        return self._complete(r, now)

    def _on_audio_delivered(self, ev: AudioDelivered, now: float) -> list[Effect]:
        r = self._live(ev.response_id, ev.epoch)
        return [] if r is None else self._complete(r, now)

    def _complete(self, r: LiveResponse, now: float) -> list[Effect]:
        out = self._finish(r, "completed", None)
        if self.respond_after:
            self.respond_after = False
            out += self._create_response(rt.ResponseParams(), None, now)
        return out

    def _on_response_cancel(self, ev: rt.ResponseCancelEvent, now: float) -> list[Effect]:
        r = self.response
        if r is None or (ev.response_id is not None and ev.response_id != r.id):
            raise SessionError(
                "Cancellation failed: no active response found"
                + (f" with id '{ev.response_id}'" if ev.response_id else ""),
                "response_cancel_not_active",
                "response_id" if ev.response_id else None,
            )
        return self._cancel("client_cancelled")

    def _on_output_clear(self, ev: rt.OutputAudioBufferClearEvent, now: float) -> list[Effect]:
        r = self.response
        if r is None:
            return []
        return [*self._cancel("client_cancelled"), self._send(rt.OutputAudioBufferClearedEvent(response_id=r.id))]

    def _cancel(self, reason: str) -> list[Effect]:
        r = self.response
        assert r is not None
        out: list[Effect] = [CancelResponse(r.id, r.epoch), PurgeAudio(r.id)]
        out += self._finish(r, "cancelled", rt.ResponseStatusDetails(type="cancelled", reason=reason))
        self.epoch += 1  # anything still in flight for the old epoch is now stale
        return out

    def _truncate_entry(self, entry: Entry, audio_end_ms: float) -> None:
        """Keep only the audio before ``audio_end_ms`` and the words heard in it."""
        part = next(c for c in entry.item.content if c.type == "output_audio")
        part.transcript = heard_text(entry.spans, entry.audio_ms, audio_end_ms)
        entry.audio_ms = audio_end_ms
        entry.spans = [s for s in entry.spans if s.start_ms < audio_end_ms]

    def _sync_entry(self, entry: Entry, r: LiveResponse) -> None:
        entry.audio_ms = r.audio_ms
        entry.spans = list(r.spans)
        entry.item.content = r.item("completed").content

    def _finish(self, r: LiveResponse, status: str, details: rt.ResponseStatusDetails | None) -> list[Effect]:
        """Close out the response's item and part, then its single ``response.done``."""
        self.response = None
        playback = self.playbacks.get(r.id)
        if playback is not None:
            playback.finished = True
        item_status = "completed" if status == "completed" else "incomplete"
        item = r.item(item_status)
        ref = r.ref()
        out: list[Effect] = []
        if r.audio:
            out.append(self._rsend(r, rt.ResponseAudioDoneEvent(**ref)))
            out.append(self._rsend(r, rt.ResponseAudioTranscriptDoneEvent(**ref, transcript=r.text)))
        else:
            out.append(self._rsend(r, rt.ResponseTextDoneEvent(**ref, text=r.text)))
        out.append(self._rsend(r, rt.ResponseContentPartDoneEvent(**ref, part=r.part())))
        out.append(self._rsend(r, rt.ResponseOutputItemDoneEvent(response_id=r.id, output_index=0, item=item)))
        if r.in_conversation and r.item_id in self.conversation:
            entry = self.conversation.get(r.item_id)
            self._sync_entry(entry, r)
            entry.item.status = item_status  # type: ignore[assignment]
            out.append(
                self._rsend(r,
                    rt.ConversationItemDone(item=item, previous_item_id=self.conversation.previous_id(r.item_id))
                )
            )
        out.append(self._rsend(r, rt.ResponseDoneEvent(response=r.wire(status, details))))
        return out


_HANDLERS: dict[type, Any] = {
    rt.SessionUpdateEvent: RealtimeSession._on_session_update,
    rt.InputAudioBufferAppendEvent: RealtimeSession._on_append,
    rt.InputAudioBufferCommitEvent: RealtimeSession._on_commit,
    rt.InputAudioBufferClearEvent: RealtimeSession._on_clear,
    rt.OutputAudioBufferClearEvent: RealtimeSession._on_output_clear,
    rt.ConversationItemCreateEvent: RealtimeSession._on_item_create,
    rt.ConversationItemRetrieveEvent: RealtimeSession._on_item_retrieve,
    rt.ConversationItemTruncateEvent: RealtimeSession._on_item_truncate,
    rt.ConversationItemDeleteEvent: RealtimeSession._on_item_delete,
    rt.ResponseCreateEvent: RealtimeSession._on_response_create,
    rt.ResponseCancelEvent: RealtimeSession._on_response_cancel,
    VadResult: RealtimeSession._on_vad,
    TranscriptionDone: RealtimeSession._on_transcription,
    ResponseTextDelta: RealtimeSession._on_text_delta,
    ResponseAudio: RealtimeSession._on_audio,
    ResponseFinished: RealtimeSession._on_finished,
    Tick: RealtimeSession._on_tick,
    rt.ErrorEvent: RealtimeSession._on_decode_error,
    rt.PlaybackAckEvent: RealtimeSession._on_playback_ack,
    rt.SessionCloseEvent: RealtimeSession._on_session_close,
    PlaybackStarted: RealtimeSession._on_playback_started,
    AudioDelivered: RealtimeSession._on_audio_delivered,
}

