"""A GPT-Live session on a speech-to-speech model: ``session.start`` names the stage's model (e.g.
``moshi``). Pure; a part of ``LiveSession`` as delegation is.

The realtime session behind the face is bound to the stage (``s2s.py``), so its input steps, the
responses opened and closed by the model's text stream, barge-in holding the model silent until the
user's turn ends, and the user's transcripts from the ASR stage are that module's and the
cascade's code; the face translates their events as it does the cascade's (``session.output_audio.delta``
and ``session.output_transcript.delta`` placed on the output stream by ``live_wire.py``). What differs:

- **Start.** The realtime configuration keeps the input format, server VAD that interrupts and
  input transcription, and drops what the model cannot take (the ``delegate`` tool; instructions and a
  voice unless it takes a prompt). A model that takes a prompt (PersonaPlex) opens its stream with the
  start's ``instructions`` as its persona and its ``audio.output.voice`` as its voice prompt (a name of
  its voices; a stock OpenAI name, which clients send by default, is not applied and named in
  ``settings_ignored``; any other name is refused naming its voices), as a ``/v1/realtime`` session
  does (``s2s.py``).
  ``session.started`` waits for the model's stream to open (``S2sOpened``): a full stage refuses
  the start (``error`` ``server_busy``, close 1013) and the session never started.
- **What clients send by default** and the model cannot take (``instructions``, startup ``input``, a
  voice, a delegation and its backend's tools: pipecat's and LiveKit's GPT-Live clients send them with
  every start, LiveKit its tools again in a ``session.update``) is accepted, echoed and named once in an
  ``info`` ``settings_ignored`` with the model's capabilities. Context appends (pipecat's opening
  instruction is a commentary) are acknowledged as usual, with an ``info`` ``context_ignored``: the
  model hears audio only. The model never delegates, so ``response.item.create`` and ``response.create``
  (which only continue delegations) are refused naming its capabilities.
- **Close.** ``session.close`` lets the reply being said end as it would and opens no new one (the model
  speaks on its own: waiting for it to fall quiet could take the whole drain).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
from msgspec import UNSET

from realtime_gw.protocols import live
from realtime_gw.protocols import realtime as rt
from realtime_gw.sessions.events import Effect, Ids, S2sOpened
from realtime_gw.sessions.live_backend import LiveError
from realtime_gw.sessions.live_delegation import ACKS
from realtime_gw.sessions.realtime import RealtimeSession
from realtime_gw.sessions.s2s import S2sBinding

IGNORED_COMMANDS = (live.InstructionsAppendEvent, live.ThinkingAppendEvent, live.CommentaryAppendEvent)
REFUSED_COMMANDS = (live.ResponseItemCreateEvent, live.ResponseCreateEvent)


@dataclass(frozen=True, slots=True)
class DuplexModels:
    """The speech-to-speech models a GPT-Live session may name: the stage this gateway serves (bound
    by any of ``names``), and the families it does not (refused at start)."""

    binding: S2sBinding | None = None
    names: frozenset[str] = field(default_factory=frozenset)
    unserved: frozenset[str] = field(default_factory=frozenset)

    def resolve(self, model: str) -> S2sBinding | None:
        """The binding of a session of ``model`` (None: the cascade); ``LiveError`` for a
        speech-to-speech family this gateway was not started with."""
        if self.binding is not None and model in self.names:
            return self.binding
        if model in self.unserved:
            raise LiveError(
                f"Model '{model}' is a speech-to-speech model this gateway does not serve (start it with --s2s {model})",
                "unsupported_value",
                "session.model",
            )
        return None


def what_it_is(b: S2sBinding) -> str:
    return (
        f"Model '{b.spec.model}' is a speech-to-speech model that listens and speaks on its own "
        f"(capabilities: {b.capabilities})"
    )


def given_voice(config: live.SessionConfig) -> str | None:
    voice = config.audio.output.voice if config.audio and config.audio.output else None
    return voice.id if isinstance(voice, live.CustomVoice) else voice


def prompt_voice(b: S2sBinding, config: live.SessionConfig, stock: frozenset[str]) -> str | None:
    """The start's voice as the model's voice prompt; None: not applied (the model takes no voice, or
    the start named a stock voice it does not have). Any other name is the model's to refuse."""
    name = given_voice(config)
    if not b.takes_voice or name is None or (name in stock and name not in b.spec.voices):
        return None
    return name


def spoken_update(update: rt.SessionUpdateEvent, b: S2sBinding, config: live.SessionConfig, stock: frozenset[str]) -> rt.SessionUpdateEvent:
    """The cascade's realtime configuration of a start, less what the model cannot take (the
    ``delegate`` tool; the instructions and a TTS voice, unless they are its persona and voice
    prompt). ``stock``: the voice names clients send by default (the gateway's TTS voices)."""
    session = update.session
    session.tools = session.tool_choice = UNSET
    session.instructions = (config.instructions or "").strip() if b.takes_persona else UNSET
    if session.audio not in (UNSET, None) and session.audio.output not in (UNSET, None):  # type: ignore[union-attr]
        session.audio.output.voice = prompt_voice(b, config, stock) or UNSET  # type: ignore[union-attr]
    return update


def ignored_settings(b: S2sBinding, config: live.SessionConfig, stock: frozenset[str]) -> list[str]:
    """The start's settings a speech-to-speech model does not apply."""
    voice = given_voice(config)
    delegation = config.delegation
    return [
        name
        for name, given in (
            ("instructions", bool((config.instructions or "").strip()) and not b.takes_persona),
            ("input", bool(config.input)),
            ("audio.output.voice", voice is not None and prompt_voice(b, config, stock) is None),
            ("delegation", isinstance(delegation, live.ResponsesDelegation) or bool(delegation and delegation.acknowledgement_delay_ms)),
        )
        if given
    ]


def spoken_notices(b: S2sBinding, config: live.SessionConfig, stock: frozenset[str]) -> list[live.InfoEvent]:
    mapped = live.InfoEvent(
        code="model_mapped",
        message=f"'{config.model}' runs on this gateway's speech-to-speech stage (model '{b.spec.model}': {b.capabilities}).",
    )
    ignored = ignored_settings(b, config, stock)
    if not ignored:
        return [mapped]
    message = f"Accepted but not applied: {', '.join(ignored)}. {what_it_is(b)}: it hears audio and answers in its own voice."
    return [mapped, live.InfoEvent(code="settings_ignored", message=message)]


def merged(asked: live.ResponsesConfig | None, current: live.ResponsesConfig | None) -> live.ResponsesConfig | None:
    """A sparse update of the backend settings over the current ones (omitted fields kept)."""
    if asked is None or current is None:
        return asked or current
    given = {name: value for name in asked.__struct_fields__ if (value := getattr(asked, name)) is not None}
    return msgspec.structs.replace(current, **given)


class SpokenFace:
    """The speech-to-speech half of ``LiveSession`` (which defines the state and the methods declared here)."""

    inner: RealtimeSession
    ids: Ids
    resource: live.SessionResource | None
    duplex: S2sBinding | None
    announce: list[live.ServerEvent]
    """``session.started`` and its notices, held until the model's stream is open."""
    held: list[live.ClientEvent]
    """What the client sent while the stream opened (``LiveSession.handle`` holds it)."""

    def clock_ms(self, now: float) -> int:
        raise NotImplementedError

    def _outgoing(self, effects: list[Effect], now: float) -> list[Effect]:
        raise NotImplementedError

    def _update(self, ev: live.SessionUpdateEvent) -> list[Effect]:
        raise NotImplementedError

    def _spoken_opened(self, ev: S2sOpened, now: float) -> list[Effect]:
        """The model's stream is open: the session has started."""
        announce, self.announce = self.announce, []
        out = [*(self.ids.send(e) for e in announce), *self._outgoing(self.inner.handle(ev, now), now)]
        held, self.held = self.held, []
        for event in held:  # sent while the stream opened: answered now, in order
            out += self.handle(event, now)
        return out

    def _spoken_command(self, ev: live.ClientEvent, now: float) -> list[Effect] | None:
        """A command a session on a speech-to-speech model answers differently (None: as any session)."""
        b = self.duplex
        assert b is not None
        kind = type(ev).__struct_config__.tag
        if isinstance(ev, REFUSED_COMMANDS):
            raise LiveError(f"{what_it_is(b)}: it never delegates, so there is nothing for '{kind}' to continue", "unsupported_event", "type")
        if isinstance(ev, IGNORED_COMMANDS) and ev.delegation_id is None:
            if not ev.content.strip():
                raise LiveError("content must not be empty", "invalid_value", "content")
            at = self.clock_ms(now)
            notice = live.InfoEvent(code="context_ignored", message=f"'{kind}' was not applied. {what_it_is(b)}: it hears audio only.", client_event_id=ev.event_id)
            return [self.ids.send(notice), self.ids.send(ACKS[type(ev)](start_ms=at, end_ms=at, client_event_id=ev.event_id))]
        if isinstance(ev, live.SessionCloseEvent) and self.inner.s2s is not None:
            self.inner.s2s.finish()  # the close waits for the reply being said, not for the next ones
            return None
        if isinstance(ev, live.SessionUpdateEvent) and ev.session.delegation is not None:
            asked, current = ev.session.delegation, self.resource.delegation if self.resource else None
            if isinstance(asked, live.ResponsesDelegation) and isinstance(current, live.ResponsesDelegation):
                asked.responses = merged(asked.responses, current.responses)  # echoed as the cascade merges it
            notice = live.InfoEvent(code="settings_ignored", message=f"Accepted but not applied: delegation. {what_it_is(b)}.", client_event_id=ev.event_id)
            return [*self._update(ev), self.ids.send(notice)]
        return None
