"""Delegation, as the GPT-Live face of the session does it (a part of ``LiveSession``). Pure.

The voice front is offered one function, ``delegate``; when it calls it, the call id becomes the
delegation id of ``session.delegation.created``. Under client delegation the app's ``thinking.append``
/ ``commentary.append`` with that ``delegation_id`` is the call's output (spoken, for commentary);
under Responses delegation the backend model takes the task (``live_backend.py``) and its answer is
the output, spoken. A delegation the voice made without a word is acknowledged aloud after
``acknowledgement_delay_ms``, unless the app or the answer came first.
"""

from __future__ import annotations

from typing import Any

from realtime_gw.protocols import live
from realtime_gw.protocols import realtime as rt
from realtime_gw.sessions.conversation import ConversationError, Entry, item_text
from realtime_gw.sessions.events import Effect, Ids, Send
from realtime_gw.sessions.live_backend import FAILED, Backend, LiveError, Task, checked_config
from realtime_gw.sessions.realtime import RealtimeSession
from realtime_gw.sessions.settings import SessionError

DELEGATE_TOOL = "delegate"
DELEGATE_SPEC: dict[str, Any] = {
    "type": "function",
    "name": DELEGATE_TOOL,
    "description": (
        "Hand a task you cannot do yourself (looking something up, acting for the user) to the "
        "application. Say briefly that you are on it; the result comes back later."
    ),
    "parameters": {
        "type": "object",
        "properties": {"task": {"type": "string", "description": "What to do, in full."}},
        "required": ["task"],
    },
}
ACKNOWLEDGE = "The application is working on the task you delegated: tell the user, in a few words, that you are on it."
"""What asks the voice for the automatic spoken acknowledgement of a delegation."""
SPEAK_RESULT = "The delegated task is done; its result is the tool output above: tell the user now."
"""After a delegation's result given as commentary: what asks the voice to speak it."""


class Delegating:
    """The delegation half of ``LiveSession`` (which defines the state and the methods declared here)."""

    inner: RealtimeSession
    ids: Ids
    resource: live.SessionResource | None
    delegations: dict[str, bool]
    backend: Backend | None
    spoke: set[str]
    ack_due: float | None
    closing_since: float | None

    def clock_ms(self, now: float) -> int:
        raise NotImplementedError

    def error(self, message: str, code: str, param: str | None = None, event_id: str | None = None) -> Send:
        raise NotImplementedError

    def _outgoing(self, effects: list[Effect], now: float) -> list[Effect]:
        raise NotImplementedError

    def _say(self, items: list[rt.Item], speak: bool, now: float, event_id: str | None = None) -> list[Effect]:
        raise NotImplementedError

    def _delegated(self, ev: rt.ResponseFunctionCallArgumentsDoneEvent, now: float) -> list[Effect]:
        """The voice called the delegation tool: the app (client delegation) or the backend model
        (Responses delegation) takes the task; the voice acknowledges it if it said nothing."""
        self.delegations[ev.call_id] = False
        delegation = self.resource.delegation if self.resource else None
        if ev.response_id not in self.spoke and delegation is not None:
            self.ack_due = now + (delegation.acknowledgement_delay_ms or 0) / 1000
        if self.backend is None:
            ref = live.DelegationRef(id=ev.call_id, target="client")
            return [self.ids.send(live.DelegationCreatedEvent(delegation=ref, offset_ms=self.clock_ms(now)))]
        at = self.clock_ms(now)
        task = self.backend.delegate(ev.call_id, ev.arguments, spoken_turns(self.inner.conversation.entries()))
        response_id, run = self._run_backend(ev.call_id, task, now)
        ref = live.DelegationRef(id=ev.call_id, target="responses", response_id=response_id)
        return [self.ids.send(live.DelegationCreatedEvent(delegation=ref, offset_ms=at)), *run]

    def _backend(self, kind: str) -> Backend:
        if self.backend is None:
            raise LiveError(f"'{kind}' requires Responses delegation", "invalid_value", "type")
        return self.backend

    def _run_backend(self, delegation_id: str, task: Task, now: float) -> tuple[str | None, list[Effect]]:
        """One backend run for a delegation, beside the voice (never cut by barge-in)."""
        assert self.backend is not None
        try:
            effects = self.inner.side.create(self.backend.params(task), self.inner.settings)
        except (SessionError, ConversationError) as e:  # e.g. too many runs at once: the voice says so
            del self.backend.tasks[delegation_id]
            return None, [self.error(str(e), e.code, None), *self._result(delegation_id, FAILED, now)]
        created = next(e.event for e in effects if isinstance(e, Send) and isinstance(e.event, rt.ResponseCreatedEvent))
        self.backend.started(delegation_id, created.response.id)
        return created.response.id, self._outgoing(effects, now)

    def _backend_event(self, ev: rt.ServerEvent, now: float) -> list[Effect]:
        assert self.backend is not None
        envelope, outcome = self.backend.translate(ev, now)
        out: list[Effect] = [self.ids.send(envelope)] if envelope is not None else []
        return out + (self._result(outcome.delegation_id, outcome.text, now) if outcome is not None else [])

    def _result(self, delegation_id: str, text: str, now: float) -> list[Effect]:
        """The backend's outcome, spoken by the voice (as the delegation's result when the app has
        not answered it already; else, and for the app's own requests, as something to tell the user)."""
        self.ack_due = None
        if self.delegations.get(delegation_id, True):  # answered already, or the app's own request
            return self._say([system_item(FRAMES[live.CommentaryAppendEvent].format(text))], True, now)
        self.delegations[delegation_id] = True
        return self._say(result_items(delegation_id, text, True), True, now)

    def _update(self, ev: live.SessionUpdateEvent) -> list[Effect]:
        """``session.update``: the delegation settings (same type; omitted fields kept)."""
        assert self.resource is not None
        asked = ev.session
        if asked.triggers:
            raise LiveError("Decisions triggers are not supported", "unsupported_value", "session.triggers")
        if asked.delegation is not None:
            current = self.resource.delegation
            if type(asked.delegation) is not type(current):
                raise LiveError("The delegation type cannot change", "invalid_value", "session.delegation.type")
            if isinstance(asked.delegation, live.ResponsesDelegation) and self.backend is not None:
                limits = self.inner.limits
                config = checked_config(asked.delegation.responses, self.backend.config, limits.max_tools, limits.max_instructions_chars)
                self.backend.config = asked.delegation.responses = config
            if asked.delegation.acknowledgement_delay_ms is None:  # omitted: kept
                asked.delegation.acknowledgement_delay_ms = current.acknowledgement_delay_ms  # type: ignore[union-attr]
            self.resource.delegation = asked.delegation
        return [self.ids.send(live.SessionUpdatedEvent(session=self.resource, client_event_id=ev.event_id))]

    def _acknowledge(self, now: float) -> list[Effect]:
        """The voice acknowledges a delegation it made silently, ``acknowledgement_delay_ms`` after it
        (unless a commentary or thinking came first, or the session is closing)."""
        if self.ack_due is None or now < self.ack_due or self.closing_since is not None:
            return []
        self.ack_due = None
        effects = self.inner.handle(rt.ConversationItemCreateEvent(item=system_item(ACKNOWLEDGE)), now)
        return self._outgoing(effects + self.inner.responses.answer(self.inner.settings), now)


FRAMES = {
    live.InstructionsAppendEvent: "Standing instruction from the application, from now on: {}",
    live.ThinkingAppendEvent: "Context from the application, for you only (do not say it unless asked): {}",
    live.CommentaryAppendEvent: "Tell the user this now, briefly and in your own words: {}",
}
ACKS: dict[type, Any] = {
    live.InstructionsAppendEvent: live.InstructionsAppendedEvent,
    live.ThinkingAppendEvent: live.ThinkingAppendedEvent,
    live.CommentaryAppendEvent: live.CommentaryAppendedEvent,
}


def result_items(delegation_id: str, content: str, speak: bool) -> list[rt.Item]:
    """A delegation's result: the output of the voice's delegation call (and, to be spoken, the ask)."""
    output = rt.Item(type="function_call_output", call_id=delegation_id, output=content)
    return [output, system_item(SPEAK_RESULT)] if speak else [output]


def response_of(ev: object) -> str | None:
    if isinstance(ev, rt.ResponseCreatedEvent | rt.ResponseDoneEvent):
        return ev.response.id
    return getattr(ev, "response_id", None)


def spoken_turns(entries: list[Entry]) -> list[tuple[str, str]]:
    """What the user and the voice said, in order (the context a backend model gets)."""
    turns = [(e.item.role, item_text(e.item).strip()) for e in entries if e.item.type == "message" and e.item.role in ("user", "assistant")]
    return [(role or "", text) for role, text in turns if text]


def system_item(text: str) -> rt.Item:
    return rt.Item(type="message", role="system", content=[rt.ContentPart(type="input_text", text=text)])

