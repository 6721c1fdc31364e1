"""The official ``openai`` SDK drives a live gateway (Piper, pocketsphinx, Silero, echo responder)."""

from __future__ import annotations

import asyncio
import base64
import random
import time
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from realtime_gw.testing.audio import synthesize, transcribe, wer
from realtime_gw.testing.gateway import LiveServer
from tests.server.realtime_sdk_client import (
    FRAME_BYTES,
    audio_of,
    collect_until,
    connect,
    is_done,
    recv,
    text_turn,
    types,
)

SENTENCES = [
    "Please open the door for me.",
    "I would like a cup of coffee.",
    "Thank you very much for your help.",
    "My phone is on the table.",
    "We will meet at the station tomorrow morning.",
]


async def test_text_turn_speaks_the_text(voice_server: LiveServer) -> None:
    text = " ".join(SENTENCES)
    async with connect(voice_server, audio={"input": {"turn_detection": None}}) as conn:
        events = await text_turn(conn, text)
    kinds = types(events)
    for expected in (
        "conversation.item.added",
        "response.created",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.output_item.done",
        "response.done",
    ):
        assert expected in kinds, expected
    assert kinds.index("response.created") < kinds.index("response.output_audio.delta")
    assert events[-1].response.status == "completed"
    assert kinds.count("response.done") == 1

    deltas = [e for e in events if e.type == "response.output_audio.delta"]
    sizes = [len(base64.b64decode(d.delta)) for d in deltas]
    assert all(s == FRAME_BYTES for s in sizes[:-1]), "every frame but the last is exactly 80 ms"
    assert 0 < sizes[-1] <= FRAME_BYTES
    assert [d.model_extra["seq"] for d in deltas] == list(range(len(deltas)))
    assert {d.model_extra["sample_rate_hz"] for d in deltas} == {24000}

    transcript = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    done = next(e for e in events if e.type == "response.output_audio_transcript.done")
    assert transcript == done.transcript == text

    heard = transcribe(audio_of(events), 24000)
    assert wer(text, heard) <= 0.25, heard


async def _stream_audio(conn: Any, pcm: bytes, rate: int, pace: float = 0.25) -> None:
    """Append in random 40-100 ms chunks, paced at ``pace`` x real time, as a microphone would."""
    rng = random.Random(7)
    pos = 0
    bytes_per_ms = rate * 2 // 1000
    while pos < len(pcm):
        n = rng.randint(40, 100) * bytes_per_ms
        chunk = pcm[pos : pos + n]
        pos += n
        await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
        await asyncio.sleep(len(chunk) / bytes_per_ms / 1000 * pace)


def _utterance(text: str, rate: int) -> bytes:
    silence = lambda ms: b"\x00\x00" * (rate * ms // 1000)  # noqa: E731
    return silence(400) + synthesize(text, rate) + silence(1500)


async def test_audio_turn_with_server_vad(voice_server: LiveServer) -> None:
    text = "Please open the door for me."
    session = {
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 16000},
                "transcription": {"model": "pocketsphinx"},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
            }
        }
    }
    async with connect(voice_server, **session) as conn:
        sender = asyncio.create_task(_stream_audio(conn, _utterance(text, 16000), 16000))
        events = await collect_until(conn, is_done, timeout=90)
        await sender
    kinds = types(events)
    order = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.input_audio_transcription.completed",
        "response.output_audio.delta",
        "response.done",
    ]
    positions = [kinds.index(k) for k in order]
    assert positions == sorted(positions), kinds
    started = next(e for e in events if e.type == "input_audio_buffer.speech_started")
    stopped = next(e for e in events if e.type == "input_audio_buffer.speech_stopped")
    assert 200 <= started.audio_start_ms <= 600
    assert stopped.audio_end_ms > started.audio_start_ms + 800
    completed = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert completed.item_id == stopped.item_id == started.item_id
    assert wer(text, completed.transcript) <= 0.25, completed.transcript
    assert events[-1].response.status == "completed"
    echoed = next(e for e in events if e.type == "response.output_audio_transcript.done").transcript
    assert echoed.strip() == completed.transcript.strip()


async def test_audio_turn_manual_commit(voice_server: LiveServer) -> None:
    text = "Thank you very much for your help."
    session = {
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 16000},
                "transcription": {"model": "pocketsphinx"},
                "turn_detection": None,
            }
        }
    }
    async with connect(voice_server, **session) as conn:
        await _stream_audio(conn, _utterance(text, 16000), 16000, pace=0.0)
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        events = await collect_until(conn, is_done, timeout=90)
    kinds = types(events)
    assert "input_audio_buffer.speech_started" not in kinds
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.output_audio.delta")
    completed = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert wer(text, completed.transcript) <= 0.25, completed.transcript
    assert events[-1].response.status == "completed"
    assert len(audio_of(events)) > FRAME_BYTES * 5


async def test_cancel_mid_stream_stops_audio(voice_server: LiveServer) -> None:
    text = " ".join(SENTENCES * 2)
    async with connect(voice_server, audio={"input": {"turn_detection": None}}) as conn:
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        )
        await conn.response.create()
        before = await collect_until(
            conn, lambda e: e.type == "response.output_audio.delta" and e.model_extra["seq"] >= 2
        )
        await conn.response.cancel()
        rest = await collect_until(conn, is_done)
        assert rest[-1].response.status == "cancelled"
        # Nothing of that response arrives afterwards; the session still works.
        after = await text_turn(conn, "My phone is on the table.")
    response_id = rest[-1].response.id
    assert all(getattr(e, "response_id", None) != response_id for e in after), (
        "no event of the cancelled response after its response.done"
    )
    assert sum(1 for e in before + rest if e.type == "response.done") == 1
    assert after[-1].response.status == "completed"


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        ("{not json", "invalid_json", None),
        ('{"type": "bogus.event", "event_id": "evt_bad"}', "invalid_event_type", "type"),
        (
            '{"type": "input_audio_buffer.append", "audio": "@@not base64@@", "event_id": "evt_bad"}',
            "invalid_value",
            "audio",
        ),
        (
            '{"type": "input_audio_buffer.commit", "event_id": "evt_bad"}',
            "input_audio_buffer_commit_empty",
            None,
        ),
        (
            '{"type": "session.update", "event_id": "evt_bad", "session": {"type": "realtime",'
            ' "audio": {"input": {"format": {"type": "audio/opus"}}}}}',
            "invalid_value",
            "session.audio.input.format",
        ),
        (
            '{"type": "session.update", "event_id": "evt_bad", "session": {"type": "realtime",'
            ' "audio": {"output": {"voice": "nobody"}}}}',
            "invalid_value",
            "session.audio.output.voice",
        ),
        ("OVERSIZED", "input_audio_buffer_full", "audio"),
    ],
)
async def test_bad_input_gets_one_error_and_session_continues(
    voice_server: LiveServer, raw: str, code: str, param: str | None
) -> None:
    if raw == "OVERSIZED":
        # The test server bounds the input buffer at 2,000,000 bytes.
        raw = (
            '{"type": "input_audio_buffer.append", "event_id": "evt_bad", "audio": "'
            + base64.b64encode(b"\x00" * 2_100_000).decode()
            + '"}'
        )
    async with connect(voice_server, audio={"input": {"turn_detection": None}}) as conn:
        await conn.send_raw(raw)
        err = await recv(conn)
        assert err.type == "error"
        assert err.error.code == code
        assert err.error.param == param
        assert err.error.type == "invalid_request_error"
        if '"event_id"' in raw:
            assert err.error.event_id == "evt_bad"
        events = await text_turn(conn, "Thank you very much.")
    assert "error" not in types(events), "exactly one error per bad input"
    assert events[-1].response.status == "completed"


async def test_disconnect_mid_response_frees_worker_state(voice_server: LiveServer) -> None:
    models = httpx.get(voice_server.http + "/v1/models", headers={"Authorization": "Bearer test-key"})
    tts_worker = models.json()["data"][0]["tts"]
    active = lambda: voice_server.metric("realtime_gw_worker_active_requests", f'worker="{tts_worker}"')  # noqa: E731
    async with connect(voice_server, audio={"input": {"turn_detection": None}}) as conn:
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": " ".join(SENTENCES * 3)}],
            }
        )
        await conn.response.create()
        await collect_until(conn, lambda e: e.type == "response.output_audio.delta")
        assert active() >= 1
    # The context manager closed the socket mid-response.
    t0 = time.monotonic()
    while active() > 0 or voice_server.metric("realtime_gw_sessions", 'kind="realtime"') > 0:
        assert time.monotonic() - t0 < 1.0, "worker state not freed within 1 s"
        await asyncio.sleep(0.05)
    async with connect(voice_server, audio={"input": {"turn_detection": None}}) as conn:
        events = await text_turn(conn, "My phone is on the table.")
    assert events[-1].response.status == "completed"


async def test_wrong_api_key_is_refused(voice_server: LiveServer) -> None:
    client = AsyncOpenAI(base_url=voice_server.http + "/v1", api_key="wrong")
    with pytest.raises(Exception):  # noqa: B017 - the SDK surfaces the refused handshake as its own error
        async with client.realtime.connect(model="gpt-realtime") as conn:
            await recv(conn, timeout=5)
