"""The listening part of the realtime transport reports what it could not do; the session decides."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from realtime_gw.models.runtime import NoFreeSlot, StageWorker
from realtime_gw.models.speech.asr_pocketsphinx import PocketsphinxAsrBackend
from realtime_gw.server.listen_effects import MAX_WAITING_AUDIO_S, Listening
from realtime_gw.sessions.events import AsrUnavailable, FeedAsr, StartAsr, Transcribe, TranscriptionDone
from realtime_gw.testing.audio import synthesize
from tests.models.waiting import wait_for


class _FullAsr:
    """An ASR worker with every decoder taken."""

    def submit(self, request: Any) -> Any:
        raise NoFreeSlot("asr: no free slot (4 in use)")


async def test_no_free_decoder_is_reported_to_the_session() -> None:
    posted: list[Any] = []
    tasks: list[asyncio.Task[Any]] = []

    async def post(event: Any) -> None:
        posted.append(event)

    def spawn(coro: Any, name: str) -> asyncio.Task[Any]:
        tasks.append(asyncio.create_task(coro, name=name))
        return tasks[-1]

    listening = Listening(cast(Any, _FullAsr()), None, post, spawn)
    listening.run(StartAsr("item_1", 24000))
    listening.run(FeedAsr("item_1", b"\0\0"))  # no stream: nothing to feed, nothing fails
    await asyncio.gather(*tasks)
    assert posted == [AsrUnavailable("item_1", "asr: no free slot (4 in use)")]
    assert await listening.end("item_1") is None  # a commit before the session heard: one shot



@dataclass
class OneDecoder:
    """A session's listening and what it posted to the session; the ``one_decoder`` fixture runs it on a
    real pocketsphinx worker with one decoder (patience 10 ms: well under a decode)."""

    listening: Listening = cast(Any, None)
    posted: list[Any] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    async def post(self, event: Any) -> None:
        self.posted.append(event)

    def spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        self.tasks.append(asyncio.create_task(coro, name=name))
        return self.tasks[-1]

    def outcomes(self) -> list[tuple[str, str]]:
        kinds = (AsrUnavailable, TranscriptionDone)
        return [(type(e).__name__, e.item_id) for e in self.posted if isinstance(e, kinds)]

    def done(self, item_id: str) -> TranscriptionDone:
        [done] = [e for e in self.posted if isinstance(e, TranscriptionDone) and e.item_id == item_id]
        return done


@pytest.fixture
async def one_decoder() -> AsyncIterator[OneDecoder]:
    worker = StageWorker(PocketsphinxAsrBackend(slots=1), max_batch=1)
    await worker.start(warmup=False)
    assert worker.max_active == 1  # the backend's one decoder bounds the worker
    box = OneDecoder()
    box.listening = Listening(worker, None, box.post, box.spawn, patience_s=0.01)
    yield box
    box.listening.close()
    await worker.stop()


FIRST = "The weather today is sunny and warm."
SECOND = "Please turn on the kitchen lights."


async def test_the_next_turns_stream_opens_when_the_last_transcript_is_in(one_decoder: OneDecoder) -> None:
    """The first turn's stream holds the one decoder past its commit (its audio still decoding); the next
    turn's stream waits for it, keeps the audio it hears meanwhile, and streams it once the decoder is
    free: both transcripts, in order, and no turn left without a stream."""
    box, listening = one_decoder, one_decoder.listening
    first, second = synthesize(FIRST, 16000) * 2, synthesize(SECOND, 16000)
    listening.run(StartAsr("item_1", 16000))
    listening.run(FeedAsr("item_1", first))
    listening.transcribe(Transcribe("item_1", first, 16000, streamed=True))
    listening.run(StartAsr("item_2", 16000))
    half = len(second) // 4 * 2  # on a sample boundary
    listening.run(FeedAsr("item_2", second[:half]))
    listening.run(FeedAsr("item_2", second[half:]))
    await wait_for(lambda: "item_2" in listening.streams, timeout=60.0)
    await listening.transcribe(Transcribe("item_2", second, 16000, streamed=True))
    assert box.outcomes() == [("TranscriptionDone", "item_1"), ("TranscriptionDone", "item_2")]
    assert "weather" in (box.done("item_1").text or "")
    assert "kitchen" in (box.done("item_2").text or "")


async def test_a_turn_committed_before_its_stream_opened_waits_for_the_last(one_decoder: OneDecoder) -> None:
    """Committed while the first turn still decodes: the second is decoded in one shot after it, not
    failed when the decoder is not free within the patience."""
    box, listening = one_decoder, one_decoder.listening
    first, second = synthesize(FIRST, 16000) * 2, synthesize(SECOND, 16000)
    listening.run(StartAsr("item_1", 16000))
    listening.run(FeedAsr("item_1", first))
    listening.transcribe(Transcribe("item_1", first, 16000, streamed=True))
    listening.run(StartAsr("item_2", 16000))
    listening.run(FeedAsr("item_2", second))
    listening.transcribe(Transcribe("item_2", second, 16000, streamed=True))
    await asyncio.wait_for(asyncio.gather(*box.tasks), 60.0)
    assert box.outcomes() == [("TranscriptionDone", "item_1"), ("TranscriptionDone", "item_2")]
    assert box.done("item_1").error is None and "weather" in (box.done("item_1").text or "")
    assert box.done("item_2").error is None and "kitchen" in (box.done("item_2").text or "")
    assert listening.streams == {}


async def test_audio_committed_far_faster_than_it_is_decoded_is_refused_past_a_bound() -> None:
    posted: list[Any] = []

    async def post(event: Any) -> None:
        posted.append(event)

    full = _FullAsr()
    full.name = "asr"  # type: ignore[attr-defined]
    listening = Listening(cast(Any, full), None, post, lambda c, n: asyncio.create_task(c, name=n))
    blocker: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    listening._latest = blocker  # an earlier turn still decoding
    minute = bytes(2 * 100 * 60)  # a minute at 100 Hz: the bound is in audio seconds, not bytes
    turns = int(MAX_WAITING_AUDIO_S // 60)
    commits = [Transcribe(f"item_{i}", minute, 100) for i in range(turns + 1)]
    waiting = [listening.transcribe(t) for t in commits]
    await asyncio.sleep(0.01)
    assert listening._waiting_s == turns * 60
    reason = f"asr: {turns * 60} s of this session's audio already wait for decoding"
    assert posted == [TranscriptionDone(f"item_{turns}", None, reason)]
    for t in waiting:
        t.cancel()


@pytest.mark.parametrize("flush", ["reference", "default"])
async def test_a_turns_trailing_silence_shortens_the_kyutai_flush(flush: str) -> None:
    """Server VAD committed the turn after 0.5 s of silence: the stream is told. With the reference's flush,
    the transcript of the speech and its silence is that of the speech alone (the reference's tokens, the
    same flush after the speech); by default (the delay in frames plus one after a heard pause) it is the
    start of it. Either way not that of the silence flushed again."""
    import torch

    from realtime_gw.models.speech.asr_kyutai import KyutaiAsrBackend
    from realtime_gw.models.speech.kyutai.checkpoint import random_checkpoint
    from tests.models.speech.kyutai_streams import speechlike

    ck = random_checkpoint("tiny", "cpu", torch.float32)
    flush_s = ck.timing.flush_samples / 24000 if flush == "reference" else None
    worker = StageWorker(KyutaiAsrBackend(checkpoint=ck, flush_s=flush_s), max_batch=1)
    await worker.start(warmup=False)
    box = OneDecoder()
    box.listening = Listening(worker, None, box.post, box.spawn)
    speech = speechlike(9, 8).tobytes()
    quiet = bytes(2 * 12000)
    try:
        turns = (("told", speech + quiet, 0.5), ("alone", speech, 0.0), ("untold", speech + quiet, 0.0))
        for item_id, pcm, silence_s in turns:
            box.listening.run(StartAsr(item_id, 24000))
            box.listening.run(FeedAsr(item_id, pcm))
            await box.listening.transcribe(Transcribe(item_id, pcm, 24000, streamed=True, silence_s=silence_s))
        told, alone, untold = (box.done(i).text or "" for i in ("told", "alone", "untold"))
        assert box.done("told").error is None and told
        assert told == alone if flush == "reference" else alone.startswith(told) and told != alone
        assert untold != told  # the silence flushed again: more tokens
    finally:
        box.listening.close()
        await worker.stop()
