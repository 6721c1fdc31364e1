"""The response lifecycle of one session: one response slot with named phases, h11-style. Pure.

::

               create                   transcripts in            finished, audio still queued
    IDLE ─────────────────► WAITING ─────────────────► GENERATING ─────────────────► DELIVERING
     ▲                         │                           │                              │
     └──────── response.done (completed | cancelled | failed) from any live phase ───────┘

    close(): IDLE ──► CLOSED (a live response is cancelled first); nothing starts again.

- ``WAITING``: ``response.created`` is out, the worker is not asked yet: a user transcript the
  response reads is still on its way (``StartResponse`` goes out when the last one arrives).
- ``GENERATING``: ``StartResponse`` is out; the worker's text and audio flow in. A refusal
  (``ResponseRefused``: no free slot) or a fault (``ResponseFinished(error=…)``) fails it. A
  response whose model called MCP tools stays here while the gateway runs them, then starts the
  model again for its next round, within the same response (``sessions/mcp.py``).
- ``DELIVERING``: generated; the response stays live until its audio has left for the client
  (``AwaitDelivery`` → ``AudioDelivered``), so speech over it still interrupts it.

Worker results are accepted only for the live ``(response_id, epoch)`` in the phase that expects
them (text and audio while generating, one finish, one delivery); anything else is stale and
dropped. ``response.done`` is sent only by ``_finish``, the one way out of a live phase, so each
response gets exactly one; a transition the table does not allow raises ``ResponsePhaseError``.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import msgspec

from realtime_gw.protocols import audio
from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import OUTPUT_RATE, ChatMessage
from realtime_gw.sessions import mcp
from realtime_gw.sessions.context import ModelContext, chat_units, estimate_tokens
from realtime_gw.sessions.conversation import Conversation, ConversationError, SpokenSpan
from realtime_gw.sessions.duplex import Playbacks
from realtime_gw.sessions.events import (
    AudioDelivered,
    AwaitDelivery,
    CancelResponse,
    Effect,
    Ids,
    Limits,
    McpCallDone,
    PurgeAudio,
    ResponseAudio,
    ResponseFinished,
    ResponseRefused,
    ResponseTextDelta,
    ResponseToolCall,
    ResponseUsage,
    StartResponse,
)
from realtime_gw.sessions.response_params import validated
from realtime_gw.sessions.response_state import LiveResponse
from realtime_gw.sessions.settings import (
    OUTPUT_RATES,
    SessionError,
    SessionSettings,
)


class Phase(str, Enum):
    IDLE = "idle"
    WAITING = "waiting"
    GENERATING = "generating"
    DELIVERING = "delivering"
    CLOSED = "closed"


LIVE = (Phase.WAITING, Phase.GENERATING, Phase.DELIVERING)
_NEXT: dict[Phase, tuple[Phase, ...]] = {
    Phase.IDLE: (Phase.WAITING, Phase.CLOSED),
    Phase.WAITING: (Phase.GENERATING, Phase.IDLE),
    Phase.GENERATING: (Phase.DELIVERING, Phase.IDLE),
    Phase.DELIVERING: (Phase.IDLE,),
    Phase.CLOSED: (),
}


class ResponsePhaseError(RuntimeError):
    """A transition the response phases do not allow: a bug in the session, never a client error."""


class Responses:
    """The session's response slot: creates, starts, feeds, cancels and ends its responses."""

    def __init__(
        self,
        ids: Ids,
        conversation: Conversation,
        playbacks: Playbacks,
        voices: frozenset[str],
        conversation_id: str,
        limits: Limits | None = None,
        servers: mcp.McpServers | None = None,
    ) -> None:
        self.ids = ids
        self.conversation = conversation
        self.limits = limits or Limits()
        self.model_context = ModelContext(self.limits.context_tokens)
        """What the model still sees of the conversation (``session.truncation``)."""
        self.playbacks = playbacks
        """The playback ledger (shared with turn-taking): each audio response is tracked in it."""
        self.voices = voices
        self.conversation_id = conversation_id
        self.phase = Phase.IDLE
        self.live: LiveResponse | None = None
        self.epoch = 0
        """Bumped by every create and cancel: results carrying an older epoch are stale."""
        self.mcp = servers
        """The session's MCP servers (and those responses named): what its responses may call."""

    def _enter(self, phase: Phase, action: str) -> None:
        if phase not in _NEXT[self.phase]:
            rid = self.live.id if self.live is not None else "none"
            raise ResponsePhaseError(
                f"cannot {action} while the response slot is {self.phase.value} (response {rid}): "
                f"{self.phase.value} -> {phase.value} is not a transition"
            )
        self.phase = phase

    def _send(self, r: LiveResponse, event: rt.ServerEvent, audio_ms: float = 0.0) -> Effect:
        """An event of response ``r``: it travels in that response's ordered (paced) lane."""
        return self.ids.send(event, response_id=r.id, audio_ms=audio_ms)

    # -- creating and starting ---------------------------------------------------------------------
    def create(self, p: rt.ResponseParams, settings: SessionSettings, event_id: str | None = None) -> list[Effect]:
        """``response.create`` (or a turn that asks for an answer). Raises ``SessionError`` (or
        ``ConversationError``) and changes nothing when it cannot be created."""
        if self.live is not None:
            raise SessionError(
                f"Conversation already has an active response in progress: {self.live.id}. "
                "Wait until the response is finished before creating a new one.",
                "conversation_already_has_active_response",
            )
        asked = validated(p, settings, self.voices, self.limits, self.conversation)
        mcp_tools = asked.pop("mcp_tools")
        if self.mcp is not None:
            self.mcp.check_choice(asked["tool_choice"], mcp_tools, "response.tool_choice")
        r = LiveResponse(
            id=self.ids.new("resp"),
            epoch=self.epoch + 1,
            item_id=self.ids.new("item"),
            conversation_id=self.conversation_id,
            function_tools=asked["tools"],
            **asked,
        )
        out = self.open(r, settings)
        if self.mcp is not None and mcp_tools:
            r.mcp_servers, listings = self.mcp.use(mcp_tools)
            out += listings
            mcp.offer(r)
        if not r.offers_tools:  # a message for sure: announced at once
            out += self._open_message(r)
        return out + self.start_if_ready()

    def open(self, r: LiveResponse, settings: SessionSettings, generating: bool = False) -> list[Effect]:
        """``r`` becomes the live response (``response.created``). ``generating``: its model already
        runs on its own (a speech-to-speech stream; no worker is asked), its message announced at
        once. A full conversation refuses it first (``ConversationError``, nothing changed)."""
        if r.in_conversation:
            self.conversation.check_add(r.item_id)  # a refused response must leave nothing behind
        self._enter(Phase.WAITING, "open a spoken response" if generating else "create a response")
        if generating:
            self._enter(Phase.GENERATING, "start a spoken response")
        self.epoch, self.live = r.epoch, r
        if r.audio:
            r.encoder = audio.OutputEncoder(settings.output_format)
            self.playbacks.open(r.id, r.item_id)
        created = self._send(r, rt.ResponseCreatedEvent(response=r.wire("in_progress")))
        return [created, *self._open_message(r)] if generating else [created]

    def _open_message(self, r: LiveResponse) -> list[Effect]:
        """Announce the response's message item (its output 0) and its content part."""
        if r.opened:
            return []
        r.opened = True
        item = r.item("in_progress")
        index = r.message_index
        out = [self._send(r, rt.ResponseOutputItemAddedEvent(response_id=r.id, output_index=index, item=item))]
        if r.in_conversation:
            previous = self.conversation.last_id()
            entry = self.conversation.add(msgspec.structs.replace(item, content=[]), force=True)
            entry.response_id = r.id
            out.append(self._send(r, rt.ConversationItemAdded(item=item, previous_item_id=previous)))
        out.append(self._send(r, rt.ResponseContentPartAddedEvent(**r.ref(), part=r.part())))
        return out

    def start_if_ready(self) -> list[Effect]:
        """WAITING -> GENERATING once every user transcript has arrived."""
        r = self.live
        if r is None or self.phase is not Phase.WAITING or self.conversation.transcripts_pending:
            return []
        if mcp.listing(r.mcp_servers):
            return []  # an MCP server it names is still being listed
        refused = mcp.unmet_choice(r, self.ids)
        if refused is not None:  # the tool it must call is not there: it fails before its model starts
            return [refused[0], *self._finish(r, "failed", refused[1])]
        self._enter(Phase.GENERATING, "start the response")
        return [round_start(r, self.conversation, self.model_context, self.limits)]

    def answer(self, settings: SessionSettings, p: rt.ResponseParams | None = None) -> list[Effect]:
        """A user turn asks for an answer: now, or when the live response completes. Never raises:
        a rule the new response would break (a full conversation) becomes an error event."""
        if self.live is not None:
            self.live.answer_after = True
            return []
        try:
            return self.create(p or rt.ResponseParams(), settings)
        except (SessionError, ConversationError) as e:
            return [self.ids.error(str(e), e.code, e.param)]

    # -- worker results --------------------------------------------------------------------------------
    def _accepts(self, response_id: str, epoch: int, phase: Phase) -> LiveResponse | None:
        r = self.live
        if r is None or (r.id, r.epoch) != (response_id, epoch) or self.phase is not phase:
            return None  # stale: a result of a cancelled or finished response, or one it no longer expects
        return r

    def on_text(self, ev: ResponseTextDelta) -> list[Effect]:
        r = self._accepts(ev.response_id, ev.epoch, Phase.GENERATING)
        if r is None or r.audio or not ev.text:
            return []  # with audio, the transcript travels with the frames
        out = self._open_message(r)
        r.text += ev.text
        return [*out, self._send(r, rt.ResponseTextDeltaEvent(**r.ref(), delta=ev.text))]

    def on_tool_call(self, ev: ResponseToolCall) -> list[Effect]:
        """A fragment of a function call: kept until generation completes (see ``response_state.py``)."""
        r = self._accepts(ev.response_id, ev.epoch, Phase.GENERATING)
        if r is not None:
            r.calls.feed(ev.delta, self.ids.new)
        return []

    def on_usage(self, ev: ResponseUsage) -> list[Effect]:
        r = self._accepts(ev.response_id, ev.epoch, Phase.GENERATING)
        if r is not None:
            r.usage = ev.usage
        return []

    def on_audio(self, ev: ResponseAudio, now: float) -> list[Effect]:
        r = self._accepts(ev.response_id, ev.epoch, Phase.GENERATING)
        if r is None or not r.audio:
            return []
        playback = self.playbacks.get(r.id)
        if playback is not None and r.rounds > 1 and ev.frame.pcm and not r.audio_ms:
            playback.add_item(r.item_id, r.earlier_audio_ms, now)  # a later round speaks
        words = ev.frame.text.strip()
        out: list[Effect] = self._open_message(r) if words or ev.frame.pcm else []
        if words:
            delta = (" " if r.text else "") + words
            r.text += delta
            r.spans.append(SpokenSpan(r.audio_ms, words))
            out.append(self._send(r, rt.ResponseAudioTranscriptDeltaEvent(**r.ref(), delta=delta)))
        if ev.frame.pcm:
            assert r.encoder is not None
            ms = len(ev.frame.pcm) / 2 / OUTPUT_RATE * 1000
            out.append(self._audio_delta(r, r.encoder.encode(ev.frame.pcm), ms))
            r.audio_ms += ms
            if playback is not None:
                playback.audio_ms = r.earlier_audio_ms + r.audio_ms
        return out

    def _audio_delta(self, r: LiveResponse, wire: bytes, ms: float) -> Effect:
        assert r.encoder is not None
        rate = OUTPUT_RATES[r.encoder.format]
        delta = rt.ResponseAudioDeltaEvent(**r.ref(), delta=wire, seq=r.frames, sample_rate_hz=rate)
        r.frames += 1
        return self._send(r, delta, audio_ms=ms)

    def on_finished(self, ev: ResponseFinished, settings: SessionSettings, now: float) -> list[Effect]:
        r = self._accepts(ev.response_id, ev.epoch, Phase.GENERATING)
        if r is None:
            return []
        if ev.error is not None:
            # The session goes on: an error event says what happened, then the one response.done.
            failed = self.ids.error(f"Response {r.id} failed: {ev.error}", "response_failed", type="server_error")
            details = rt.ResponseStatusDetails(type="failed", error={"type": "server_error", "message": ev.error})
            return [failed, *self._finish(r, "failed", details)]
        if r.offers_tools and any(c.name in r.mcp_names for c in r.calls):
            # the round's message is done, then its MCP calls follow it; the response stays live
            # (generating) until every one has ended: on_mcp
            out = self._end_message(r)
            return out + mcp.start_calls(r, self._send, self.conversation, self.ids.new, now)
        return self._generated(r, settings)

    def on_mcp(self, ev: McpCallDone | rt.Item, settings: SessionSettings) -> list[Effect]:
        """An MCP call's result, or an ``mcp_approval_response`` item (the client's, or the one the
        gateway makes for a request that waited too long: ``expire_approvals``)."""
        r = self.live if isinstance(ev, rt.Item) else self._accepts(ev.response_id, ev.epoch, Phase.GENERATING)
        if r is None or self.phase is not Phase.GENERATING:
            return []
        out, all_done = mcp.advance(r, ev, self._send, self.conversation)
        return out + self._after_calls(r, settings) if all_done else out

    def _after_calls(self, r: LiveResponse, settings: SessionSettings) -> list[Effect]:
        """Every MCP call of the round has ended. With a function call for the client, the response
        completes (the client runs it, then asks again). Otherwise the model goes on within this
        response, reading the results: a new round, whose message follows this round's outputs; the
        last round allowed (``mcp.MAX_MODEL_ROUNDS``) is offered no tools, so it answers."""
        if r.calls.for_client:
            return self._generated(r, settings)
        self.epoch += 1
        r.next_round(self.ids.new("item"), self.epoch)
        if r.rounds >= mcp.MAX_MODEL_ROUNDS:
            r.tool_choice = "none"
        return [round_start(r, self.conversation, self.model_context, self.limits)]

    def _end_message(self, r: LiveResponse) -> list[Effect]:
        """The round's message is complete (its audio's last samples flushed)."""
        out = self._flush_audio(r)
        if r.encoder is not None:
            r.encoder = audio.OutputEncoder(r.encoder.format)  # the next round's message starts afresh
        if r.opened and not r.closed:
            out += close_message(r, "completed", self._send, self.conversation)
        r.closed = True
        return out

    def _flush_audio(self, r: LiveResponse) -> list[Effect]:
        """G.711: the resampler's withheld last samples of the message."""
        tail = r.encoder.flush() if r.encoder is not None else b""
        if not tail:
            return []
        return [self._audio_delta(r, tail, len(tail) / (OUTPUT_RATES[r.encoder.format] / 1000))]  # type: ignore[union-attr]

    def _generated(self, r: LiveResponse, settings: SessionSettings) -> list[Effect]:
        out = self._flush_audio(r)
        if r.audio and r.frames:
            self._enter(Phase.DELIVERING, "wait for the audio to be delivered")
            return [*out, AwaitDelivery(r.id, r.epoch)]  # live until its audio is out
        return out + self._complete(r, settings)

    def on_refused(self, ev: ResponseRefused) -> list[Effect]:
        """No worker slot to start it: it fails at once, as ``server_busy``."""
        r = self._accepts(ev.response_id, ev.epoch, Phase.GENERATING)
        if r is None:
            return []
        busy = self.ids.error(f"Response {r.id} could not start: {ev.reason}", "server_busy", type="server_error")
        error = {"type": "server_error", "code": "server_busy", "message": ev.reason}
        return [busy, *self._finish(r, "failed", rt.ResponseStatusDetails(type="failed", error=error))]

    def on_delivered(self, ev: AudioDelivered, settings: SessionSettings) -> list[Effect]:
        r = self._accepts(ev.response_id, ev.epoch, Phase.DELIVERING)
        return [] if r is None else self._complete(r, settings)

    def _complete(self, r: LiveResponse, settings: SessionSettings) -> list[Effect]:
        out = self._finish(r, "completed", None)
        return out + self.answer(settings) if r.answer_after else out

    # -- ending ----------------------------------------------------------------------------------------
    def cancel(self, reason: str) -> list[Effect]:
        """Stop the live response (``client_cancelled``, ``turn_detected``, ``client_disconnected``)."""
        r = self.live
        if r is None:
            raise ResponsePhaseError(f"cannot cancel ({reason}) while the response slot is {self.phase.value}")
        out: list[Effect] = [CancelResponse(r.id, r.epoch), PurgeAudio(r.id)]
        out += self._finish(r, "cancelled", rt.ResponseStatusDetails(type="cancelled", reason=reason))
        self.epoch += 1  # anything still in flight for the old epoch is now stale
        return out

    def close(self) -> list[Effect]:
        """The session ends: cancel the live response; no response starts again."""
        out = self.cancel("client_disconnected") if self.live is not None else []
        self._enter(Phase.CLOSED, "close the session")
        return out

    def _finish(self, r: LiveResponse, status: str, details: rt.ResponseStatusDetails | None) -> list[Effect]:
        """Close out the message, then (completed) the function calls, then the single ``response.done``."""
        self._enter(Phase.IDLE, f"end the response ({status})")
        self.live = None
        playback = self.playbacks.get(r.id)
        if playback is not None:
            playback.finished = True
        out: list[Effect] = []
        if status == "completed" and not r.opened and not r.calls:
            out += self._open_message(r)  # nothing said and nothing called: an empty message, as a reply
        out += mcp.abandon_calls(r, self._send, self.conversation)
        out += close_message(r, status, self._send, self.conversation) if r.opened and not r.closed else []
        if status == "completed":
            out += emit_calls(r, self._send, self.conversation)
        out.append(self._send(r, rt.ResponseDoneEvent(response=r.wire(status, details))))
        return [*out, rate_limits(r, self.ids, self.limits)]



def round_start(
    r: LiveResponse, conversation: Conversation, model_context: ModelContext, limits: Limits
) -> StartResponse:
    """What the model is asked for this round: the conversation (or ``response.input``) and, out
    of the conversation, what the response's earlier rounds did."""
    if r.mcp_servers and r.tool_choice != "none":
        mcp.offer(r)  # with the listings as they are now
    fixed = [ChatMessage("system", r.instructions)] if r.instructions else []
    earlier = [] if r.in_conversation else mcp.earlier_entries(r)
    if r.context is not None:
        messages = fixed + r.context + [m for u in chat_units(earlier) for m in u.messages]
    else:
        tools_chars = len(msgspec.json.encode(r.tools)) if r.offers_tools else 0
        entries = conversation.entries() + earlier
        reply = r.max_output_tokens or limits.reply_tokens
        messages = model_context.messages(entries, r.truncation, fixed, tools_chars, reply)
        if r.truncation != "disabled":
            # the reply may only use what the prompt leaves of the window (a backend refuses more)
            room = model_context.limit(r.truncation) - sum(estimate_tokens(m) for m in messages)
            r.max_output_tokens = max(1, min(reply, room - tools_chars // 4))
    r.prompt_tokens = sum(estimate_tokens(m) for m in messages)
    return r.start(messages)


def close_message(r: LiveResponse, status: str, send: Any, conversation: Conversation) -> list[Effect]:
    """The message's done events (``status``: how the response ended); its item brought up to date."""
    item_status = "completed" if status == "completed" else "incomplete"
    item = r.item(item_status)
    ref = r.ref()
    if r.audio:
        out = [
            send(r, rt.ResponseAudioDoneEvent(**ref)),
            send(r, rt.ResponseAudioTranscriptDoneEvent(**ref, transcript=r.text)),
        ]
    else:
        out = [send(r, rt.ResponseTextDoneEvent(**ref, text=r.text))]
    out.append(send(r, rt.ResponseContentPartDoneEvent(**ref, part=r.part())))
    done = rt.ResponseOutputItemDoneEvent(response_id=r.id, output_index=r.message_index, item=item)
    out.append(send(r, done))
    if r.in_conversation and r.item_id in conversation:
        entry = conversation.get(r.item_id)
        r.sync(entry)
        entry.item.status = item_status  # type: ignore[assignment]
        previous = conversation.previous_id(r.item_id)
        out.append(send(r, rt.ConversationItemDone(item=item, previous_item_id=previous)))
    return out


def emit_calls(r: LiveResponse, send: Any, conversation: Conversation) -> list[Effect]:
    """The GA sequence per call: output_item.added, arguments deltas, arguments done,
    output_item.done (and the item joins the conversation, after the message)."""
    out: list[Effect] = []
    first = r.message_index + (1 if r.opened else 0) + len(r.mcp_outputs)
    for index, call in enumerate(r.calls.for_client, start=first):
        call.output_index = index
        started, made = call.item("in_progress"), call.item("completed")
        ref = {"response_id": r.id, "item_id": call.item_id, "output_index": index, "call_id": call.call_id}
        out.append(send(r, rt.ResponseOutputItemAddedEvent(response_id=r.id, output_index=index, item=started)))
        if r.in_conversation:
            previous = conversation.last_id()
            conversation.add(made, force=True).response_id = r.id
            out.append(send(r, rt.ConversationItemAdded(item=started, previous_item_id=previous)))
        for fragment in call.fragments:
            out.append(send(r, rt.ResponseFunctionCallArgumentsDeltaEvent(**ref, delta=fragment)))
        args = rt.ResponseFunctionCallArgumentsDoneEvent(**ref, name=call.name, arguments=call.arguments)
        out.append(send(r, args))
        out.append(send(r, rt.ResponseOutputItemDoneEvent(response_id=r.id, output_index=index, item=made)))
        if r.in_conversation:
            previous = conversation.previous_id(call.item_id)
            out.append(send(r, rt.ConversationItemDone(item=made, previous_item_id=previous)))
    return out


def rate_limits(r: LiveResponse, ids: Ids, limits: Limits) -> Effect:
    """``rate_limits.updated`` after each ``response.done``. The gateway meters no requests; what
    it knows is the backend's context budget, so ``tokens`` is that budget and what this
    response's context left of it."""
    limit = limits.context_tokens
    used = r.usage.input_tokens if r.usage is not None else r.prompt_tokens
    tokens = rt.RateLimit(name="tokens", limit=limit, remaining=max(0, limit - used), reset_seconds=0.0)
    # Not in the response's lane (nothing of a response follows its response.done); that lane is
    # empty by then (response.done waits for the audio's delivery), so it still arrives after it.
    return ids.send(rt.RateLimitsUpdatedEvent(rate_limits=[tokens]))
