"""The GPT-Live face of the realtime session machine: ``handle(event, now) -> list[Effect]``.

Not a second session: a ``RealtimeSession`` does the work (input buffer, server VAD and Smart Turn,
barge-in, transcription, responses, tools) and this face only translates. GPT-Live client events
become the realtime session's inputs (``session.start`` a ``session.update`` with server VAD that
answers and interrupts on its own; ``session.input_audio.append`` appended audio; context appends
conversation items; a delegation result a ``function_call_output``). The realtime session's outgoing
events become GPT-Live events, or are dropped where the protocol has none. Audio deltas and their
transcript stay realtime events in the outbox (paced, purged on barge-in) and become
``session.output_audio.delta`` / ``session.output_transcript.delta`` as they are written
(``live_wire.py``), where the continuous output stream and its clock live.

Delegation (``live_delegation.py``): the voice front is offered one function, ``delegate``; its call
id is the delegation id. The app answers it (client delegation), or the backend model runs it as
out-of-band responses of the same realtime session (Responses delegation, ``live_backend.py``).
Time on the session clock is milliseconds since ``session.start``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from realtime_gw.protocols import live
from realtime_gw.protocols import realtime as rt
from realtime_gw.sessions.events import Close, Effect, Limits, S2sOpened, Send, ServerStopping
from realtime_gw.sessions.live_backend import Backend, LiveError, checked_config
from realtime_gw.sessions.live_delegation import (
    ACKS,
    DELEGATE_SPEC,
    DELEGATE_TOOL,
    FRAMES,
    Delegating,
    response_of,
    result_items,
    system_item,
)
from realtime_gw.sessions.live_fixture import Fixture, FixtureError
from realtime_gw.sessions.live_info import ExpiryWarning, start_notices
from realtime_gw.sessions.live_s2s import DuplexModels, SpokenFace, spoken_notices, spoken_update
from realtime_gw.sessions.live_transcripts import InputTranscripts
from realtime_gw.sessions.realtime import RealtimeSession
from realtime_gw.sessions.s2s import S2sBinding

MAX_STARTUP_MESSAGES = 128
MAX_APPEND_TOKENS = 500
DRAIN_S = 10.0
"""``session.close`` lets the voice finish for at most this long."""
_SILENT_BYTE = {"audio/pcm": b"\0", "audio/pcmu": b"\xff", "audio/pcma": b"\xd5"}
_ROLES = {"developer": "system", "user": "user", "assistant": "assistant"}


MAX_QUEUED_ITEMS = 32
"""Commentary items waiting for the voice to finish its current reply (each append adds one or two)."""


def approx_tokens(text: str) -> int:
    """About four characters a token (the gateway's stand-in tokenizer)."""
    return -(-len(text) // 4)


def session_resource(
    session_id: str, config: live.SessionConfig, expires_at: int, duplex: S2sBinding | None
) -> live.SessionResource:
    """The started session as ``session.started`` describes it: the start's config, with what the
    gateway chose where it named nothing (PCM at 24 kHz, the voice, client delegation)."""
    audio = config.audio or live.Audio()
    return live.SessionResource(
        id=session_id,
        expires_at=expires_at,
        model=config.model,
        status="active",
        audio=live.Audio(
            format=audio.format or live.AudioPCM(rate=24000),
            output=live.AudioOutput(voice=(audio.output.voice if audio.output else None) or _default_voice(duplex)),
        ),
        delegation=config.delegation or live.ClientDelegation(),
        input=config.input,
        instructions=config.instructions,
        safety_identifier=config.safety_identifier,
        store=config.store,
    )


class LiveSession(Delegating, SpokenFace):
    def __init__(
        self, session_id: str, limits: Limits, now: float, max_session_s: float, unix_offset_s: float = 0.0,
        duplex_models: DuplexModels | None = None,
    ) -> None:  # fmt: skip
        self.id = session_id
        self.inner = RealtimeSession(session_id, limits, now)
        self.models = duplex_models or DuplexModels()
        """The speech-to-speech models a start may name (``live_s2s.py``); ``duplex``: the one it named."""
        self.duplex = None
        self.announce = []
        self.held: list[live.ClientEvent] = []
        """What the client sent while the model's stream opened: answered after ``session.started``."""
        self.ids = self.inner.ids
        self.max_session_s = max_session_s
        self.unix_offset_s = unix_offset_s
        """Unix time minus the session's (monotonic) clock, for ``expires_at``."""
        self.resource: live.SessionResource | None = None
        self.started_at = now
        self.muted = False
        self.fixture = Fixture(self.ids)
        self.delegations: dict[str, bool] = {}
        """Delegation (call) ids this session created -> whether the voice has their result yet."""
        self.backend: Backend | None = None
        """Under Responses delegation: the backend model's runs (``live_backend.py``)."""
        self.transcripts = InputTranscripts()
        self.expiry: ExpiryWarning | None = None
        self.ack_due: float | None = None
        """When the automatic acknowledgement of a delegation is due (none pending: None)."""
        self.spoke: set[str] = set()
        """Responses of the voice that said something (a delegation they made needs no acknowledgement)."""
        self.queued: list[rt.Item] = []
        """Commentary items waiting for the voice to finish what it is saying."""
        self.closing_since: float | None = None
        self.close_event_id: str | None = None
        self.ended = False

    # -- what the transport reads --------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.ended

    @property
    def started(self) -> bool:
        return self.resource is not None

    def clock_ms(self, now: float) -> int:
        return max(0, round((now - self.started_at) * 1000))

    def error(self, message: str, code: str, param: str | None = None, event_id: str | None = None) -> Send:
        return self.ids.send(live.error_event(message, code, param, event_id))

    def start(self, now: float) -> list[Effect]:
        return []  # the client starts the session with session.start

    def handle(self, event: object, now: float) -> list[Effect]:
        if self.ended:
            return []
        if isinstance(event, live.ErrorEvent):  # a frame that did not decode
            return [self.ids.send(event)]
        if isinstance(event, ServerStopping):  # a client told why reconnects; a bare close looks like a fault
            return self.end("connection_lost", now)
        if isinstance(event, live.Unsupported):
            why = f"'{event.type}' is not supported by this gateway (see its protocol notes)"
            return [self.error(why, "unsupported_event", "type", event.event_id)]
        if isinstance(event, live.ClientEvent) and self.announce:
            self.held.append(event)
            return []
        if isinstance(event, live.ClientEvent):
            try:
                out = self._client(event, now)
            except LiveError as e:
                return [self.error(str(e), e.code, e.param, event.event_id)]
        elif self.fixture.owns(event):
            out = self.fixture.notice(event)  # type: ignore[arg-type]
        elif isinstance(event, S2sOpened) and self.announce:
            out = self._spoken_opened(event, now)
        else:  # worker results, time, the outbox's notices: the realtime session's business
            out = self._outgoing(self.inner.handle(event, now), now) if self.started else []
        notices = [self.ids.send(n) for n in self.expiry.due(now)] if self.expiry is not None else []
        return out + self._speak_queued(now) + self._acknowledge(now) + notices + self._drain(now)

    def close(self) -> list[Effect]:
        """The connection is gone: what the realtime session stops (its sends are moot)."""
        if self.backend is not None:
            self.backend.close()
        return [e for e in self.inner.close() if not isinstance(e, Send)]

    def end(self, reason: live.CloseReason, now: float, client_event_id: str | None = None) -> list[Effect]:
        """``session.closed`` and the socket's close (expiry, idle, a drained ``session.close``)."""
        if self.ended:
            return []
        self.ended = True
        out = self.close()
        if self.resource is not None:
            usage = live.SessionUsage(seconds=float(self.clock_ms(now) // 1000))
            closed = live.SessionClosedEvent(
                reason=reason, session=self.resource, usage=usage, client_event_id=client_event_id
            )
            out.append(self.ids.send(closed))
        return [*out, Close(1000, f"session closed: {reason}")]

    # -- client events -------------------------------------------------------------------------------
    def _client(self, ev: live.ClientEvent, now: float) -> list[Effect]:
        kind = type(ev).__struct_config__.tag
        if isinstance(ev, live.SessionStartEvent):
            if self.started:
                raise LiveError("The session has already started", "session_already_started", "type")
            return self._start(ev, now)
        if not self.started:
            raise LiveError(f"'{kind}' before session.start: send session.start first", "session_not_started", "type")
        if self.closing_since is not None and not isinstance(ev, live.InputAudioAppendEvent):
            raise LiveError(f"'{kind}' after session.close: the session is closing", "session_closing", "type")
        if self.duplex is not None and (spoken := self._spoken_command(ev, now)) is not None:
            return spoken
        match ev:
            case live.InputAudioAppendEvent():
                return self._append_audio(ev, now)
            case live.InputAudioMuteEvent():
                self.muted = True
                return [self.ids.send(live.InputAudioMutedEvent(client_event_id=ev.event_id))]
            case live.InputAudioUnmuteEvent():
                self.muted = False
                return [self.ids.send(live.InputAudioUnmutedEvent(client_event_id=ev.event_id))]
            case live.InstructionsAppendEvent() | live.ThinkingAppendEvent() | live.CommentaryAppendEvent():
                if self.fixture.playing is not None:
                    raise LiveError(f"'{kind}' is refused while a fixture plays", "fixture_active", "type")
                return self._context(ev, now)
            case live.OutputAudioFixturePlayEvent():
                return self._play_fixture(ev, now)
            case live.SessionUpdateEvent():
                return self._update(ev)
            case live.SessionCloseEvent():
                self.closing_since = now
                self.close_event_id = ev.event_id
                return []
            case live.ResponseItemCreateEvent():
                self._backend(kind).add_item(ev.item)
                return []
            case live.ResponseCreateEvent():
                return [e for d, task in self._backend(kind).continuations() for e in self._run_backend(d, task, now)[1]]
        raise LiveError(f"'{kind}' is not handled", "unsupported_event", "type")

    def _start(self, ev: live.SessionStartEvent, now: float) -> list[Effect]:
        config = ev.session
        limits = self.inner.limits
        update = realtime_update(config, limits.voices)
        self.duplex = self.models.resolve(config.model)
        if self.duplex is not None:  # the model takes audio only: its stream opens first
            self.inner = RealtimeSession(self.id, limits, now, s2s=self.duplex)
            self.ids = self.fixture.ids = self.inner.ids
            update = spoken_update(update, self.duplex, config, limits.voices)
        elif isinstance(config.delegation, live.ResponsesDelegation):
            backend = checked_config(config.delegation.responses, None, limits.max_tools, limits.max_instructions_chars)
            config.delegation.responses = backend
            self.backend = Backend(backend, limits.model, self.unix_offset_s)
        self.started_at = now
        if self.duplex is not None:  # its prompt (persona, voice) is in the stream's opening
            effects = self.inner.handle(update, now) + self.inner.start(now)
        else:
            effects = self.inner.start(now) + self.inner.handle(update, now)
        problems = [e for e in effects if isinstance(e, Send) and isinstance(e.event, rt.ErrorEvent)]
        if problems:  # nothing of this start was run: a fresh machine for the next one
            self.inner, self.backend, self.duplex = RealtimeSession(self.id, limits, now), None, None
            self.ids = self.fixture.ids = self.inner.ids
            error = problems[0].event
            assert isinstance(error, rt.ErrorEvent)
            raise LiveError(error.error.message, error.error.code or "invalid_value", _live_param(error.error.param))
        for message in (config.input or []) if self.duplex is None else []:  # the model takes no text
            effects += self.inner.handle(rt.ConversationItemCreateEvent(item=_history_item(message)), now)
        self.resource = session_resource(self.id, config, int(self.unix_offset_s + now + self.max_session_s), self.duplex)
        self.expiry = ExpiryWarning(now, self.max_session_s, self.resource.expires_at)
        started = live.SessionStartedEvent(session=self.resource, client_event_id=ev.event_id)
        if self.duplex is not None:  # started once the model's stream is open
            self.announce = [started, *spoken_notices(self.duplex, config, limits.voices)]
            return self._outgoing(effects, now)
        return [self.ids.send(n) for n in (started, *start_notices(config, limits.model))] + self._outgoing(effects, now)

    def _append_audio(self, ev: live.InputAudioAppendEvent, now: float) -> list[Effect]:
        if self.closing_since is not None:
            return []
        audio = ev.audio
        if self.muted or self.fixture.playing:  # silence in: the turn clock and VAD go on, nothing is heard
            audio = _SILENT_BYTE[self.inner.buffer.format] * len(audio)
        effects = self.inner.handle(rt.InputAudioBufferAppendEvent(audio=audio, event_id=ev.event_id), now)
        return self._outgoing(effects, now)

    def _play_fixture(self, ev: live.OutputAudioFixturePlayEvent, now: float) -> list[Effect]:
        try:
            self.fixture.check(ev.audio)
        except FixtureError as e:
            code = "fixture_active" if self.fixture.playing else "invalid_value"
            raise LiveError(str(e), code, None if self.fixture.playing else "audio") from None
        interrupted = self._outgoing(self.inner.handle(rt.OutputAudioBufferClearEvent(), now), now)
        return interrupted + self.fixture.play(ev, self.inner.settings.output_format)

    def _context(self, ev: live.InstructionsAppendEvent | live.ThinkingAppendEvent | live.CommentaryAppendEvent, now: float) -> list[Effect]:
        _checked_append(ev, self.inner.response is not None, len(self.queued))
        answers = ev.delegation_id is not None and not isinstance(ev, live.InstructionsAppendEvent)
        if ev.delegation_id is not None and ev.delegation_id not in self.delegations:
            raise LiveError(f"Unknown delegation '{ev.delegation_id}'", "invalid_value", "delegation_id")
        if answers and self.delegations[ev.delegation_id]:  # type: ignore[index]
            raise LiveError(f"Delegation '{ev.delegation_id}' was already answered", "invalid_value", "delegation_id")
        items = (
            result_items(ev.delegation_id, ev.content, isinstance(ev, live.CommentaryAppendEvent))  # type: ignore[arg-type]
            if answers
            else [system_item(FRAMES[type(ev)].format(ev.content))]
        )
        if answers:
            self.delegations[ev.delegation_id] = True  # type: ignore[index]
        if not isinstance(ev, live.InstructionsAppendEvent):
            self.ack_due = None  # the app spoke up: no automatic acknowledgement
        at = self.clock_ms(now)
        ack = self.ids.send(ACKS[type(ev)](start_ms=at, end_ms=at, client_event_id=ev.event_id))
        effects = self._say(items, isinstance(ev, live.CommentaryAppendEvent), now, ev.event_id)
        if any(isinstance(e, Send) and isinstance(e.event, live.ErrorEvent) for e in effects):
            return effects
        return [*effects, ack]

    def _say(self, items: list[rt.Item], speak: bool, now: float, event_id: str | None = None) -> list[Effect]:
        """``items`` into the conversation and, when ``speak``, the voice answers them: now, or once it
        has finished what it is saying (queued, in order)."""
        if speak and self.inner.response is not None:
            self.queued += items
            return []
        effects = self._add_items(items, event_id, now)
        if speak and not any(isinstance(e, Send) and isinstance(e.event, live.ErrorEvent) for e in effects):
            effects += self._outgoing(self.inner.responses.answer(self.inner.settings), now)
        return effects

    def _add_items(self, items: list[rt.Item], event_id: str | None, now: float) -> list[Effect]:
        effects: list[Effect] = []
        for item in items:
            effects += self.inner.handle(rt.ConversationItemCreateEvent(item=item, event_id=event_id), now)
        return self._outgoing(effects, now)

    def _speak_queued(self, now: float) -> list[Effect]:
        """Commentary that waited for the voice: into the conversation and said, now that it is free."""
        if not self.queued or self.inner.response is not None:
            return []
        items, self.queued = self.queued, []
        return self._add_items(items, None, now) + self._outgoing(self.inner.responses.answer(self.inner.settings), now)

    def _drain(self, now: float) -> list[Effect]:
        if self.closing_since is None or self.ended:
            return []
        if self.inner.response is not None and now - self.closing_since < DRAIN_S:
            return []
        return self.end("close_requested", now, self.close_event_id)

    # -- the realtime session's events, as GPT-Live events ------------------------------------------
    def _outgoing(self, effects: list[Effect], now: float) -> list[Effect]:
        out: list[Effect] = []
        for e in effects:
            if not isinstance(e, Send):
                out.append(e)
                continue
            if self.backend is not None and response_of(e.event) in self.backend.runs:
                out += self._backend_event(e.event, now)
                continue
            if isinstance(e.event, rt.ResponseFunctionCallArgumentsDoneEvent) and e.event.name == DELEGATE_TOOL:
                out += self._delegated(e.event, now)
                continue
            if isinstance(e.event, rt.ResponseDoneEvent):
                usage = live.SessionUsage(seconds=float(self.clock_ms(now) // 1000))
                out.append(self.ids.send(live.SessionUsageUpdatedEvent(usage=usage)))
            mapped = self._map(e.event)
            if mapped is e.event:
                out.append(e)
            elif mapped is not None:
                mapped.event_id = e.event.event_id
                out.append(Send(mapped, response_id=e.response_id, audio_ms=e.audio_ms))
        return out

    def _map(self, ev: rt.ServerEvent) -> Any:
        match ev:
            case rt.ResponseAudioTranscriptDeltaEvent():
                self.spoke.add(ev.response_id)
                return ev  # written as a GPT-Live event by the wire, on the output clock
            case rt.ResponseAudioDeltaEvent():
                return ev
            case rt.ResponseCreatedEvent():
                return ev  # the outbox keeps time by it; the wire drops it
            case rt.ResponseDoneEvent():
                self.spoke.discard(ev.response.id)
                return ev
            case rt.ErrorEvent():
                d = ev.error
                return live.error_event(d.message, d.code or "server_error", _live_param(d.param), d.event_id)
        return self.transcripts.translate(ev, self.inner.buffer.end_ms)


def _history_item(m: live.InitialItem) -> rt.Item:
    role = _ROLES[m.role]
    part = "output_text" if role == "assistant" else "input_text"
    return rt.Item(type="message", role=role, content=[rt.ContentPart(type=part, text=m.content[0].text)])  # type: ignore[arg-type]


def _live_param(param: str | None) -> str | None:
    """A realtime session's parameter path, as the GPT-Live field it came from."""
    if param is None:
        return None
    return param.replace("session.audio.input.", "session.audio.").replace("session.audio.output.", "session.audio.")


def _default_voice(duplex: S2sBinding | None) -> str:
    """The voice a start that names none speaks in: a voice-prompted model's default, else marin."""
    return (duplex.spec.default_voice if duplex is not None and duplex.takes_voice else None) or "marin"


def realtime_update(config: live.SessionConfig, voices: frozenset[str]) -> rt.SessionUpdateEvent:
    """``session.start`` as the realtime session's configuration (raises ``LiveError`` for what this
    gateway does not serve). The gateway's own turn-taking answers and yields: server VAD that creates
    a response at each turn's end and interrupts the voice when the user speaks over it."""
    if config.client is not None:
        raise LiveError("session.client is for WebRTC sessions, which this gateway does not serve", "unsupported_value", "session.client")
    if config.triggers:
        raise LiveError("Decisions triggers are not supported", "unsupported_value", "session.triggers")
    if isinstance(config.delegation, live.DecisionsDelegation):
        raise LiveError(
            "Delegation 'decisions' is not supported; use 'client' or 'responses'",
            "unsupported_value",
            "session.delegation.type",
        )
    history = config.input or []
    if len(history) > MAX_STARTUP_MESSAGES:
        raise LiveError(f"At most {MAX_STARTUP_MESSAGES} startup messages", "invalid_value", "session.input")
    for i, m in enumerate(history):
        if len(m.content) != 1:
            raise LiveError("A startup message has exactly one text part", "invalid_value", f"session.input[{i}].content")
    audio = config.audio or live.Audio()
    fmt = audio.format or live.AudioPCM(rate=24000)
    if not isinstance(fmt, live.AudioPCM) and fmt.rate != 8000:
        raise LiveError("G.711 audio is 8000 Hz", "invalid_value", "session.audio.format.rate")
    kind = fmt.__struct_config__.tag
    voice = audio.output.voice if audio.output else None
    name = voice.id if isinstance(voice, live.CustomVoice) else voice
    instructions = (config.instructions or "").strip() or "You are a helpful voice assistant. Keep answers short."
    session = {
        "type": "realtime",
        "instructions": instructions,
        "audio": {
            "input": {
                "format": {"type": kind, **({"rate": fmt.rate} if kind == "audio/pcm" else {})},
                "transcription": {"model": "gateway"},
                "turn_detection": {"type": "server_vad", "create_response": True, "interrupt_response": True},
            },
            "output": {
                "format": {"type": kind, **({"rate": 24000} if kind == "audio/pcm" else {})},
                "voice": name if name in voices else "default",
            },
        },
        "tools": [DELEGATE_SPEC],
        "tool_choice": "auto",
    }
    return msgspec.convert({"type": "session.update", "session": session}, rt.SessionUpdateEvent)


def _checked_append(
    ev: live.InstructionsAppendEvent | live.ThinkingAppendEvent | live.CommentaryAppendEvent, speaking: bool, queued: int
) -> bool:
    """Refuse an append that is empty, too long, or commentary beyond what may wait for the voice; whether
    it is commentary that waits for the voice's current reply."""
    if not ev.content.strip():
        raise LiveError("content must not be empty", "invalid_value", "content")
    if approx_tokens(ev.content) > MAX_APPEND_TOKENS:
        raise LiveError(f"content is over {MAX_APPEND_TOKENS} tokens", "invalid_value", "content")
    waits = isinstance(ev, live.CommentaryAppendEvent) and speaking
    if waits and queued >= MAX_QUEUED_ITEMS:
        raise LiveError("Too much commentary is waiting for the voice; let it finish first", "invalid_value", "content")
    return waits
