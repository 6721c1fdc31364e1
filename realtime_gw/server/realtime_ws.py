"""``/v1/realtime``: the thin loop around ``RealtimeSession``.

One mailbox per connection, consumed by one task that owns the session (no locks). Other tasks only
move bytes (reader, writer) or pump worker results into the mailbox. What leaves when (lanes, pacing,
purge, backpressure, seq, delivery) is decided by the pure ``Outbox``; the writer only sleeps until
its next due event (or a wake-up) and writes it.

The connection is transport-neutral: its ``Channel`` is the WebSocket here, or a WebRTC call's data
channel (``server/webrtc``, which subclasses it to put reply audio on the call's track).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from realtime_gw.models.runtime import NoFreeSlot, Stream, WorkerFault
from realtime_gw.protocols import realtime as rt
from realtime_gw.records.s2s import S2sAudio, S2sSilence
from realtime_gw.records.voice import (
    ChatRequest,
    ChatUsage,
    ReplyPiece,
    ToolCallDelta,
    TtsRequest,
    VadRequest,
)
from realtime_gw.server import auth
from realtime_gw.server.admission import Admission, admit_socket
from realtime_gw.server.auth import Refusal
from realtime_gw.server.client_secrets import ClientSecret
from realtime_gw.server.gateway import Gateway
from realtime_gw.server.listen_effects import Listening
from realtime_gw.server.mcp_client import McpRequests
from realtime_gw.server.metrics import FRAME_LATENESS, TTFA
from realtime_gw.server.outbox import Notice, Outbox, OutboxFull, Outgoing
from realtime_gw.server.realtime_input import Channel, ClientInput, FromClient
from realtime_gw.server.s2s_link import (
    ECHO_DEFAULTS,
    ECHO_SPEC,
    S2sLink,
    binding,
    session_seed,
    unserved_model,
)
from realtime_gw.sessions.events import (
    AskTurn,
    AwaitDelivery,
    CallMcpTool,
    CancelAsr,
    CancelResponse,
    Close,
    Effect,
    FeedAsr,
    FeedVad,
    Limits,
    ListMcpTools,
    OpenS2s,
    PurgeAudio,
    ResponseAudio,
    ResponseFinished,
    ResponseRefused,
    ResponseTextDelta,
    ResponseToolCall,
    ResponseUsage,
    Send,
    StartAsr,
    StartResponse,
    StartVad,
    StopVad,
    Tick,
    Transcribe,
    VadResult,
    VadUnavailable,
    unhandled,
)
from realtime_gw.sessions.given_config import apply_given
from realtime_gw.sessions.realtime import RealtimeSession

log = logging.getLogger(__name__)

TICK_S = 0.25
YIELD_EVERY = 16
"""Events a connection's session task handles, or its writer writes, in a row before it lets other
tasks run (a queue that has items never yields; a burst would hold the loop from other sessions)."""


class _Closed(Exception):
    """The connection must end (client gone or a limit hit)."""


class RealtimeConnection:
    def __init__(self, ws: Channel, gateway: Gateway, session: RealtimeSession) -> None:
        self.ws = ws
        self.gateway = gateway
        self.config = gateway.config
        self.session = session
        self.mailbox: asyncio.Queue[Any] = asyncio.Queue(maxsize=1024)
        self.outbox = Outbox(self.config.outbound_queue_frames, self.config.audio_lead_ms)
        self.wake = asyncio.Event()  # the outbox changed (push, purge): the writer asks it again
        self.idle = asyncio.Event()  # set by the writer while nothing is queued or being written
        self.audio_room = asyncio.Event()  # cleared over the outbox's audio high-water (the TTS pump waits)
        self.audio_room.set()
        self.input = ClientInput(ws, self.config, self.mailbox, lambda: len(self.outbox))
        self.tasks: set[asyncio.Task[Any]] = set()
        self.vad_streams: dict[int, Stream[Any]] = {}
        self.responses: dict[str, asyncio.Task[None]] = {}
        turn_worker = getattr(gateway.workers, "turn", None)
        self.listening = Listening(gateway.workers.asr, turn_worker, self.mailbox.put, self.spawn)
        self.s2s = S2sLink(
            gateway.workers.s2s, self.mailbox.put, self.mailbox.put_nowait, self.spawn, self.audio_room,
            self.config.s2s_silence_dbfs,
        )
        self.mcp = McpRequests(self.config, self.mailbox.put, self.spawn)
        self.close_reason: tuple[int, str] | None = None

    # -- task plumbing -------------------------------------------------------------------------------
    def spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def run(self) -> None:
        writer = self.spawn(self._writer(), "writer")
        reader = self.spawn(self._reader(), "reader")
        ticker = self.spawn(self._ticker(), "ticker")
        self._run_effects(self.session.start(time.monotonic()))
        handled = 0
        try:
            while True:
                handled += 1
                if handled % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                item = await self.mailbox.get()
                if item is _DISCONNECTED:
                    break
                if isinstance(item, FromClient):
                    item = self.input.taken(item)
                elif isinstance(item, Tick) and self._expired():
                    break
                try:
                    effects = self.session.handle(item, time.monotonic())
                except Exception:  # a bug must not take the connection down with it
                    log.exception("session %s failed on %s", self.session.id, type(item).__name__)
                    effects = [self.session.error("Internal error handling the event", "server_error")]
                self._run_effects(effects)
                if self.close_reason is not None:
                    break
        except _Closed:
            pass
        finally:
            self._run_effects(self.session.close(), closing=True)
            for t in (reader, ticker, *self.responses.values()):
                t.cancel()
            self.s2s.close()
            for s in self.vad_streams.values():
                s.cancel()
            if self.close_reason is not None:
                code, reason = self.close_reason
                if code != 1008:
                    # The session's close: let the writer deliver what is queued (why it ends) first.
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.idle.wait(), 2.0)
                writer.cancel()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.ws.close(code=code, reason=reason), 2.0)
            else:
                writer.cancel()
            for t in list(self.tasks):
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _reader(self) -> None:
        try:
            await self.input.read()
        finally:
            self._signal_disconnect()

    def _expired(self) -> bool:
        """Past the idle timeout or the maximum duration: `session_expired`, then close 1000."""
        why = self.input.lifetime.expired(time.monotonic())
        if why is None:
            return False
        self._run_effects([self.session.error(f"Your {why}.", "session_expired")])
        self.close_reason = (1000, why[:120])
        return True

    def _signal_disconnect(self) -> None:
        """Wake the session task to end, even when its mailbox is full (anything dropped to make
        room is moot: the connection is going away)."""
        while True:
            try:
                self.mailbox.put_nowait(_DISCONNECTED)
                return
            except asyncio.QueueFull:
                self.mailbox.get_nowait()

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            await self.mailbox.put(Tick())

    # -- effects -------------------------------------------------------------------------------------
    def _run_effects(self, effects: list[Effect], closing: bool = False) -> None:
        """The one interpreter of the session's effects: every ``Effect`` type has its case."""
        for e in effects:
            match e:
                case Send():
                    if not closing:
                        self._enqueue(e)
                case FeedVad():
                    if (stream := self.vad_streams.get(e.stream_id)) is not None:
                        stream.push(e.pcm)
                case StartVad():
                    self._start_vad(e)
                case StopVad():
                    if (stream := self.vad_streams.pop(e.stream_id, None)) is not None:
                        stream.cancel()
                case StartAsr() | FeedAsr() | CancelAsr() | AskTurn():
                    self.listening.run(e)
                case OpenS2s() | S2sAudio() | S2sSilence():
                    self.s2s.run(e)
                case Transcribe():
                    self.listening.transcribe(e)
                case StartResponse():
                    self.responses[e.response_id] = self.spawn(self._respond(e), f"resp-{e.response_id}")
                case CancelResponse():
                    if (task := self.responses.pop(e.response_id, None)) is not None:
                        task.cancel()
                    self.mcp.cancel(e.response_id)
                case ListMcpTools() | CallMcpTool():
                    self.mcp.run(e)
                case PurgeAudio():
                    self._post(self.outbox.purge(e.response_id))
                    self._outbox_changed()
                case AwaitDelivery():
                    self._post(self.outbox.await_delivery(e.response_id, e.epoch))
                case Close():
                    self._post(self.outbox.purge_all_audio())
                    self._outbox_changed()
                    self.close_reason = (e.code, e.reason)
                case _:
                    unhandled(e)

    def _enqueue(self, e: Send) -> None:
        try:
            self.outbox.push(e.event, e.response_id, e.audio_ms, now=time.monotonic())
        except OutboxFull:
            self.close_reason = (1008, "outbound queue full: the client is not reading")
            raise _Closed from None
        self._outbox_changed()

    def _outbox_changed(self) -> None:
        if len(self.outbox):
            self.idle.clear()
        self.wake.set()
        self._sync_rooms()

    def _sync_rooms(self) -> None:
        (self.audio_room.set if self.outbox.has_room else self.audio_room.clear)()
        self.input.outbox_drained()

    def _post(self, notices: list[Notice]) -> None:
        """Hand the outbox's notices to the session. Never blocks (the caller may be the session
        task): a full mailbox gets a task that waits for room."""
        for notice in notices:
            try:
                self.mailbox.put_nowait(notice)
            except asyncio.QueueFull:
                self.spawn(self.mailbox.put(notice), f"notice-{notice.response_id}")

    async def _writer(self) -> None:
        written = 0
        try:
            while True:
                due = self.outbox.next_due(time.monotonic())
                if isinstance(due, Outgoing):
                    self._sync_rooms()
                    await self._write(due.event)
                    written += 1
                    if written % YIELD_EVERY == 0:
                        await asyncio.sleep(0)
                    if due.ttfa_s is not None:
                        TTFA.observe(due.ttfa_s)
                    if due.lateness_s is not None:
                        FRAME_LATENESS.observe(due.lateness_s)
                    self._post(due.notices)
                    continue
                if due is None:
                    self.idle.set()
                # Sleep until due, or until a push or purge changes the answer (asyncio.timeout: before
                # 3.12 wait_for can swallow a cancel that lands as the wake-up does; the writer would live on)
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(due):
                        await self.wake.wait()
        except (WebSocketDisconnect, RuntimeError, OSError):
            self._signal_disconnect()

    async def _write(self, event: rt.ServerEvent) -> None:
        data = rt.encode_server_event(event).decode()
        try:
            async with asyncio.timeout(self.config.send_timeout_s):
                await self.ws.send_text(data)
        except TimeoutError:
            # The client stopped reading and the socket buffers are full: bound what we hold.
            self.close_reason = (1008, "client is not reading")
            raise RuntimeError("send timed out") from None

    # -- worker pumps ----------------------------------------------------------------------------------
    def _start_vad(self, e: StartVad) -> None:
        try:
            stream = self.gateway.workers.vad.submit(VadRequest(sample_rate=e.sample_rate))
        except NoFreeSlot as err:  # reported, not decided: the session goes on without VAD
            self.spawn(self.mailbox.put(VadUnavailable(e.stream_id, str(err))), f"vad-{e.stream_id}")
            return
        self.vad_streams[e.stream_id] = stream
        self.spawn(self._pump_vad(e.stream_id, stream), f"vad-{e.stream_id}")

    async def _pump_vad(self, stream_id: int, stream: Stream[Any]) -> None:
        while True:
            try:
                async for probs in stream:
                    await self.mailbox.put(VadResult(probs, stream_id))
                return
            except WorkerFault as err:
                # The VAD worker failed (and is being restarted): reopen this session's stream.
                log.warning("VAD stream failed, reopening: %s", err)
            await asyncio.sleep(0.2)
            if self.vad_streams.get(stream_id) is not stream:
                return  # stopped meanwhile
            try:
                stream = self.gateway.workers.vad.submit(stream.request)
            except NoFreeSlot as err:  # the session decides what a lost VAD stream means
                await self.mailbox.put(VadUnavailable(stream_id, str(err)))
                return
            self.vad_streams[stream_id] = stream

    async def _respond(self, e: StartResponse) -> None:
        outcome: ResponseFinished | ResponseRefused = ResponseFinished(e.response_id, e.epoch)
        tts: Stream[Any] | None = None
        feeder: asyncio.Task[None] | None = None
        request = ChatRequest(e.messages, e.max_output_tokens, e.tools, e.tool_choice, e.temperature)
        try:
            pieces = self.gateway.responder.stream(request)
            if not e.audio:
                async for piece in pieces:
                    await self.mailbox.put(reply_event(e, piece))
            else:
                tts = self.gateway.workers.tts.submit(TtsRequest(voice=e.voice, speed=e.speed))
                feeder = asyncio.create_task(self._feed_tts(e, pieces, tts))
                async for frame in tts:
                    await self.mailbox.put(ResponseAudio(e.response_id, e.epoch, frame))
                    if not self.audio_room.is_set():
                        await self.audio_room.wait()
                await feeder  # surfaces responder errors
        except asyncio.CancelledError:
            raise
        except NoFreeSlot as err:  # refused at start (a worker never queues): the session answers it
            outcome = ResponseRefused(e.response_id, e.epoch, str(err))
        except Exception as err:  # responder or worker fault: this response fails, the session goes on
            log.warning("response %s failed: %s", e.response_id, err)
            outcome = ResponseFinished(e.response_id, e.epoch, str(err) or type(err).__name__)
        finally:
            if feeder is not None and not feeder.done():
                feeder.cancel()
            if tts is not None:
                tts.cancel()
            self.responses.pop(e.response_id, None)
        await self.mailbox.put(outcome)

    async def _feed_tts(self, e: StartResponse, pieces: AsyncIterator[ReplyPiece], tts: Stream[Any]) -> None:
        """Text goes to the voice; tool calls and usage go straight to the session."""
        try:
            async for piece in pieces:
                if isinstance(piece, str):
                    tts.push(piece)
                else:
                    await self.mailbox.put(reply_event(e, piece))
        finally:
            tts.close_input()


_DISCONNECTED = object()


def reply_event(e: StartResponse, piece: ReplyPiece) -> ResponseTextDelta | ResponseToolCall | ResponseUsage:
    """A responder's piece as the session event it becomes."""
    if isinstance(piece, ToolCallDelta):
        return ResponseToolCall(e.response_id, e.epoch, piece)
    if isinstance(piece, ChatUsage):
        return ResponseUsage(e.response_id, e.epoch, piece)
    return ResponseTextDelta(e.response_id, e.epoch, piece)


def session_limits(gateway: Gateway, model: str, key: str | None) -> Limits:
    return Limits(
        max_input_buffer_bytes=gateway.config.max_input_buffer_bytes,
        max_items=gateway.config.max_conversation_items,
        voices=gateway.voices_for(key),
        model=model,
        max_retained_items=gateway.config.max_retained_items,
        max_instructions_chars=gateway.config.max_instructions_chars,
        max_item_text_chars=gateway.config.max_item_text_chars,
        max_tools=gateway.config.max_tools,
        context_tokens=gateway.config.responder_context_tokens,
        reply_tokens=gateway.config.responder_max_tokens,
        mcp_allowed_urls=tuple(gateway.config.mcp_allowed_urls),
        mcp_approval_timeout_s=gateway.config.mcp_approval_timeout_s,
    )


def open_session(
    gateway: Gateway,
    model: str | None,
    key: str | None,
    secret: ClientSecret | None,
    extra: rt.SessionParams | None = None,
    duplex: bool = False,
    transcription: bool = False,
    seed: int | None = None,
) -> RealtimeSession:
    """A new session of ``key`` (its custom voices are the session's too), configured by the client
    secret that opened it (and ``extra``, a call's own session part), as if by ``session.update``s before
    it starts: ``session.created`` shows them. ``transcription``: a transcription session."""
    configs = [c for c in (secret and secret.session, extra) if c is not None]
    model = model or next((c.model for c in reversed(configs) if isinstance(c.model, str)), None) or "realtime-gw"
    # a transcription session only listens: it never takes a speech-to-speech model's slot
    s2s = None if transcription else binding(gateway.workers.s2s, gateway.config, model, seed, gateway.s2s_voices_of(key))
    limits = session_limits(gateway, model, key)
    session = RealtimeSession("sess_" + secrets.token_hex(8), limits, time.monotonic(), duplex, transcription, s2s)
    if s2s is not None and s2s.spec is ECHO_SPEC:  # the user's own voice comes back: it does not interrupt it
        configs.insert(0, ECHO_DEFAULTS)
    for config in configs:  # validated when minted / received: what no longer holds is said after session.created
        apply_given(session, config, time.monotonic())
    return session


async def realtime_endpoint(ws: WebSocket) -> None:
    gateway: Gateway = ws.app.state.gateway
    admission = Admission(gateway, "realtime")

    def refused(r: Refusal) -> str:
        return rt.encode_server_event(rt.error_event(r.message, code=r.code, type="server_error")).decode()

    subprotocol = "realtime" if "realtime" in auth.offered_subprotocols(ws.headers) else None
    if not await admit_socket(ws, admission, refused, subprotocol):
        return
    asked = ws.query_params.get("duplex") in ("1", "true")
    duplex = asked or ws.scope["path"].rstrip("/").endswith("/duplex")
    transcription = ws.query_params.get("intent") == "transcription"  # OpenAI's transcription sessions
    model, seed = ws.query_params.get("model"), None
    refusal: tuple[str, str, str] | None = None  # (message, param, close reason): refused at connect
    if (why := unserved_model(gateway.workers.s2s, gateway.config, model)) is not None:
        refusal = (why, "model", "model not served")
    else:
        try:
            seed = session_seed(ws.query_params.get("seed", ""))
        except ValueError as e:
            refusal = (str(e), "seed", "bad seed")
    if refusal is not None:
        admission.leave()
        await ws.send_text(rt.encode_server_event(rt.error_event(refusal[0], code="invalid_value", param=refusal[1])).decode())
        await ws.close(code=1008, reason=refusal[2])
        return
    session = open_session(
        gateway, model, admission.key, admission.secret, duplex=duplex, transcription=transcription, seed=seed
    )
    await serve_admitted(ws, admission, RealtimeConnection(ws, gateway, session))


async def serve_admitted(ws: WebSocket, admission: Admission, connection: RealtimeConnection) -> None:
    """Run an admitted connection to its end, then give its session back."""
    try:
        await connection.run()
    finally:
        admission.leave()
        if ws.client_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await ws.close()
