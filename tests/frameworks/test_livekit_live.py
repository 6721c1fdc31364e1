"""LiveKit Agents' own ``GPTLiveModel`` / ``GPTLiveSession`` against a live gateway's
``/v1/live/sessions``, driven without a room the way ``AgentSession`` drives a duplex model: the
caller's audio pushed in, the model's continuous audio stream read out. With client delegation,
spoken input is heard and transcribed and the answer is spoken; with the model's defaults (Responses
delegation) and a function tool, the backend's call is run and answered as the adapter does, and
the voice speaks the result; with the speech-to-speech model named, its defaults are taken without an
error and the model talks. LiveKit reports no error."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from livekit import rtc
from livekit.agents import llm
from livekit.plugins.openai.realtime import GPTLiveModel

from realtime_gw.testing.audio import wer
from realtime_gw.testing.gateway import LiveServer
from tests.chat_server import ChatServer
from tests.frameworks.scenario import RATE, forecast, speech


@llm.function_tool
async def get_weather(city: str) -> dict[str, str]:
    """The weather forecast for a city."""
    return {"forecast": forecast(city)}


async def wait_for(check: Any, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


CHUNK = RATE * 2 // 10
"""100 ms of the microphone, pushed every 80 ms (a little ahead of real time)."""


async def speak(session: Any, pcm: bytes) -> None:
    for pos in range(0, len(pcm), CHUNK):
        piece = pcm[pos : pos + CHUNK]
        session.push_audio(rtc.AudioFrame(piece, RATE, 1, len(piece) // 2))
        await asyncio.sleep(0.08)


async def keep_listening(
    session: Any,
    done: Callable[[], object],
    why: Callable[[], object],
    each: Callable[[], Awaitable[None]] | None = None,
    timeout: float = 40.0,
) -> None:
    """A live microphone goes on (silence) until ``done()``; ``each`` runs at every push."""
    deadline = time.monotonic() + timeout
    while not done():
        session.push_audio(rtc.AudioFrame(b"\0" * CHUNK, RATE, 1, CHUNK // 2))
        await asyncio.sleep(0.1)
        if each is not None:
            await each()
        assert time.monotonic() < deadline, why()


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
        await speak(session, b"\0" * (RATE * 2 * 4 // 10) + speech(text) + b"\0" * (RATE * 2 * 2))
        await keep_listening(session, lambda: "".join(said).startswith("You said") and finals, lambda: (errors, finals, said))
        await wait_for(lambda: any(any(bytes(f.data)) for f in frames))
    finally:
        await asyncio.wait_for(session.aclose(), 15)
        reader.cancel()
        await asyncio.wait_for(model.aclose(), 5)
    assert errors == [], errors
    assert wer(text, finals[-1]) <= 0.25, finals


async def test_livekit_gpt_live_defaults_run_a_backend_function_and_speak_the_result(chat: ChatServer, gateway: LiveServer) -> None:
    model = GPTLiveModel(api_key="unused", base_url=gateway.http + "/v1")  # Responses delegation
    session = model.session()
    errors: list[Any] = []
    said: list[str] = []
    calls: list[llm.FunctionCall] = []
    frames: list[rtc.AudioFrame] = []
    session.on("error", errors.append)
    session.on("transcript_delta", lambda d: said.append(d.text))
    session.on("function_call", calls.append)

    async def read_audio() -> None:
        async for out in session.audio_stream:
            frames.append(out.frame)

    reader = asyncio.create_task(read_audio())
    answer = f"The weather service says {forecast('Paris')}."
    asked_before = len(chat.requests)
    try:
        await session._update_session(instructions="Answer briefly.", tools=[get_weather])
        await speak(session, b"\0" * (RATE * 2 * 4 // 10) + speech("What is the weather like in Paris?"))
        answered: list[bool] = []

        async def answer_the_call() -> None:  # what the agent adapter does with the backend's call
            if calls and not answered:
                result = await get_weather(**json.loads(calls[0].arguments))
                output = llm.FunctionCallOutput(name=calls[0].name, call_id=calls[0].call_id, output=json.dumps(result), is_error=False)
                await session._append_items([output])
                answered.append(True)

        await keep_listening(session, lambda: answer in "".join(said), lambda: (errors, calls, said), answer_the_call)
        await wait_for(lambda: any(any(bytes(f.data)) for f in frames))
    finally:
        await asyncio.wait_for(session.aclose(), 15)
        reader.cancel()
        await asyncio.wait_for(model.aclose(), 5)
    assert errors == [], errors
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    backend_asks = [b for b in chat.requests[asked_before:] if any(t["function"]["name"] == "get_weather" for t in b.get("tools", []))]
    assert len(backend_asks) == 2 and backend_asks[-1]["messages"][-1]["role"] == "tool"


async def test_livekit_gpt_live_defaults_on_the_speech_to_speech_model(duplex_gateway: LiveServer) -> None:
    """Its defaults (Responses delegation, a voice, instructions, the agent's tools in a session.update)
    meet a model that takes none of them: accepted, named in an info, and the model talks."""
    model = GPTLiveModel(model="moshi", api_key="unused", base_url=duplex_gateway.http + "/v1")
    session = model.session()
    errors: list[Any] = []
    said: list[str] = []
    frames: list[rtc.AudioFrame] = []
    session.on("error", errors.append)
    session.on("transcript_delta", lambda d: said.append(d.text))

    async def read_audio() -> None:
        async for out in session.audio_stream:
            frames.append(out.frame)

    reader = asyncio.create_task(read_audio())
    try:
        await session._update_session(instructions="Answer briefly.", tools=[get_weather])
        await speak(session, b"\0" * (RATE * 2 * 4 // 10) + speech("Hello, how are you?"))
        await keep_listening(session, lambda: said and any(any(bytes(f.data)) for f in frames), lambda: (errors, said))
    finally:
        await asyncio.wait_for(session.aclose(), 15)
        reader.cancel()
        await asyncio.wait_for(model.aclose(), 5)
    assert errors == [], errors
