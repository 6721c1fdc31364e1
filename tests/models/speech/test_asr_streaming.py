"""Streaming pocketsphinx: words while the audio arrives, the same transcript as a one-shot decode,
streams that join and leave without disturbing each other, slots given back."""

from __future__ import annotations

from typing import Any

import pytest

from realtime_gw.models.runtime import END_OF_INPUT, NoFreeSlot
from realtime_gw.protocols.audio import resample
from realtime_gw.records.voice import AsrRequest, AsrResult, AsrStreamRequest, TrailingSilence
from realtime_gw.testing.audio import wer


def chunks(pcm: bytes, rate: int, ms: int) -> list[bytes]:
    n = 2 * rate * ms // 1000
    return [pcm[i : i + n] for i in range(0, len(pcm), n)]


def decode_stream(asr: Any, pcm: bytes, rate: int, chunk_ms: int, tail: tuple[Any, ...] = ()) -> list[AsrResult]:
    """Drive the backend directly, one step per pushed chunk, then ``tail`` and END_OF_INPUT (and steps
    while it has work, as the worker does)."""
    state = asr.open(AsrStreamRequest(sample_rate=rate))
    outputs: list[AsrResult] = []
    try:
        for chunk in chunks(pcm, rate, chunk_ms):
            result = asr.step([(state, [chunk])])[0]
            assert not result.done and result.error is None
            outputs += result.outputs
        [result] = asr.step([(state, [*tail, END_OF_INPUT])])
        while not result.done:  # a stream behind by over a second catches up over several steps
            assert result.error is None and asr.has_work(state)
            outputs += result.outputs
            [result] = asr.step([(state, [])])
        assert result.error is None
        return outputs + result.outputs
    finally:
        asr.release(state)


def one_shot(asr: Any, pcm: bytes, rate: int) -> str:
    state = asr.open(AsrRequest(pcm=pcm, sample_rate=rate))
    try:
        [result] = asr.step([(state, [])])
    finally:
        asr.release(state)
    return str(result.outputs[0].text)


@pytest.mark.parametrize("rate", [24000, 16000])
def test_streaming_decode_equals_the_whole_utterance_decode(
    asr: Any, speech_24k: bytes, speech_text: str, rate: int
) -> None:
    """Pushed in 20 ms or 100 ms chunks, one step each, the words are those of the same utterance
    pushed whole; partial hypotheses arrive while the audio does; the one-shot (batch CMN) decode
    is as accurate."""
    pcm = resample(speech_24k, 24000, rate)
    whole = decode_stream(asr, pcm, rate, 60_000)[-1]
    assert whole.final
    for chunk_ms in (20, 100):
        *partials, final = decode_stream(asr, pcm, rate, chunk_ms)
        assert final.final and final.text == whole.text
        assert len(partials) >= 3 and all(not p.final for p in partials), partials
        first_word = final.text.split()[0]
        assert first_word in partials[len(partials) // 2].text.split()
    assert wer(speech_text, whole.text) <= 0.25
    assert wer(speech_text, one_shot(asr, pcm, rate)) <= 0.25
    told = decode_stream(asr, pcm, rate, 100, tail=(TrailingSilence(0.5),))[-1]
    assert told.text == whole.text  # no text lag to flush: the trailing silence changes nothing


async def test_streams_joining_and_leaving_mid_utterance(
    asr: Any, start_worker: Any, speech_24k: bytes
) -> None:
    """A second utterance joins halfway through the first, a third is cancelled mid-way: the
    transcripts are each utterance's own, as decoded alone."""
    worker = await start_worker(asr, max_batch=asr.slots, max_active=asr.slots)
    first = speech_24k
    second = speech_24k[: 2 * 24000 * 2]  # the first 2 s: "the weather today is sunny"
    alone = [decode_stream(asr, u, 24000, 60_000)[-1].text for u in (first, second)]
    a = worker.submit(AsrStreamRequest(24000))
    parts = chunks(first, 24000, 40)
    half = len(parts) // 2
    for p in parts[:half]:
        a.push(p)
    b = worker.submit(AsrStreamRequest(24000))
    for i, p in enumerate(parts[half:]):
        a.push(p)
        if i < len(chunks(second, 24000, 40)):
            b.push(chunks(second, 24000, 40)[i])
    a.close_input()
    b_rest = chunks(second, 24000, 40)[len(parts) - half :]
    for p in b_rest:
        b.push(p)
    b.close_input()
    results_a, results_b = await a.collect(), await b.collect()
    assert [results_a[-1].text, results_b[-1].text] == alone
    assert results_a[-1].final and results_b[-1].final

    c = worker.submit(AsrStreamRequest(24000))
    for p in parts[:half]:
        c.push(p)
    c.cancel()
    d = worker.submit(AsrStreamRequest(24000))
    for p in chunks(second, 24000, 40):
        d.push(p)
    d.close_input()
    assert (await d.collect())[-1].text == alone[1]


async def test_cancel_frees_the_decoder_and_a_full_pool_refuses(
    asr: Any, start_worker: Any, speech_24k: bytes
) -> None:
    worker = await start_worker(asr, max_batch=asr.slots, max_active=asr.slots)
    streams = [worker.submit(AsrStreamRequest(24000)) for _ in range(asr.slots)]
    with pytest.raises(NoFreeSlot):
        worker.submit(AsrStreamRequest(24000))
    for s in streams:
        s.push(speech_24k[: 2 * 24000])
    while asr.free_slots:  # every stream holds its decoder once opened
        await _next_iteration(worker)
    for s in streams:
        s.cancel()
    while asr.free_slots < asr.slots:
        await _next_iteration(worker)
    # The backend refuses too when its decoders are all taken.
    states = [asr.open(AsrStreamRequest(16000)) for _ in range(asr.slots)]
    with pytest.raises(NoFreeSlot):
        asr.open(AsrStreamRequest(16000))
    for st in states:
        asr.release(st)
    assert asr.free_slots == asr.slots


def test_bad_stream_input_fails_that_stream_only(asr: Any) -> None:
    state = asr.open(AsrStreamRequest(16000))
    try:
        [odd] = asr.step([(state, [b"\x00"])])
        assert odd.done and odd.error is not None and "even number" in odd.error
    finally:
        asr.release(state)
    assert asr.free_slots == asr.slots
    assert decode_stream(asr, bytes(3200), 16000, 100)[-1].text == ""  # 100 ms of silence: no words


async def _next_iteration(worker: Any) -> None:
    import asyncio

    await asyncio.sleep(0.01)


def test_warmup_gives_back_the_slots_it_took_when_one_is_busy() -> None:
    from realtime_gw.models.speech.asr_pocketsphinx import PocketsphinxAsrBackend

    asr = PocketsphinxAsrBackend(slots=2)
    held = asr.open(AsrStreamRequest(sample_rate=16000))
    with pytest.raises(NoFreeSlot):
        asr.warmup()  # one slot is busy: warm-up cannot take them all
    asr.release(held)
    both = [asr.open(AsrStreamRequest(sample_rate=16000)) for _ in range(2)]  # nothing leaked
    for s in both:
        asr.release(s)
