"""``POST /v1/audio/transcriptions`` through the ``openai`` SDK against a live gateway (Piper speech in,
pocketsphinx): every response format, the streamed events, every upload format, the refusals, and a
live call's audio on time while a 2-minute file is transcribed."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from openai.types.audio import (
    Transcription,
    TranscriptionTextDeltaEvent,
    TranscriptionTextDoneEvent,
    TranscriptionVerbose,
)

from realtime_gw.testing.audio import synthesize, wer
from realtime_gw.testing.audio_files import FORMATS, encode
from realtime_gw.testing.bystander import Bystander
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.server.realtime_sdk_client import RATE, collect_until, recv, silence, speak

TEXT = "The weather today is sunny with a light breeze. I would like to book a table for two people tomorrow evening."
WER_BOUND = 0.25
"""pocketsphinx's own bound on Piper speech (tests/models/speech/test_asr_pocketsphinx.py)."""
LONG_FILE_S = float(os.environ.get("REALTIME_GW_TEST_LONG_FILE_S", "600"))
"""The long file's length in the bystander test: 10 minutes (REALTIME_GW_TEST_LONG_FILE_S=120 for a quick
run by hand). What it costs is pocketsphinx decoding it, ~0.15 CPU-s per audio second (~90 CPU-s); making
the file is ~4 s (one Piper sentence, repeated; FLAC): docs/benchmarks-log.md."""
MAX_AUDIO_S = max(150.0, LONG_FILE_S + 30)
MAX_FILE_BYTES = 3_000_000 if LONG_FILE_S <= 120 else int(LONG_FILE_S * RATE * 2)  # the long file fits


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    server = start_server(
        "--policy", "none", "--tts-deterministic", "--transcription-max-file-bytes", str(MAX_FILE_BYTES),
        "--transcription-max-audio-s", str(MAX_AUDIO_S), "--no-cpu-backend-spare", name="transcriptions",
    )  # fmt: skip
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def speech() -> bytes:
    return bytes(RATE) + synthesize(TEXT, RATE) + bytes(RATE)  # 0.5 s of silence each side


def client(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)


def wav(pcm: bytes) -> tuple[str, bytes, str]:
    return ("speech.wav", encode(pcm, RATE, "wav"), "audio/wav")


def test_every_response_format(server: LiveServer, speech: bytes) -> None:
    c = client(server)
    raw = c.audio.transcriptions.with_raw_response.create(file=wav(speech), model="whisper-1")
    plain = Transcription.model_validate_json(raw.text)  # strictly: the SDK's own parse is lenient
    assert isinstance(raw.parse(), Transcription) and raw.parse().text == plain.text
    assert wer(TEXT, plain.text) <= WER_BOUND, plain.text
    assert (
        plain.usage is not None
        and plain.usage.type == "duration"
        and abs(plain.usage.seconds - len(speech) / 2 / RATE) < 0.05
    )

    text = c.audio.transcriptions.create(file=wav(speech), model="gpt-4o-transcribe", response_format="text")
    assert isinstance(text, str) and text.strip() == plain.text

    verbose = c.audio.transcriptions.create(
        file=wav(speech), model="gpt-4o-mini-transcribe", response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )  # fmt: skip
    assert isinstance(verbose, TranscriptionVerbose)
    verbose = TranscriptionVerbose.model_validate_json(json.dumps(verbose.model_dump(exclude_unset=True)))
    assert verbose.text == plain.text and verbose.language == "english"
    assert verbose.segments and verbose.words and [w.word for w in verbose.words] == plain.text.split()
    starts = [w.start for w in verbose.words]
    assert starts == sorted(starts) and 0.4 <= starts[0] <= 0.8, starts  # the speech starts after 0.5 s
    assert all(w.start < w.end <= verbose.duration + 0.01 for w in verbose.words)

    srt = c.audio.transcriptions.create(file=wav(speech), model="whisper-1", response_format="srt")
    assert re.match(r"1\n00:00:00,000 --> 00:00:\d\d,\d{3}\n", srt), srt
    assert plain.text in srt
    vtt = c.audio.transcriptions.create(file=wav(speech), model="whisper-1", response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> ") and plain.text in vtt, vtt


def test_streamed_transcript(server: LiveServer, speech: bytes) -> None:
    events = list(
        client(server).audio.transcriptions.create(file=wav(speech), model="gpt-4o-transcribe", stream=True)
    )
    for e in events:  # strictly, as the SDK's own parse is lenient
        type(e).model_validate_json(json.dumps(e.model_dump(exclude_unset=True)))
    deltas, done = events[:-1], events[-1]
    assert len(deltas) >= 2 and all(isinstance(e, TranscriptionTextDeltaEvent) for e in deltas), events
    assert isinstance(done, TranscriptionTextDoneEvent) and done.usage is not None
    assert wer(TEXT, done.text) <= WER_BOUND, done.text
    assert wer(done.text, "".join(d.delta for d in deltas)) <= WER_BOUND
    assert done.usage.output_tokens == len(done.text.split()) and done.usage.input_tokens > 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_upload_format(server: LiveServer, speech: bytes, fmt: str) -> None:
    name = f"speech.{fmt}"
    result = client(server).audio.transcriptions.create(
        file=(name, encode(speech, RATE, fmt)), model="whisper-1"
    )
    assert wer(TEXT, result.text) <= WER_BOUND, (fmt, result.text)


def refusal(server: LiveServer, **kwargs: object) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        client(server).audio.transcriptions.create(**kwargs)  # type: ignore[call-overload]
    body = caught.value.body
    assert isinstance(body, dict) and body["message"] and body["type"] == "invalid_request_error", body
    return caught.value


def test_refusals(server: LiveServer, speech: bytes) -> None:
    too_big = refusal(server, file=("big.wav", bytes(MAX_FILE_BYTES + 1)), model="whisper-1")
    assert too_big.status_code == 413 and too_big.body["param"] == "file"  # type: ignore[index]
    long_flac = encode(bytes(2 * 8000 * int(MAX_AUDIO_S + 10)), 8000, "flac")  # silence compresses to little
    too_long = refusal(server, file=("long.flac", long_flac), model="whisper-1")
    assert too_long.status_code == 400 and "transcription_max_audio_s" in too_long.message
    not_audio = refusal(
        server, file=("notes.mp3", b"these are not the bytes of an mp3 " * 40), model="whisper-1"
    )
    assert not_audio.status_code == 400 and not_audio.body["param"] == "file"  # type: ignore[index]
    fmt = refusal(server, file=wav(speech[:4800]), model="whisper-1", response_format="diarized_json")
    assert fmt.status_code == 400 and fmt.body["param"] == "response_format"  # type: ignore[index]
    model = refusal(server, file=wav(speech[:4800]), model="no-such-model")
    assert model.status_code == 400 and model.body["param"] == "model"  # type: ignore[index]
    words = refusal(server, file=wav(speech[:4800]), model="whisper-1", timestamp_granularities=["word"])
    assert words.body["param"] == "timestamp_granularities"  # type: ignore[index]  # needs verbose_json
    logprobs = refusal(server, file=wav(speech[:4800]), model="gpt-4o-transcribe", include=["logprobs"])
    assert logprobs.body["param"] == "include"  # type: ignore[index]
    language = refusal(server, file=wav(speech[:4800]), model="whisper-1", language="de")
    assert language.body["param"] == "language"  # type: ignore[index]
    assert httpx.get(server.http + "/readyz").status_code == 200


def test_a_client_that_leaves_cancels_its_transcription(server: LiveServer, speech: bytes) -> None:
    data = encode(speech * 12, RATE, "flac")  # ~80 s: half a minute of decoding here
    active = 'worker="asr-pocketsphinx"'
    with httpx.Client() as h, pytest.raises(httpx.ReadTimeout):
        h.post(
            server.http + "/v1/audio/transcriptions", files={"file": ("long.flac", data)},
            data={"model": "whisper-1"}, timeout=httpx.Timeout(30.0, read=8.0),
        )  # fmt: skip
    # the client leaves 8 s in: its upload read and decoded (seconds on a loaded box), its audio well into
    # the half minute of decoding
    assert server.metric("realtime_gw_worker_active_requests", active) >= 1  # still at it as the client left
    deadline = time.monotonic() + 10
    while server.metric("realtime_gw_worker_active_requests", active) > 0:
        assert time.monotonic() < deadline, "the abandoned transcription still holds its ASR stream"
        time.sleep(0.2)


@pytest.mark.timeout(900)  # ~100 s on a quiet 2-core box; a busy one (load 8-12) took 490 s
async def test_live_call_stays_on_time_while_a_long_file_is_transcribed(server: LiveServer) -> None:
    """A long file (``LONG_FILE_S``: the same sentence over and over, with pauses) transcribed while a
    bystander holds realtime text->audio turns: its audio frames stay on time (the bounds of
    test_isolation)."""
    sentence = synthesize(TEXT, RATE) + bytes(RATE)
    long = sentence * int(LONG_FILE_S * RATE * 2 / len(sentence) + 1)
    data = encode(long, RATE, "flac")
    async with Bystander(server.port) as alone:
        await asyncio.sleep(4)
    async with Bystander(server.port) as busy:
        api = AsyncOpenAI(
            base_url=server.http + "/v1", api_key="unused", max_retries=0, timeout=max(300.0, 2 * LONG_FILE_S)
        )
        result = await api.audio.transcriptions.create(
            file=("long.flac", io.BytesIO(data)), model="whisper-1"
        )
    base, hit = alone.report.summary(), busy.report.summary()
    assert hit["errors"] == 0 and hit["frames"] >= 1, hit
    assert hit["late_max_ms"] <= base["late_max_ms"] + 100, (base, hit)
    assert wer(" ".join([TEXT] * (result.text.count("weather") or 1)), result.text) <= WER_BOUND, result.text
    assert result.text.count("weather") >= 0.8 * (len(long) // len(sentence))


async def test_a_realtime_transcription_session(server: LiveServer) -> None:
    """``?intent=transcription`` through the SDK: VAD events, transcript deltas before
    ``speech_stopped``, the completed transcript, and no response."""
    text = "I would like to book a table for two people tomorrow evening."
    api = AsyncOpenAI(base_url=server.http + "/v1", api_key="unused")
    async with api.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        created = await recv(conn)
        assert created.type == "session.created" and created.session.type == "transcription"
        await conn.session.update(
            session={"type": "transcription", "audio": {"input": {"noise_reduction": {"type": "near_field"}}}}
        )
        updated = await recv(conn)
        assert updated.type == "session.updated" and updated.session.type == "transcription", updated
        sender = asyncio.create_task(speak(conn, silence(300) + synthesize(text, RATE) + silence(1200)))
        events = await collect_until(conn, lambda e: e.type.endswith("input_audio_transcription.completed"))
        await sender
        await asyncio.sleep(0.5)  # a response, were one started, would have begun by now
        await conn.send({"type": "input_audio_buffer.clear"})
        events.append(await recv(conn))
    names = [e.type for e in events]
    assert names[-1] == "input_audio_buffer.cleared", names  # nothing came between
    assert not [n for n in names if n.startswith("response.")], names
    first_delta = names.index("conversation.item.input_audio_transcription.delta")
    assert (
        names.index("input_audio_buffer.speech_started")
        < first_delta
        < names.index("input_audio_buffer.speech_stopped")
    )
    completed = next(e for e in events if e.type.endswith("input_audio_transcription.completed"))
    assert wer(text, completed.transcript) <= WER_BOUND, completed.transcript
