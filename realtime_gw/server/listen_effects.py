"""The transport side of a session's listening: streamed transcriptions and turn-model questions.

It runs the session's ``StartAsr`` / ``FeedAsr`` / ``CancelAsr`` / ``AskTurn`` (and ``Transcribe``) effects against the
ASR and turn workers and posts what comes back to the session's mailbox (``TranscriptionDelta``,
``TurnVerdict``, and ``AsrUnavailable`` when no stream could be opened: the session decides). At a
commit (``Transcribe(streamed=True)``), ``end`` closes the turn's stream and returns its outcome (the
transcript, or the worker fault that failed it, as for a one-shot decode), or None when the turn has
no stream (its refusal was still on its way to the session at the commit): the caller then
transcribes the committed audio in one shot, which ``Transcribe`` always carries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from realtime_gw.models.runtime import NoFreeSlot, StageWorker, Stream, WorkerFault
from realtime_gw.records.voice import AsrRequest, AsrStreamRequest, TurnRequest
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
    ) -> None:
        self.asr = asr
        self.turn = turn
        self.post = post
        self.spawn = spawn
        self.streams: dict[str, TurnStream] = {}

    def run(self, e: ListenEffect) -> None:
        match e:
            case StartAsr():
                self._start(e)
            case FeedAsr():
                turn = self.streams.get(e.item_id)
                if turn is not None:
                    turn.stream.push(e.pcm)
            case CancelAsr():
                turn = self.streams.pop(e.item_id, None)
                if turn is not None:
                    turn.stream.cancel()
            case AskTurn():
                self.spawn(self._ask(e), f"turn-{e.pause_id}")
            case _:
                unhandled(e)

    def _start(self, e: StartAsr) -> None:
        try:
            stream = self.asr.submit(AsrStreamRequest(e.sample_rate))
        except NoFreeSlot as err:  # reported, not decided: the session says what the turn does without it
            self.spawn(self.post(AsrUnavailable(e.item_id, str(err))), f"asr-{e.item_id}")
            return
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

    async def end(self, item_id: str) -> TranscriptionDone | None:
        """The turn was committed: its stream's outcome (None: it has no stream; transcribe in one shot)."""
        turn = self.streams.pop(item_id, None)
        if turn is None:
            return None
        turn.stream.close_input()
        try:
            return await turn.final
        finally:
            turn.stream.cancel()

    async def transcribe(self, e: Transcribe) -> None:
        """A committed turn's transcript: its stream's, or (no stream heard it) its audio in one shot."""
        if e.streamed and (done := await self.end(e.item_id)) is not None:
            await self.post(done)
            return
        stream: Stream[Any] | None = None
        try:
            stream = await submit_with_retry(self.asr, AsrRequest(e.pcm, e.sample_rate))
            results = await stream.collect()
            await self.post(TranscriptionDone(e.item_id, " ".join(r.text for r in results if r.text)))
        except (NoFreeSlot, WorkerFault) as err:
            await self.post(TranscriptionDone(e.item_id, None, str(err)))
        finally:
            if stream is not None:
                stream.cancel()

    def close(self) -> None:
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
