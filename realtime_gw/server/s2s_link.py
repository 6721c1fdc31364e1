"""The transport side of a session bound to a speech-to-speech model: its stream on that stage.

Which sessions are bound (``binding``): those whose model name is the stage's model
(``S2sSpec.model``) or the family the gateway serves it as (``--s2s``, e.g. ``moshi``); a name of a
speech-to-speech family that this gateway does not serve is refused at connect (``unserved_model``).

``S2sLink`` runs the session's ``S2sEffect``s: ``OpenS2s`` submits the stream (it holds a slot until
the session ends) and reports ``S2sOpened``, or ``S2sRefused`` when the stage is full (the worker never
queues: the session refuses itself at once); ``S2sAudio`` and ``S2sSilence`` are pushed to the stream
as they are (the stage steps every conversation on its own 80 ms clock, ``models/lockstep.py``). A pump
posts each of the model's steps (``S2sFrame``) to the session's mailbox, waiting while the client's
outbox is over its audio high-water (as the TTS pump does) but at most ``AUDIO_ROOM_WAIT_S``: the model runs on real time whatever the client reads, so a client that stops
reading meets the outbox's own bound instead of a backlog growing here; a worker fault, or the stream
ending under a session that did not end it, is ``S2sFailed``. The connection cancels the stream when it ends, which frees the slot.

A prompt (persona, voice) is checked against the stage before its stream is submitted (the stage's
``admit``: PersonaPlex counts the persona's tokens and the voice's frames): one that does not fit is
``S2sRefused(prompt=True)``. A re-open (``OpenS2s(reopen=True)``: a new prompt) that fits ends the old
stream and submits the new one; the old one's slot frees at the stage's next step, so a full stage is
waited on for ``REOPEN_WAIT_S`` (another session may take the slot first: then ``S2sRefused``).

A stage served by Ray actors (``remote_stages = "s2s"``, ``models/remote``) answers the same way, one round
trip later: the actor checks the prompt (it holds the tokenizer and the voice store), and the session hears
``S2sOpened`` once a replica holds its conversation, or ``S2sRefused`` when none has a slot
(``RemoteStage.open_stream``), never a stream that fails later.

``gateway-echo`` (``ECHO_MODEL``) is a diagnostic model every gateway serves, with no stage: its
stream (``EchoStream``) answers each 20 ms step of the user's audio with that same audio, so a reply
is what the user said, back through the session's normal output path (a response opens on the first
loud step and ends after ``s2s_reply_end_ms`` of quiet). A user checks their audio path with it; the
transport floor benchmark measures the transports with it (no VAD, ASR, model or TTS in the loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from realtime_gw.config import GatewayConfig
from realtime_gw.models.families import FAMILIES
from realtime_gw.models.remote.client import RemoteStage
from realtime_gw.models.runtime import NoFreeSlot, StageWorker, Stream, WorkerFault
from realtime_gw.protocols import audio
from realtime_gw.protocols import realtime as rt
from realtime_gw.records.s2s import S2sAudio, S2sFrame, S2sOpen, S2sSilence, S2sSpec, VoiceCodes
from realtime_gw.sessions.events import OpenS2s, S2sEffect, S2sFailed, S2sOpened, S2sRefused, unhandled
from realtime_gw.sessions.live_s2s import DuplexModels
from realtime_gw.sessions.s2s import ReplyRule, S2sBinding

log = logging.getLogger(__name__)

S2S_FAMILIES = frozenset(f.name for f in FAMILIES if f.role == "s2s")
ECHO_MODEL = "gateway-echo"
ECHO_SPEC = S2sSpec(model=ECHO_MODEL, frame_ms=20, native_rate=24000, capabilities=("audio_in", "audio_out"))
ECHO_BACKLOG_STEPS = 250
"""Echoed steps a session has not taken (5 s): past it the oldest go (the session is stuck anyway)."""
ECHO_DEFAULTS = rt.SessionParams(
    audio=rt.AudioConfig(input=rt.AudioInputConfig(turn_detection=rt.ServerVad(interrupt_response=False)))
)
"""Where a ``gateway-echo`` session starts (a ``session.update`` may change it): server VAD still
commits and transcribes the user's turns, but the echo of what they say does not interrupt itself."""
REOPEN_WAIT_S = 2.0
"""How long a re-open waits for the slot its old stream frees (it frees at the stage's next step)."""
AUDIO_ROOM_WAIT_S = 2.0
"""How long the pump holds the model's steps for a client whose outbox is over its audio high-water."""
OPEN_ANSWER_S = 5.0
"""How long an open on a stage served by Ray actors waits for a replica's answer (one that hangs) before
the session is refused as by a full stage."""


def binding(
    worker: StageWorker | None,
    config: GatewayConfig,
    model: str | None,
    seed: int | None = None,
    own_voices: Callable[[str], Mapping[str, VoiceCodes | str]] | None = None,
) -> S2sBinding | None:
    """The stage a session of ``model`` is bound to (with the model's sampling ``seed``, and the custom
    voices of that model ``own_voices`` gives, by the stage's model name, looked up live: ``OwnVoices``),
    or None (a cascaded session)."""
    rule = ReplyRule(config.s2s_reply_end_ms, config.s2s_silence_dbfs)
    if model == ECHO_MODEL:
        return S2sBinding(ECHO_SPEC, rule, seed)
    spec = worker.describe().s2s if worker is not None else None
    if spec is None or model not in (spec.model, config.s2s):
        return None
    if own_voices is None:
        return S2sBinding(spec, rule, seed)
    return S2sBinding(spec, rule, seed, functools.partial(own_voices, spec.model))


class EchoStream:
    """The ``gateway-echo`` model's stream: each step of the user's audio comes back as the model's
    step (quiet ones as padding, so they open no response); forced silent, it says silence."""

    def __init__(self, silence_dbfs: float) -> None:
        self.silence_dbfs = silence_dbfs
        self.silent = False
        self.steps = 0
        self.cancelled = False
        self._out: asyncio.Queue[S2sFrame | None] = asyncio.Queue(ECHO_BACKLOG_STEPS)

    def push(self, item: S2sAudio | S2sSilence) -> None:
        if isinstance(item, S2sSilence):
            self.silent = item.silent
            return
        pcm = bytes(len(item.pcm)) if self.silent else item.pcm
        quiet = audio.level_dbfs(pcm) <= self.silence_dbfs
        frame = S2sFrame(index=self.steps, pcm=pcm, text="", text_token=0, padding=quiet)
        self.steps += 1
        if self._out.full():
            self._out.get_nowait()
        self._out.put_nowait(frame)

    def cancel(self) -> None:
        self.cancelled = True
        if self._out.full():
            self._out.get_nowait()
        self._out.put_nowait(None)

    async def __aiter__(self) -> AsyncIterator[S2sFrame]:
        while (frame := await self._out.get()) is not None:
            yield frame


def session_seed(raw: str) -> int | None:
    """A session's ``?seed=`` (its speech-to-speech model's sampling seed): None when absent; ValueError
    unless a non-negative integer of at most 10 digits (taken mod 2^32)."""
    if raw == "":
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 10):
        raise ValueError("seed must be a non-negative integer")
    return int(raw) & 0xFFFFFFFF


def prompt_refusal(worker: StageWorker | None, request: S2sOpen) -> str | None:
    """Why the stage cannot open ``request``'s prompt (persona, voice; its ``admit`` counts them), or None."""
    admit = getattr(worker, "admit", None)
    return admit(request) if admit is not None else None


async def checked_prompt(worker: StageWorker | RemoteStage | None, request: S2sOpen) -> str | None:
    """``prompt_refusal``, also of a stage served by Ray actors (the actor checks: one round trip)."""
    if isinstance(worker, RemoteStage):
        return await worker.check(request)
    return prompt_refusal(worker, request)


def unserved_model(worker: StageWorker | None, config: GatewayConfig, model: str | None) -> str | None:
    """Why a session of ``model`` cannot be served: a speech-to-speech family this gateway was not
    started with (None: it can)."""
    if model not in S2S_FAMILIES or binding(worker, config, model) is not None:
        return None
    return f"Model '{model}' is a speech-to-speech model this gateway does not serve (start it with --s2s {model})"


def duplex_models(
    worker: StageWorker | None, config: GatewayConfig, own_voices: Callable[[str], Mapping[str, VoiceCodes | str]] | None = None
) -> DuplexModels:
    """What a GPT-Live ``session.start`` may name: the stage's model (by the names ``binding`` takes,
    with the key's ``own_voices`` of it), and the speech-to-speech families this gateway does not serve."""
    spec = worker.describe().s2s if worker is not None else None
    if spec is None:
        return DuplexModels(unserved=S2S_FAMILIES)
    names = frozenset({spec.model, config.s2s})
    return DuplexModels(binding(worker, config, spec.model, own_voices=own_voices), names, S2S_FAMILIES - names)


class S2sLink:
    def __init__(
        self,
        worker: StageWorker | None,
        post: Callable[[Any], Awaitable[None]],
        post_now: Callable[[Any], None],
        spawn: Callable[[Any, str], asyncio.Task[Any]],
        audio_room: asyncio.Event,
        silence_dbfs: float,
    ) -> None:
        self.worker = worker
        self.silence_dbfs = silence_dbfs
        """Where a ``gateway-echo`` session's echoed steps count as quiet (padding)."""
        self.post = post
        self.post_now = post_now
        """Posts at once (the opening's answer goes before anything the client sends)."""
        self.spawn = spawn
        self.audio_room = audio_room
        self.stream: Stream[Any] | EchoStream | None = None
        self.closed = False

    def run(self, e: S2sEffect) -> None:
        match e:
            case OpenS2s():
                self._open(e)
            case S2sAudio() | S2sSilence():
                if self.stream is not None:
                    self.stream.push(e)
            case _:
                unhandled(e)

    def _open(self, e: OpenS2s) -> None:
        if e.model == ECHO_MODEL:  # served here, with no stage
            self.stream = EchoStream(self.silence_dbfs)
            self.post_now(S2sOpened())
            self.spawn(self._pump(self.stream), "s2s-echo")
            return
        if self.worker is None:  # the stage went away: never bound in the first place
            self.post_now(S2sRefused("no speech-to-speech stage"))
            return
        if isinstance(self.worker, RemoteStage):  # its answers come over the wire
            self.spawn(self._open_remote(e, self.worker), "s2s-open")
            return
        if (why := prompt_refusal(self.worker, e.request)) is not None:
            self.post_now(S2sRefused(why, prompt=True))  # a stream that is open goes on
            return
        if e.reopen and self.stream is not None:
            old, self.stream = self.stream, None
            old.cancel()  # its pump stops: it is no longer the session's stream
            self.spawn(self._open_stream(e, REOPEN_WAIT_S), "s2s-reopen")
            return
        try:
            self.stream = self.worker.submit(e.request)
        except NoFreeSlot as err:  # reported, not decided: the session refuses itself
            self.post_now(S2sRefused(str(err)))
            return
        self.post_now(S2sOpened())
        self.spawn(self._pump(self.stream), "s2s")

    async def _open_remote(self, e: OpenS2s, stage: RemoteStage) -> None:
        """``_open`` on a stage served by Ray actors (``remote_stages``), answered as a local stage's: the
        prompt is checked by the actor (it holds the tokenizer and the voice store), and the session is
        told "open" once a replica holds its conversation, or "full" (``S2sRefused``) when none has a
        slot, never a stream that fails later. Each answer is one round trip to the actor."""
        if (why := await checked_prompt(stage, e.request)) is not None:
            await self.post(S2sRefused(why, prompt=True))  # a stream that is open goes on
            return
        reopen = e.reopen and self.stream is not None
        if reopen and self.stream is not None:
            old, self.stream = self.stream, None
            old.cancel()
        await self._open_stream(e, REOPEN_WAIT_S if reopen else 0.0)

    async def _submit(self, request: S2sOpen) -> Stream[Any]:
        """The request's stream, holding a slot (``NoFreeSlot``: none is free)."""
        assert self.worker is not None
        if isinstance(self.worker, RemoteStage):
            try:
                return await asyncio.wait_for(self.worker.open_stream(request), OPEN_ANSWER_S)
            except asyncio.TimeoutError:  # the stream it submitted is cancelled with the wait
                raise NoFreeSlot(f"{self.worker.name}: no replica answered within {OPEN_ANSWER_S:g} s") from None
        return self.worker.submit(request)

    async def _open_stream(self, e: OpenS2s, wait_s: float) -> None:
        """The stream, waiting up to ``wait_s`` for a slot (a re-open: the one its old stream frees at
        the stage's next step), then ``S2sOpened``, or ``S2sRefused`` when none came."""
        assert self.worker is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while not self.closed:
            try:
                stream = await self._submit(e.request)
            except NoFreeSlot as err:
                left = deadline - loop.time()
                if left <= 0:
                    await self.post(S2sRefused(str(err)))
                    return
                await self.worker.slot_freed(left)
                continue
            if self.closed:
                stream.cancel()
                return
            self.stream = stream
            await self.post(S2sOpened())
            self.spawn(self._pump(self.stream), "s2s")
            return

    async def _pump(self, stream: Stream[Any] | EchoStream) -> None:
        try:
            async for frame in stream:
                if stream is not self.stream:  # re-opened with a new prompt: this one is over
                    return
                await self.post(frame)
                if not self.audio_room.is_set():
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.audio_room.wait(), AUDIO_ROOM_WAIT_S)
        except WorkerFault as err:
            log.warning("speech-to-speech stream failed: %s", err)
            await self.post(S2sFailed(str(err)))
            return
        if not self.closed and stream is self.stream:  # the worker stopped it (a shutdown): the model is gone
            await self.post(S2sFailed("the speech-to-speech stream ended"))

    def close(self) -> None:
        self.closed = True
        if self.stream is not None:
            self.stream.cancel()
