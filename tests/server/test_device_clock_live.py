"""``--device-clock cpu`` end to end: the CPU stages (tone TTS, pocketsphinx in its child process, Silero)
share one clock and still serve two sessions speaking at once; the 80 ms deadline counters, the clock's
waits and the event loop's lag are on ``/metrics``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from realtime_gw.testing.audio import synthesize, wer
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.server.realtime_sdk_client import (
    RATE,
    audio_of,
    collect_until,
    connect,
    is_done,
    silence,
    speak,
    types,
)

STAGES = ("tts-tone", "asr-pocketsphinx", "vad-silero")


@pytest.fixture(scope="module")
def clocked_server() -> Iterator[LiveServer]:
    server = start_server(
        "--policy", "none", "--tts", "tone", "--api-key", "test-key", "--device-clock", "cpu",
        "--no-cpu-backend-spare",
        name="device-clock",
    )  # fmt: skip
    yield server
    stop_server(server)


async def one_turn(server: LiveServer, text: str, lead_ms: int) -> list[Any]:
    audio_in = {"transcription": {"model": "pocketsphinx"}, "turn_detection": {"type": "server_vad"}}
    async with connect(server, audio={"input": audio_in}) as conn:
        sender = asyncio.create_task(speak(conn, silence(lead_ms) + synthesize(text, RATE) + silence(1500)))
        events = await collect_until(conn, is_done, timeout=60)
        await sender
    return events


async def test_stages_sharing_the_cpu_clock_serve_sessions_and_count_deadlines(
    clocked_server: LiveServer,
) -> None:
    texts = ["Please open the door for me.", "We will meet at the station tomorrow morning."]
    turns = await asyncio.gather(
        *(one_turn(clocked_server, t, ms) for t, ms in zip(texts, (300, 700), strict=True))
    )
    for text, events in zip(texts, turns, strict=True):
        kinds = types(events)
        assert "input_audio_buffer.speech_stopped" in kinds, kinds
        completed = next(e for e in events if e.type.endswith("input_audio_transcription.completed"))
        assert wer(text, completed.transcript) <= 0.25, completed.transcript
        assert events[-1].response.status == "completed"
        assert len(audio_of(events)) > 0  # the tone TTS spoke the echo
    metrics = httpx.get(clocked_server.http + "/metrics").text
    for stage in STAGES:
        labels = f'device="cpu",stage="{stage}"'  # as Prometheus writes them: sorted
        assert clocked_server.metric("realtime_gw_stage_frames_total", labels) > 0, stage
        assert f"realtime_gw_stage_deadline_misses_total{{{labels}}}" in metrics, stage
        assert clocked_server.metric("realtime_gw_device_clock_wait_seconds_count", labels) > 0, stage
    assert clocked_server.metric("realtime_gw_device_clock_handoff_seconds_count", 'device="cpu"') > 0
    assert clocked_server.metric("realtime_gw_event_loop_lag_seconds_count") > 0
    assert clocked_server.metric("realtime_gw_worker_step_cpu_seconds_count", 'worker="tts-tone"') > 0
