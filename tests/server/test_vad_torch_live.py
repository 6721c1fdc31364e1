"""``--vad-device cpu`` end to end: the torch Silero stage (the one ``--vad-device cuda`` runs on a GPU)
ends server-VAD turns of two sessions speaking at once, through the openai SDK against a live gateway."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest

from realtime_gw.testing.audio import synthesize, wer
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.server.realtime_sdk_client import collect_until, connect, is_done, types

RATE = 16000
CHUNK_MS = 80


@pytest.fixture(scope="module")
def torch_vad_server() -> Iterator[LiveServer]:
    server = start_server(
        "--policy", "none", "--tts", "tone", "--api-key", "test-key", "--vad-device", "cpu",
        "--vad-max-batch", "4", "--no-cpu-backend-spare", name="vad-torch",
    )  # fmt: skip
    yield server
    stop_server(server)


async def speak(conn: Any, pcm: bytes) -> None:
    """Append ``pcm`` in 80 ms chunks at twice real time (no drift however long the appends take)."""
    n = RATE * 2 * CHUNK_MS // 1000
    start = time.monotonic()
    for i in range(0, len(pcm), n):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + n]).decode())
        await asyncio.sleep(max(0.0, start + (i + n) / (RATE * 2) / 2 - time.monotonic()))


async def one_turn(server: LiveServer, text: str, lead_ms: int) -> list[Any]:
    session = {
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": RATE},
                "transcription": {"model": "pocketsphinx"},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
            }
        }
    }
    silence = lambda ms: bytes(RATE * 2 * ms // 1000)  # noqa: E731
    async with connect(server, **session) as conn:
        sender = asyncio.create_task(speak(conn, silence(lead_ms) + synthesize(text, RATE) + silence(1500)))
        events = await collect_until(conn, is_done, timeout=90)
        await sender
    return events


async def test_server_vad_turns_on_the_torch_vad(torch_vad_server: LiveServer) -> None:
    texts = ["Please open the door for me.", "We will meet at the station tomorrow morning."]
    leads = [400, 900]  # the sessions' speech starts (and ends) at different times
    steps_before = torch_vad_server.metric(
        "realtime_gw_worker_step_seconds_count", 'worker="vad-silero-torch"'
    )
    turns = await asyncio.gather(
        *(one_turn(torch_vad_server, t, ms) for t, ms in zip(texts, leads, strict=True))
    )
    for text, lead_ms, events in zip(texts, leads, turns, strict=True):
        kinds = types(events)
        order = [
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "conversation.item.input_audio_transcription.completed",
            "response.done",
        ]
        assert all(k in kinds for k in order), kinds
        positions = [kinds.index(k) for k in order]
        assert positions == sorted(positions), kinds
        started = next(e for e in events if e.type == "input_audio_buffer.speech_started")
        stopped = next(e for e in events if e.type == "input_audio_buffer.speech_stopped")
        assert lead_ms - 300 <= started.audio_start_ms <= lead_ms + 200, started  # prefix padding: 300 ms
        assert stopped.audio_end_ms > started.audio_start_ms + 1000
        completed = next(e for e in events if e.type.endswith("input_audio_transcription.completed"))
        assert wer(text, completed.transcript) <= 0.25, (
            completed.transcript
        )  # the turn holds the whole utterance
        assert events[-1].response.status == "completed"
    steps = torch_vad_server.metric("realtime_gw_worker_step_seconds_count", 'worker="vad-silero-torch"')
    assert steps > steps_before  # the torch stage did the VAD
