"""Piper TTS through a real StageWorker: framing, sentence text, ASR round trip, speed, cancel."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import jiwer
import pytest

from realtime_gw.models.runtime import WorkerFault
from realtime_gw.models.speech.tts_base import FrameAssembler, SentenceBuffer
from realtime_gw.records.voice import FRAME_SAMPLES, AsrRequest, AsrResult, TtsFrame, TtsRequest

FRAME_BYTES = 2 * FRAME_SAMPLES


def check_frames(frames: list[TtsFrame]) -> bytes:
    assert frames and frames[-1].final
    assert not any(f.final for f in frames[:-1])
    assert all(len(f.pcm) == FRAME_BYTES for f in frames[:-1])
    assert len(frames[-1].pcm) < FRAME_BYTES and len(frames[-1].pcm) % 2 == 0
    return b"".join(f.pcm for f in frames)


def normalize(text: str) -> str:
    return re.sub(r"[^a-z' ]", " ", text.lower()).strip()


async def speak(worker: Any, pieces: list[str], **req: Any) -> list[TtsFrame]:
    stream = worker.submit(TtsRequest(**req))
    for p in pieces:
        stream.push(p)
    stream.close_input()
    return await stream.collect()


async def test_piper_frames_and_asr_round_trip(piper: Any, asr: Any, start_worker: Any) -> None:
    tts = await start_worker(piper)
    stt = await start_worker(asr, max_batch=2)
    # Streamed in pieces that split words and sentences, like LLM tokens.
    pieces = ["The quick brown fox ju", "mps over the lazy dog. Thank you ", "very much for your help."]
    frames = await speak(tts, pieces)
    pcm = check_frames(frames)
    assert [f.text for f in frames if f.text] == [
        "The quick brown fox jumps over the lazy dog.",
        "Thank you very much for your help.",
    ]
    assert frames[0].text  # the first sentence's audio starts in the first frame
    assert len(pcm) / 2 / 24000 > 2.0
    [result] = await stt.submit(AsrRequest(pcm=pcm, sample_rate=24000)).collect()
    assert isinstance(result, AsrResult)
    wer = jiwer.wer(normalize("".join(pieces)), normalize(result.text))
    assert wer <= 0.25, (result.text, wer)


async def test_concurrent_streams_keep_their_own_text(piper: Any, start_worker: Any) -> None:
    tts = await start_worker(piper, max_batch=8)
    texts = [["Hello there. ", "How are you?"], ["Good morning."], ["One. Two. Three."]]
    results = await asyncio.gather(*(speak(tts, t) for t in texts))
    for frames in results:
        check_frames(frames)
    assert [f.text for f in results[0] if f.text] == ["Hello there.", "How are you?"]
    assert [f.text for f in results[1] if f.text] == ["Good morning."]
    assert [f.text for f in results[2] if f.text] == ["One.", "Two.", "Three."]
    assert tts.active_count == 0


@pytest.mark.parametrize("pieces", [[], [""], ["   "], ["..."], ["?!", " ...\n"]])
async def test_text_without_audio_still_finishes(piper: Any, start_worker: Any, pieces: list[str]) -> None:
    tts = await start_worker(piper)
    frames = await asyncio.wait_for(speak(tts, pieces), 5)
    check_frames(frames)


async def test_voices(piper: Any, start_worker: Any) -> None:
    tts = await start_worker(piper)
    for voice in ("joe", "default", "alloy", "marin", "cedar", "verse"):
        assert piper.resolve_voice(voice) == "joe"
    assert check_frames(await speak(tts, ["Hi."], voice="shimmer"))
    with pytest.raises(ValueError, match="available voices: .*joe"):
        piper.open(TtsRequest(voice="nobody"))
    with pytest.raises(WorkerFault, match="unknown voice 'nobody'"):
        await speak(tts, ["Hi."], voice="nobody")
    with pytest.raises(WorkerFault, match="speed"):
        await speak(tts, ["Hi."], speed=9.0)


async def test_speed_changes_duration(piper: Any, start_worker: Any) -> None:
    tts = await start_worker(piper, max_batch=4)
    text = ["This sentence is spoken at two different speeds."]
    # Piper's durations vary by up to ~25% between renditions (sampled noise): average two of each.
    runs = await asyncio.gather(*(speak(tts, text, speed=s) for s in (1.0, 1.0, 2.0, 2.0)))
    normal, fast = (sum(len(check_frames(f)) for f in pair) for pair in (runs[:2], runs[2:]))
    assert 0.35 < fast / normal < 0.85  # measured ~0.62: length_scale 0.5 does not shrink pauses


async def test_cancel_mid_utterance_frees_state(piper: Any, start_worker: Any) -> None:
    tts = await start_worker(piper, max_backlog=8)
    stream = tts.submit(TtsRequest())
    stream.push("This is the first of many sentences. " * 20)  # ~40 s of speech if not cancelled
    it = aiter(stream)
    first = await anext(it)
    assert len(first.pcm) == FRAME_BYTES
    stream.cancel()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 1.0
    while tts.active_count and loop.time() < deadline:
        await asyncio.sleep(0.01)
    assert tts.active_count == 0


def test_sentence_buffer_splitting() -> None:
    b = SentenceBuffer()
    b.feed("Hello there.")
    assert not b.ready  # "." may be followed by more ("Hello there.com")
    b.feed(" Pi is 3.14, roughly! Is it")
    assert list(b.sentences) == ["Hello there.", "Pi is 3.14, roughly!"]
    b.feed("?\nYes\nand no")
    assert list(b.sentences)[2:] == ["Is it?", "Yes"]
    b.end()
    assert b.sentences[-1] == "and no" and b.ready
    with pytest.raises(ValueError):
        b.feed("more")
    long = SentenceBuffer(max_chars=20)
    long.feed("word " * 10)
    assert all(len(s) <= 20 for s in long.sentences) and long.sentences


def test_frame_assembler_attaches_text_where_audio_starts() -> None:
    fa = FrameAssembler(24000)  # identity rate: sample positions map 1:1
    out = fa.add("a", b"\x01\x00" * 1000)
    assert out == []  # not a full frame yet
    out = fa.add("b", b"\x02\x00" * 2000)  # "b" starts at sample 1000: inside frame 0
    assert [f.text for f in out] == ["a b"]
    out = fa.add("c", b"")  # no audio: rides on the frame where its position falls
    out += fa.add("d", b"\x03\x00" * 1000)  # starts at 3000: frame 1
    assert [f.text for f in out] == ["c d"]
    tail = fa.finish()
    assert [(len(f.pcm) // 2, f.final) for f in tail] == [(4000 - 3840, True)]


def test_deterministic_piper_speaks_a_sentence_the_same_every_time(piper: Any) -> None:
    from realtime_gw.models.speech.tts_piper import PiperTtsBackend

    steady = PiperTtsBackend(deterministic=True)
    text = "Please open the door for me."
    first = steady.synthesize(text)
    assert first and steady.synthesize(text) == first
    assert piper.synthesize(text) != piper.synthesize(text)  # the default samples anew each call
