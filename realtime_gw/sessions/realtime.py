"""The pure state machine of one ``/v1/realtime`` session: ``handle(event, now) -> list[Effect]``.

A thin shell: it routes client events and worker results to its parts and carries out what they
decide, in order. The parts:

- ``InputBuffer`` (``input_buffer.py``): appended audio, commit and clear, size limits, decoding;
- ``Turns`` (``turns.py``): the VAD stream, turn starts and stops, barge-in, duplex overlap, the
  playback ledger and the idle timeout;
- ``Conversation`` (``conversation.py``): the items and their pending transcripts;
- ``Responses`` (``response_lifecycle.py``): the response lifecycle in named phases, exactly one
  ``response.done`` per response, no output of a stale epoch;
- ``SpeechToSpeech`` (``s2s.py``), in a session bound to a speech-to-speech model: the model's stream,
  whose continuous output opens and closes the responses (a mode, as transcription is).

It never awaits or calls a model; the transport runs its effects and feeds results (and its own
decisions: ``VadUnavailable``, ``AsrUnavailable``, ``ResponseRefused``) back in.
"""

from __future__ import annotations

from typing import Any

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.s2s import S2sFrame
from realtime_gw.sessions import mcp
from realtime_gw.sessions.conversation import (
    Conversation,
    ConversationError,
    assistant_audio,
    check_item,
    transcription_events,
)
from realtime_gw.sessions.duplex import Playbacks
from realtime_gw.sessions.events import (
    AskTurn,
    AsrUnavailable,
    AudioDelivered,
    Close,
    Effect,
    Ids,
    Limits,
    McpCallDone,
    McpToolsListed,
    PlaybackStarted,
    ResponseAudio,
    ResponseFinished,
    ResponseRefused,
    ResponseTextDelta,
    ResponseToolCall,
    ResponseUsage,
    S2sFailed,
    S2sOpened,
    S2sRefused,
    Send,
    StopVad,
    Tick,
    Transcribe,
    TranscriptionDelta,
    TranscriptionDone,
    TurnVerdict,
    VadResult,
    VadUnavailable,
)
from realtime_gw.sessions.input_buffer import InputBuffer, decode_audio_part
from realtime_gw.sessions.mcp import McpServers, check_allowed, check_approval
from realtime_gw.sessions.out_of_band import SideResponses
from realtime_gw.sessions.response_lifecycle import Phase, Responses
from realtime_gw.sessions.response_state import LiveResponse
from realtime_gw.sessions.s2s import S2sBinding, SpeechToSpeech, SpokenResponses
from realtime_gw.sessions.settings import (
    SessionError,
    SessionSettings,
    TextLimits,
    apply_session_update,
    check_type_change,
)
from realtime_gw.sessions.transcription import Transcriber
from realtime_gw.sessions.turn_detection import PauseHeard
from realtime_gw.sessions.turns import Backchannel, Decided, Interrupt, TurnEnded, Turns, UserTurn, prefix_ms

_RULE_BREAKS = (SessionError, ConversationError)


class RealtimeSession:
    def __init__(
        self, session_id: str, limits: Limits, now: float = 0.0, duplex: bool = False, transcription: bool = False, s2s: S2sBinding | None = None
    ) -> None:
        self.id = session_id
        self.duplex = duplex
        self.limits = limits
        self.settings = SessionSettings.of_type("transcription" if transcription else "realtime")
        self.ids = Ids(session_id)
        self.conversation = Conversation(limits.max_items, limits.max_retained_items)
        self.conversation.bounded = self.settings.truncation == "disabled"
        self.buffer = InputBuffer(limits.max_input_buffer_bytes, self.settings.input_format, self.settings.input_rate)
        self.turns = Turns(self.ids, duplex, now)
        self.transcriber = Transcriber(self.ids)
        # MCP servers of the session's tools and their listed tools (``mcp.py``), which responses call
        self.mcp = McpServers(self.ids, self.conversation)
        slot_of = (self.ids, self.conversation, self.turns.playbacks, limits.voices, f"conv_{session_id}", limits)
        self.responses = (Responses if s2s is None else SpokenResponses)(*slot_of, self.mcp)
        self.s2s = None if s2s is None else SpeechToSpeech(s2s, self.responses)  # type: ignore[arg-type]
        self.side = SideResponses(lambda: Responses(*slot_of, self.mcp))
        """Out-of-band responses running beside the live one (``out_of_band.py``)."""
        self.text_limits = TextLimits(limits.max_instructions_chars, limits.max_tools)
        self.started = False
        """``start`` ran. A config given before (a client secret's, a call's ``session`` part) is
        applied silently (``session.created`` shows it); the MCP servers it names are listed at start."""
        self.notices: list[rt.ServerEvent] = []
        """Sent right after ``session.created``: what a config given before refused (``given_config``)."""

    # -- what the transport and tests read ---------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.responses.phase is Phase.CLOSED

    @property
    def response(self) -> LiveResponse | None:
        return self.responses.live

    @property
    def vad_stream(self) -> int:
        return self.turns.vad_stream

    def _slots(self) -> list[Responses]:
        return [self.responses, *self.side.slots.values()]

    @property
    def playbacks(self) -> Playbacks:
        return self.turns.playbacks

    # -- entry points --------------------------------------------------------------------------------
    def error(self, message: str, code: str, param: str | None = None, event_id: str | None = None) -> Send:
        return self.ids.error(message, code, param, event_id)

    def start(self, now: float) -> list[Effect]:
        """``session.created``, the listing of the MCP servers its config names, and the default VAD
        stream (with a speech-to-speech model, which takes no tools: once it is open)."""
        self.started = True
        if self.s2s is not None:
            return self.s2s.start(self.settings)
        return [*self._created(), *self.mcp.configure(self.settings.tools), *self._restart_vad()]

    def _created(self) -> list[Effect]:
        """``session.created`` and the notices about the config it was given."""
        return [self.ids.send(rt.SessionCreatedEvent(session=self._wire())), *map(self.ids.send, self.notices)]

    def handle(self, event: object, now: float) -> list[Effect]:
        if self.closed:
            return []
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise TypeError(f"no handler for {type(event).__name__}")
        try:
            if self.s2s is not None:
                self.s2s.check(event)  # what its model cannot take is refused before anything changes
            return handler(self, event, now)  # type: ignore[no-any-return]
        except _RULE_BREAKS as e:
            return [self.error(str(e), e.code, e.param, getattr(event, "event_id", None))]

    def close(self) -> list[Effect]:
        """The connection is gone: cancel the live response and stop the VAD stream."""
        if self.closed:
            return []
        return [*self.responses.close(), *self.side.close(), StopVad(self.turns.vad_stream), *self.transcriber.close()]

    def _wire(self) -> rt.SessionOut:
        return self.settings.to_wire(self.id, self.limits.model, self.duplex, self.s2s.capabilities() if self.s2s else None)

    def _restart_vad(self) -> list[Effect]:
        return self.turns.restart_vad(self.settings.turn_detection, self.settings.input_rate, self.buffer.end_ms)

    # -- session -------------------------------------------------------------------------------------
    def _on_session_update(self, ev: rt.SessionUpdateEvent, now: float) -> list[Effect]:
        voices = self.s2s.binding.voices() if self.s2s is not None else self.limits.voices
        new = apply_session_update(self.settings, ev.session, voices, self.text_limits)
        check_allowed(new.tools, self.limits.mcp_allowed_urls)  # before anything changes or connects
        self.mcp.check_choice(new.tool_choice, new.tools, "session.tool_choice")
        check_type_change(new, busy=self.responses.live is not None or bool(self.side.slots))
        if self.s2s is not None and self.started:
            self.s2s.check_prompt(new)
        old, self.settings = self.settings, new
        self.conversation.bounded = new.truncation == "disabled"
        if not self.conversation.bounded:
            self.conversation.forget_oldest(self.conversation.max_retained)
        reformatted = self.buffer.reformat(new.input_format, new.input_rate)
        self.turns.configure(new.turn_detection)
        toggled = (new.turn_detection is None) != (old.turn_detection is None)
        # Setting turn detection again while VAD is unavailable is the client's way to retry it.
        retry = new.turn_detection is not old.turn_detection and not self.turns.vad_stream
        out: list[Effect] = [self.ids.send(rt.SessionUpdatedEvent(session=self._wire()))]
        if self.s2s is not None and self.started:  # a new persona or voice: echoed once the stream has it
            out = self.s2s.reprompt(new, out)
        out += self.mcp.configure(new.tools) if self.started else []
        return out + self._restart_vad() if toggled or reformatted or retry else out

    def _on_session_close(self, ev: rt.SessionCloseEvent, now: float) -> list[Effect]:
        closed = rt.SessionClosedEvent(session_id=self.id)
        return [*self.close(), self.ids.send(closed), Close(1000, "session closed by client")]

    def _on_decode_error(self, ev: rt.ErrorEvent, now: float) -> list[Effect]:
        """A frame that did not decode: the codec already explained it; number it and send it."""
        return [self.ids.send(ev)]

    # -- input audio and turns -----------------------------------------------------------------------
    def _on_append(self, ev: rt.InputAudioBufferAppendEvent, now: float) -> list[Effect]:
        pcm = self.buffer.append(ev.audio)
        heard = self.s2s.hear(pcm, self.buffer.rate) if self.s2s is not None else []
        if not self.turns.vad_stream and self.transcriber.live is None:
            # The client commits turns: its transcription hears each from its first append.
            return heard + self.transcriber.start(self.ids.new("item"), self.buffer.rate, bytes(self.buffer.pcm))
        return heard + self.turns.listen(pcm) + self.transcriber.feed(pcm)

    def _on_commit(self, ev: rt.InputAudioBufferCommitEvent, now: float) -> list[Effect]:
        self.buffer.check_commit()
        item_id = self.turns.speech_item_id or self.transcriber.live_item_id or self.ids.new("item")
        out = self._commit(item_id, self.buffer.start_ms, self.buffer.end_ms)
        return out + self._carry_out_all(self.turns.committed(), now)

    def _on_clear(self, ev: rt.InputAudioBufferClearEvent, now: float) -> list[Effect]:
        self.buffer.clear()
        self.turns.reset()
        return [*self.transcriber.cancel(), self.ids.send(rt.InputAudioBufferClearedEvent())]

    def _commit(self, item_id: str, start_ms: float, end_ms: float, silence_ms: float = 0.0) -> list[Effect]:
        """Input audio becomes a user item; its transcript is on its way (``silence_ms``: the VAD heard
        the audio end in that much silence). Raises before any change."""
        self.conversation.check_add(item_id)
        pcm = self.buffer.take(start_ms, end_ms)
        previous = self.conversation.last_id()
        content = [rt.ContentPart(type="input_audio", transcript=None)]
        item = rt.Item(id=item_id, object="realtime.item", status="completed", role="user", content=content)
        entry = self.conversation.add(item, transcribing=True)
        entry.input_seconds = len(pcm) / 2 / self.buffer.rate
        return [
            self.ids.send(rt.InputAudioBufferCommittedEvent(item_id=item_id, previous_item_id=previous)),
            self.ids.send(rt.ConversationItemAdded(item=item, previous_item_id=previous)),
            self.ids.send(rt.ConversationItemDone(item=item, previous_item_id=previous)),
            *self.transcriber.end(item_id, pcm, self.buffer.rate, silence_ms / 1000),
        ]

    def _on_vad(self, ev: VadResult, now: float) -> list[Effect]:
        td = self.settings.turn_detection
        if td is None or not self.turns.is_current(ev.stream_id):
            return []  # a result of a stream that was replaced or stopped
        out: list[Effect] = []
        for start_ms, window_ms, prob in self.turns.windows(ev.probs):
            responding = self.responses.live is not None
            out += self._carry_out_all(self.turns.hear(self.settings, start_ms, window_ms, prob, now, responding), now)
        keep_from = self.turns.keep_from_ms(td)
        if keep_from is not None:
            self.buffer.drop_before(keep_from)
        return out

    def _carry_out_all(self, steps: list[Effect | Decided] | list[Decided], now: float) -> list[Effect]:
        return [e for step in steps for e in self._carry_out(step, now)]

    def _carry_out(self, step: Effect | Decided, now: float) -> list[Effect]:
        """Do what turn-taking decided. A rule it breaks (a full conversation) becomes an error
        event; what earlier steps did and said stands."""
        if isinstance(step, Interrupt):
            cancelled = self.responses.live is not None
            out = self.responses.cancel("turn_detected") if cancelled else []
            return out + self.turns.cut_playback(now, self.conversation, response_cancelled=cancelled)
        if isinstance(step, TurnEnded):  # a speech-to-speech model held silent may answer it
            return self.responses.release() if isinstance(self.responses, SpokenResponses) else []
        if isinstance(step, Backchannel):
            self.buffer.take(step.start_ms, step.end_ms)
            return self.transcriber.cancel()
        if isinstance(step, Send) and isinstance(step.event, rt.InputAudioBufferSpeechStartedEvent):
            # The turn's transcription hears it from now on, and its audio from before the start.
            assert self.settings.turn_detection is not None
            start = step.event.audio_start_ms - prefix_ms(self.settings.turn_detection)
            return [step, *self.transcriber.start(step.event.item_id, self.buffer.rate, self.buffer.peek(start))]
        if isinstance(step, PauseHeard):
            return [AskTurn(step.pause_id, self.buffer.peek(step.audio_from_ms, step.end_ms), self.buffer.rate)]
        if not isinstance(step, UserTurn):
            return [step]
        try:
            out = self._commit(step.item_id, step.start_ms, step.end_ms, step.silence_ms)
        except _RULE_BREAKS as e:
            return [self.error(str(e), e.code, e.param)]
        return out + self.responses.answer(self.settings) if step.respond and self.settings.answers else out

    def _on_tick(self, ev: Tick, now: float) -> list[Effect]:
        out = mcp.expire_approvals(self._slots(), now, self.settings) + self.side.settle()
        busy = self.responses.live is not None or self.conversation.transcripts_pending
        if not self.turns.idle_timeout_due(self.settings.turn_detection, now, busy):
            return out
        item_id = self.ids.new("item")
        start, end = self.buffer.start_ms, self.buffer.end_ms
        timeout = rt.InputAudioBufferTimeoutTriggered(audio_start_ms=int(start), audio_end_ms=int(end), item_id=item_id)
        return [*out, self.ids.send(timeout), *self._carry_out_all(self.turns.timed_out(item_id, start, end), now)]

    def _on_transcription(self, ev: TranscriptionDone, now: float) -> list[Effect]:
        part = self.conversation.fill_transcript(ev.item_id, ev.text, ev.error)
        out: list[Effect] = []
        if part is not None and self.settings.transcription is not None:
            seconds = self.conversation.get(ev.item_id).input_seconds
            out += [self.ids.send(e) for e in transcription_events(ev.item_id, part, ev.error, seconds)]
        return out + self.responses.start_if_ready() + self.side.start_if_ready()

    # -- conversation items --------------------------------------------------------------------------
    def _on_item_create(self, ev: rt.ConversationItemCreateEvent, now: float) -> list[Effect]:
        item = ev.item
        check_item(item, self.limits.max_item_text_chars)
        check_approval(item, self.conversation, mcp.asked_out_of_band(self._slots()))
        item.id = item.id or self.ids.new("item")
        item.object, item.status = "realtime.item", "completed"
        spoken = [part for part in item.content if part.type == "input_audio" and part.audio]
        pcm = [decode_audio_part(part.audio, self.buffer.format) for part in spoken]  # type: ignore[arg-type]
        entry = self.conversation.add(item, ev.previous_item_id, transcribing=bool(pcm))
        entry.input_seconds = len(pcm[0]) / 2 / self.buffer.rate if pcm else 0.0
        for part in spoken:
            part.audio = None  # the audio is not echoed back, as OpenAI does not echo it
        previous = self.conversation.previous_id(item.id)
        out: list[Effect] = [
            self.ids.send(rt.ConversationItemAdded(item=item, previous_item_id=previous)),
            self.ids.send(rt.ConversationItemDone(item=item, previous_item_id=previous)),
        ]
        if item.type == "mcp_approval_response":  # the live response that asked waits for it
            out += mcp.route_approval(self._slots(), item, self.settings) + self.side.settle()
        return out + [Transcribe(item.id, pcm[0], self.buffer.rate)] if pcm else out

    def _on_item_retrieve(self, ev: rt.ConversationItemRetrieveEvent, now: float) -> list[Effect]:
        entry = self.conversation.get(ev.item_id, "item_retrieve_invalid_item_id")
        return [self.ids.send(rt.ConversationItemRetrieved(item=entry.item))]

    def _on_item_delete(self, ev: rt.ConversationItemDeleteEvent, now: float) -> list[Effect]:
        live = self.responses.live
        if live is not None and live.item_id == ev.item_id:
            raise SessionError("Cannot delete the item of the response in progress", "item_in_use", "item_id")
        self.conversation.get(ev.item_id, "item_delete_invalid_item_id")
        self.conversation.delete(ev.item_id)
        return [self.ids.send(rt.ConversationItemDeletedEvent(item_id=ev.item_id)), *self.responses.start_if_ready()]

    # -- responses -----------------------------------------------------------------------------------
    def _on_response_create(self, ev: rt.ResponseCreateEvent, now: float) -> list[Effect]:
        if not self.settings.answers:
            raise SessionError("A transcription session makes no responses", "invalid_value", "type")
        p = ev.response or rt.ResponseParams()
        live = self.responses.live
        if p.conversation == "none" and live is not None:
            return self.side.create(p, self.settings)
        if live is not None and not live.in_conversation:
            self.side.adopt(self.responses)
        return self.responses.create(p, self.settings, ev.event_id)

    def _slot(self, response_id: str) -> Responses:
        """Where a worker result goes: the out-of-band response it is of, else the main slot (which
        drops it as stale when it is no response of its own)."""
        return self.side.get(response_id) or self.responses

    def _on_response_cancel(self, ev: rt.ResponseCancelEvent, now: float) -> list[Effect]:
        side = self.side.get(ev.response_id) if ev.response_id else None
        if side is not None and side.live is not None:
            return side.cancel("client_cancelled") + self.side.settle()
        live = self.responses.live
        if live is not None and ev.response_id in (None, live.id):
            return self.responses.cancel("client_cancelled")
        # A cancel of a response that already ended (it completed, or barge-in cancelled it, as the
        # client's cancel was on its way) is a race every interrupting client runs: nothing to do.
        ended = self.ids.issued("resp", ev.response_id) if ev.response_id else self.responses.epoch > 0
        if not ended:
            raise SessionError(
                "Cancellation failed: no active response found"
                + (f" with id '{ev.response_id}'" if ev.response_id else ""),
                "response_cancel_not_active",
                "response_id" if ev.response_id else None,
            )
        return []


# -- assistant audio the client stops hearing -----------------------------------------------------------
def _truncate_item(s: RealtimeSession, ev: rt.ConversationItemTruncateEvent, now: float) -> list[Effect]:
    """The client stopped playing an assistant item at ``audio_end_ms``. Never refused for where
    it cut: the cut is clamped to the audio the server generated for the item, whatever
    ``content_index`` says (frameworks send 0), and the last cut wins, also after the server's
    own barge-in estimate. The live response's item is cancelled first (truncate before, or
    instead of, ``response.cancel``)."""
    entry = s.conversation.get(ev.item_id, "item_truncate_invalid_item_id")
    if entry.item.role != "assistant":
        assistant_audio(entry)  # raises: only assistant items can be truncated
    if ev.audio_end_ms < 0:
        raise SessionError("audio_end_ms must not be negative", "invalid_value", "audio_end_ms")
    out: list[Effect] = []
    live = s.responses.live
    if live is not None and live.item_id == ev.item_id:
        live.sync(entry)  # its item, brought up to what it has produced so far
        out += s.responses.cancel("client_cancelled")
    end_ms = min(float(ev.audio_end_ms), max(entry.generated_ms, entry.audio_ms))
    out += s.turns.stop_item_playback(ev.item_id, end_ms, now)
    entry.truncate(end_ms)
    truncated = rt.ConversationItemTruncatedEvent(
        item_id=ev.item_id, content_index=ev.content_index, audio_end_ms=round(end_ms)
    )
    return [*out, s.ids.send(truncated)]


def _clear_output(s: RealtimeSession, ev: rt.OutputAudioBufferClearEvent, now: float) -> list[Effect]:
    """Stop the reply's audio: cancel the live response, and cut the newest assistant item back
    to what the client has heard (its playback may outlast ``response.done``)."""
    live = s.responses.live
    out = s.responses.cancel("client_cancelled") if live is not None else []
    if live is not None:
        out.append(s.ids.send(rt.OutputAudioBufferClearedEvent(response_id=live.id)))
    return out + s.turns.cut_playback(now, s.conversation, response_cancelled=live is not None)


# -- a session bound to a speech-to-speech model (``s2s.py``) ---------------------------------------------
def _s2s_opened(s: RealtimeSession, ev: S2sOpened, now: float) -> list[Effect]:
    assert s.s2s is not None
    reopened = s.s2s.opened(s.settings)  # a re-open: the session.updated of the update that asked for it
    if reopened is not None:
        return reopened
    return [*s._created(), *s._restart_vad()]


def _s2s_refused(s: RealtimeSession, ev: S2sRefused, now: float) -> list[Effect]:
    model = s.s2s.spec.model if s.s2s is not None else s.limits.model
    if ev.prompt and s.s2s is not None:  # the voice prompt and persona do not fit its budget
        bad = s.error(f"Model '{model}' cannot take this persona and voice: {ev.reason}", "invalid_value", "session.instructions")
        if s.s2s.prompt_refused(s.settings):  # a re-open: the old stream and its prompt go on
            return [bad, s.ids.send(rt.SessionUpdatedEvent(session=s._wire()))]
        return [bad, *s.close(), Close(1008, "speech-to-speech prompt refused")]
    busy = s.error(f"Model '{model}' has no free slot for a new session; retry later ({ev.reason})", "server_busy")
    return [busy, *s.close(), Close(1013, "speech-to-speech stage full")]


def _s2s_failed(s: RealtimeSession, ev: S2sFailed, now: float) -> list[Effect]:
    failed = s.error(f"The speech-to-speech model failed: {ev.reason}", "server_error")
    return [failed, *s.close(), Close(1011, "speech-to-speech model failed")]


def _routed(handle: Any) -> Any:
    """A worker result, handled by the slot of the response it is of."""

    def run(s: RealtimeSession, ev: Any, now: float) -> list[Effect]:
        return handle(s, s._slot(ev.response_id), ev, now) + s.side.settle()  # type: ignore[no-any-return]

    return run


_deliver = _routed(lambda s, slot, ev, now: slot.on_delivered(ev, s.settings))


def _delivered(s: RealtimeSession, ev: AudioDelivered, now: float) -> list[Effect]:
    out = _deliver(s, ev, now)
    return out + s.s2s.resume(s.settings, now) if s.s2s is not None else out


_HANDLERS: dict[type, Any] = {
    rt.SessionUpdateEvent: RealtimeSession._on_session_update,
    rt.SessionCloseEvent: RealtimeSession._on_session_close,
    rt.ErrorEvent: RealtimeSession._on_decode_error,
    rt.InputAudioBufferAppendEvent: RealtimeSession._on_append,
    rt.InputAudioBufferCommitEvent: RealtimeSession._on_commit,
    rt.InputAudioBufferClearEvent: RealtimeSession._on_clear,
    rt.OutputAudioBufferClearEvent: _clear_output,
    rt.ConversationItemCreateEvent: RealtimeSession._on_item_create,
    rt.ConversationItemRetrieveEvent: RealtimeSession._on_item_retrieve,
    rt.ConversationItemTruncateEvent: _truncate_item,
    rt.ConversationItemDeleteEvent: RealtimeSession._on_item_delete,
    rt.ResponseCreateEvent: RealtimeSession._on_response_create,
    rt.ResponseCancelEvent: RealtimeSession._on_response_cancel,
    rt.PlaybackAckEvent: lambda s, ev, now: s.turns.ack(ev, now),
    VadResult: RealtimeSession._on_vad,
    VadUnavailable: lambda s, ev, now: s.turns.vad_unavailable(ev),
    Tick: RealtimeSession._on_tick,
    TranscriptionDone: lambda s, ev, now: s.transcriber.finished(ev, s._on_transcription(ev, now)),
    TranscriptionDelta: lambda s, ev, now: s.transcriber.partial(ev, s.settings.transcription is not None),
    AsrUnavailable: lambda s, ev, now: s.transcriber.unavailable(ev),
    TurnVerdict: lambda s, ev, now: s._carry_out_all(s.turns.verdict(s.settings, ev, now), now),
    PlaybackStarted: lambda s, ev, now: s.turns.playback_started(ev),
    McpToolsListed: lambda s, ev, now: s.mcp.listed(ev) + s.responses.start_if_ready() + s.side.start_if_ready(),
    S2sOpened: _s2s_opened,
    S2sRefused: _s2s_refused,
    S2sFailed: _s2s_failed,
    S2sFrame: lambda s, ev, now: [] if s.s2s is None else s.s2s.on_frame(ev, s.settings, now),
    # worker results go to the slot of the response they are of (the main one, or out-of-band)
    ResponseTextDelta: _routed(lambda s, slot, ev, now: slot.on_text(ev)),
    ResponseAudio: _routed(lambda s, slot, ev, now: slot.on_audio(ev, now)),
    ResponseToolCall: _routed(lambda s, slot, ev, now: slot.on_tool_call(ev)),
    ResponseUsage: _routed(lambda s, slot, ev, now: slot.on_usage(ev)),
    ResponseFinished: _routed(lambda s, slot, ev, now: slot.on_finished(ev, s.settings, now)),
    ResponseRefused: _routed(lambda s, slot, ev, now: slot.on_refused(ev)),
    AudioDelivered: _delivered,
    McpCallDone: _routed(lambda s, slot, ev, now: slot.on_mcp(ev, s.settings)),
}
