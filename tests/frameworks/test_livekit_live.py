"""LiveKit Agents' own ``GPTLiveModel`` / ``GPTLiveSession`` (client delegation) against a live
gateway's ``/v1/live/sessions``, driven without a room the way ``AgentSession`` drives a duplex model:
the caller's audio pushed in, the model's continuous audio stream read out. Spoken input is heard and
transcribed, the answer is spoken, and LiveKit reports no error."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from livekit import rtc
from livekit.plugins.openai.realtime import GPTLiveModel

from realtime_gw.testing.audio import wer
from realtime_gw.testing.gateway import LiveServer
from tests.frameworks.scenario import RATE, speech


async def wait_for(check: Any, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_livekit_gpt_live_hears_and_answers(gateway: LiveServer) -> None:
    model = GPTLiveModel(delegation="client", api_key="unused", base_url=gateway.http + "/v1")
    session = model.session()
    errors: list[Any] = []
    finals: list[str] = []
    said: list[str] = []
    frames: list[rtc.AudioFrame] = []
    session.on("error", errors.append)
    session.on("input_audio_transcription_completed", lambda ev: ev.is_final and finals.append(ev.transcript))
    session.on("transcript_delta", lambda d: said.append(d.text))

    async def read_audio() -> None:
        async for out in session.audio_stream:
            frames.append(out.frame)

    reader = asyncio.create_task(read_audio())
    text = "Please open the door for me."
    try:
        # what AgentSession does right after creating the session: the whole configuration at once
        await session._update_session(instructions="Answer briefly.")
        chunk = RATE * 2 // 10
        pcm = b"\0" * (RATE * 2 * 4 // 10) + speech(text) + b"\0" * (RATE * 2 * 2)
        for pos in range(0, len(pcm), chunk):
            piece = pcm[pos : pos + chunk]
            session.push_audio(rtc.AudioFrame(piece, RATE, 1, len(piece) // 2))
            await asyncio.sleep(0.08)
        silence = b"\0" * chunk
        deadline = time.monotonic() + 40
        while not "".join(said).startswith("You said") or not finals:  # a live microphone goes on
            session.push_audio(rtc.AudioFrame(silence, RATE, 1, chunk // 2))
            await asyncio.sleep(0.1)
            assert time.monotonic() < deadline, (errors, finals, said)
        await wait_for(lambda: any(any(bytes(f.data)) for f in frames))
    finally:
        await asyncio.wait_for(session.aclose(), 15)
        reader.cancel()
        await asyncio.wait_for(model.aclose(), 5)
    assert errors == [], errors
    assert wer(text, finals[-1]) <= 0.25, finals
