"""The transport side of a session's listening: streamed transcriptions and turn-model questions.

It runs the session's ``StartAsr`` / ``FeedAsr`` / ``CancelAsr`` / ``AskTurn`` (and ``Transcribe``) effects against the
ASR and turn workers and posts what comes back to the session's mailbox (``TranscriptionDelta``,
``TurnVerdict``, and ``AsrUnavailable`` when no stream could be opened: the session decides). At a
commit (``Transcribe(streamed=True)``), ``end`` closes the turn's stream and returns its outcome (the
transcript, or the worker fault that failed it, as for a one-shot decode), or None when the turn has
no stream (its refusal was still on its way to the session at the commit): the caller then
transcribes the committed audio in one shot, which ``Transcribe`` always carries.

A session takes one decoder at a time, its turns in order: a turn's stream opens once the session's
previous transcription is in (the audio it hears meanwhile is kept and fed at the open; normally the
previous transcript comes within a step of its commit), and a one-shot transcription waits for the
session's earlier ones, then at most ``patience_s`` for a free decoder. So a client that commits its
next turn while the last one still decodes (audio sent faster than real time) waits for its own
backlog instead of failing for it, and as many sessions as decoders never fail for want of one (other
users of the worker, e.g. file transcriptions, may still take them first). At most
``MAX_WAITING_AUDIO_S`` of a session's audio waits so (its memory, and the decoding it is owed); a
one-shot transcription past that fails at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from realtime_gw.models.runtime import NoFreeSlot, StageWorker, Stream, WorkerFault
from realtime_gw.records.voice import AsrRequest, AsrStreamRequest, TrailingSilence, TurnRequest
from realtime_gw.sessions.events import (
    AskTurn,
    AsrUnavailable,
    CancelAsr,
    FeedAsr,
    ListenEffect,
    StartAsr,
    Transcribe,
    TranscriptionDelta,
    TranscriptionDone,
    TurnVerdict,
    unhandled,
)

log = logging.getLogger(__name__)

ASR_PATIENCE_S = 5.0  # how long a commit may wait for a free ASR decoder
MAX_WAITING_AUDIO_S = 300.0  # a session's audio in one-shot transcriptions waiting for a decoder, at most


@dataclass(eq=False)
class TurnStream:
    stream: Stream[Any]
    final: asyncio.Future[TranscriptionDone | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    """The transcript or the fault that failed it; None if the stream ended without either (cancelled)."""


class Listening:
    def __init__(
        self,
        asr: StageWorker,
        turn: StageWorker | None,
        post: Callable[[Any], Awaitable[None]],
        spawn: Callable[[Any, str], asyncio.Task[Any]],
        patience_s: float = ASR_PATIENCE_S,
    ) -> None:
        self.asr = asr
        self.patience_s = patience_s
        """How long a one-shot transcription waits for a free decoder (after the session's earlier turns)."""
        self.turn = turn
        self.post = post
        self.spawn = spawn
        self.streams: dict[str, TurnStream] = {}
        self._deferred: dict[str, list[bytes]] = {}
        """Turns whose stream opens when the session's latest transcription is in, with their audio so far."""
        self._latest: asyncio.Future[None] | None = None
        """Settles when the session's latest transcription (streamed or one-shot) has its outcome."""
        self._waiting_s = 0.0
        """Audio seconds of the one-shot transcriptions waiting for an earlier turn or for a decoder."""

    def run(self, e: ListenEffect) -> None:
        match e:
            case StartAsr():
                self._start(e)
            case FeedAsr():
                if (held := self._deferred.get(e.item_id)) is not None:
                    held.append(e.pcm)
                elif (turn := self.streams.get(e.item_id)) is not None:
                    turn.stream.push(e.pcm)
            case CancelAsr():
                self._deferred.pop(e.item_id, None)
                if (turn := self.streams.pop(e.item_id, None)) is not None:
                    turn.stream.cancel()
            case AskTurn():
                self.spawn(self._ask(e), f"turn-{e.pause_id}")
            case _:
                unhandled(e)

    def _start(self, e: StartAsr) -> None:
        latest = self._latest
        if latest is None or latest.done():
            self._open(e, [])
            return
        self._deferred[e.item_id] = []
        self.spawn(self._open_after(latest, e), f"asr-{e.item_id}")

    async def _open_after(self, latest: asyncio.Future[None], e: StartAsr) -> None:
        await asyncio.shield(latest)  # settled by its own task, whatever happens to this one
        if (backlog := self._deferred.pop(e.item_id, None)) is not None:  # not committed or cancelled since
            self._open(e, backlog)

    def _open(self, e: StartAsr, backlog: list[bytes]) -> None:
        try:
            stream = self.asr.submit(AsrStreamRequest(e.sample_rate))
        except NoFreeSlot as err:  # reported, not decided: the session says what the turn does without it
            self.spawn(self.post(AsrUnavailable(e.item_id, str(err))), f"asr-{e.item_id}")
            return
        for pcm in backlog:
            stream.push(pcm)
        turn = TurnStream(stream)
        self.streams[e.item_id] = turn
        self.spawn(self._pump(e.item_id, turn), f"asr-{e.item_id}")

    async def _pump(self, item_id: str, turn: TurnStream) -> None:
        try:
            async for result in turn.stream:
                if result.final:
                    turn.final.set_result(TranscriptionDone(item_id, result.text))
                else:
                    await self.post(TranscriptionDelta(item_id, result.text))
        except WorkerFault as err:  # fails this transcription, as a one-shot decode's fault would
            log.warning("ASR stream of %s failed: %s", item_id, err)
            turn.final.set_result(TranscriptionDone(item_id, None, str(err)))
        finally:
            if not turn.final.done():
                turn.final.set_result(None)

    async def end(self, item_id: str, silence_s: float = 0.0) -> TranscriptionDone | None:
        """The turn was committed (its audio ending in ``silence_s`` of silence): its stream's outcome
        (None: it has no stream; transcribe in one shot)."""
        self._deferred.pop(item_id, None)  # committed before its stream could open: one shot, in turn
        turn = self.streams.pop(item_id, None)
        if turn is None:
            return None
        if silence_s > 0:
            turn.stream.push(TrailingSilence(silence_s))
        turn.stream.close_input()
        try:
            return await turn.final
        finally:
            turn.stream.cancel()

    def transcribe(self, e: Transcribe) -> asyncio.Task[None]:
        """A committed turn's transcript: its stream's, or (no stream heard it) its audio in one shot,
        after the session's earlier turns. Takes its place in the session's order at once (a later
        turn's ``StartAsr`` may come before its task runs), and gives it up when its task ends, even
        cancelled before it began (later turns never wait for it)."""
        earlier, mine = self._latest, asyncio.get_running_loop().create_future()
        self._latest = mine
        task = self.spawn(self._transcribe(e, earlier, mine), f"asr-{e.item_id}")
        task.add_done_callback(lambda _: mine.done() or mine.set_result(None))
        return task

    async def _transcribe(
        self, e: Transcribe, earlier: asyncio.Future[None] | None, mine: asyncio.Future[None]
    ) -> None:
        try:
            if e.streamed and (done := await self.end(e.item_id, e.silence_s)) is not None:
                await self.post(done)
                return
            await self.post(await self._one_shot(e, earlier))
        finally:
            if not mine.done():
                mine.set_result(None)

    async def _one_shot(self, e: Transcribe, earlier: asyncio.Future[None] | None) -> TranscriptionDone:
        seconds = len(e.pcm) / 2 / e.sample_rate if e.sample_rate > 0 else 0.0
        if self._waiting_s and self._waiting_s + seconds > MAX_WAITING_AUDIO_S:
            waiting = f"{self._waiting_s:.0f} s of this session's audio already wait for decoding"
            return TranscriptionDone(e.item_id, None, f"{self.asr.name}: {waiting}")
        stream: Stream[Any] | None = None
        self._waiting_s += seconds
        try:
            if earlier is not None:
                await asyncio.shield(earlier)  # settled by its own task, whatever happens to this one
            stream = await submit_with_retry(self.asr, AsrRequest(e.pcm, e.sample_rate), self.patience_s)
        except NoFreeSlot as err:
            return TranscriptionDone(e.item_id, None, str(err))
        finally:
            self._waiting_s -= seconds
        try:
            results = await stream.collect()
            return TranscriptionDone(e.item_id, " ".join(r.text for r in results if r.text))
        except WorkerFault as err:
            return TranscriptionDone(e.item_id, None, str(err))
        finally:
            stream.cancel()

    def close(self) -> None:
        self._deferred.clear()
        for turn in self.streams.values():
            turn.stream.cancel()
        self.streams.clear()

    async def _ask(self, e: AskTurn) -> None:
        if self.turn is None:
            await self.post(TurnVerdict(e.pause_id, None, "no turn model is configured"))
            return
        try:
            [score] = await self.turn.submit(TurnRequest(e.pcm, e.sample_rate)).collect()
            verdict = TurnVerdict(e.pause_id, score.probability)
        except (NoFreeSlot, WorkerFault, ValueError) as err:
            verdict = TurnVerdict(e.pause_id, None, str(err))
        await self.post(verdict)


async def submit_with_retry(
    worker: StageWorker, request: Any, patience_s: float = ASR_PATIENCE_S
) -> Stream[Any]:
    """Utterances are short: when every decoder is busy, wait a moment for one instead of failing
    the transcription (bounded: the worker itself never queues). Woken when a request leaves the
    worker, not by polling."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return worker.submit(request)
        except NoFreeSlot:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            await worker.slot_freed(left)
