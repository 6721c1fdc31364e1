"""LiveKit Agents' own ``livekit.plugins.openai.realtime.RealtimeModel`` / ``RealtimeSession``
against a live gateway, driven without a LiveKit room the way ``AgentSession`` drives it: tools
registered with ``update_tools``, a call's output put back with ``update_chat_ctx`` and answered with
``generate_reply``; interruptions through ``interrupt()`` + ``truncate()`` at the played position."""

from __future__ import annotations

import asyncio
import json
import time

from livekit import rtc
from livekit.agents import llm
from livekit.plugins.openai.realtime import RealtimeModel, RealtimeSession

from realtime_gw.testing.gateway import LiveServer
from tests.chat_server import ChatServer
from tests.frameworks.scenario import RATE, check_clean_run, forecast, run_scenario
from tests.frameworks.tap import RealtimeTap


@llm.function_tool
async def get_weather(city: str) -> dict[str, str]:
    """The weather forecast for a city."""
    return {"forecast": forecast(city)}


class Playback:
    """Where a speaker playing the assistant's audio in real time would be (LiveKit truncates at
    the played position, as its audio output reports it)."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self.started_at: float | None = None
        self.received_ms = 0.0

    def add(self, frame: rtc.AudioFrame) -> None:
        if self.started_at is None:
            self.started_at = time.monotonic()
        self.received_ms += frame.samples_per_channel * 1000 / frame.sample_rate

    @property
    def played_ms(self) -> int:
        if self.started_at is None:
            return 0
        return int(min((time.monotonic() - self.started_at) * 1000, self.received_ms))


class LiveKitDriver:
    """What ``AgentSession``/``AgentActivity`` does with a realtime session, minus the room."""

    def __init__(self, session: RealtimeSession) -> None:
        self.session = session
        self.playing: Playback | None = None
        self.errors: list[llm.RealtimeModelError] = []
        self.tool_outputs: list[llm.FunctionCallOutput] = []
        self.tasks: set[asyncio.Task[None]] = set()
        session.on("generation_created", self._on_generation)
        session.on("input_speech_started", self._on_speech_started)
        session.on("error", self.errors.append)

    async def say(self, text: str) -> None:
        chat_ctx = self.session.chat_ctx.copy()
        chat_ctx.add_message(role="user", content=text)
        await self.session.update_chat_ctx(chat_ctx)
        await self.session.generate_reply()

    async def interrupt(self) -> None:
        self.session.interrupt()
        self._truncate()

    async def send_audio(self, pcm: bytes) -> None:
        samples = len(pcm) // 2
        self.session.push_audio(rtc.AudioFrame(pcm, RATE, 1, samples))

    def _truncate(self) -> None:
        if self.playing is not None:
            playing, self.playing = self.playing, None
            self.session.truncate(
                message_id=playing.message_id, modalities=["audio"], audio_end_ms=playing.played_ms
            )

    def _on_speech_started(self, _: llm.InputSpeechStartedEvent) -> None:
        self._truncate()  # the server cancelled the reply itself (interrupt_response)

    def _on_generation(self, generation: llm.GenerationCreatedEvent) -> None:
        task = asyncio.get_running_loop().create_task(self._play(generation))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _play(self, generation: llm.GenerationCreatedEvent) -> None:
        async def messages() -> None:
            async for message in generation.message_stream:
                playback = self.playing = Playback(message.message_id)

                async def text(stream=message.text_stream) -> None:
                    async for _ in stream:
                        pass

                reader = asyncio.create_task(text())
                async for frame in message.audio_stream:
                    playback.add(frame)
                await reader

        async def calls() -> list[llm.FunctionCall]:
            return [call async for call in generation.function_stream]

        _, made = await asyncio.gather(messages(), calls())
        if not made:
            return
        chat_ctx = self.session.chat_ctx.copy()
        for call in made:
            result = await get_weather(**json.loads(call.arguments))
            output = llm.FunctionCallOutput(
                name=call.name, call_id=call.call_id, output=json.dumps(result), is_error=False
            )
            self.tool_outputs.append(output)
            chat_ctx.items.append(output)
        await self.session.update_chat_ctx(chat_ctx)
        await self.session.generate_reply()


async def test_livekit_tools_interrupt_and_barge_in(chat: ChatServer, gateway: LiveServer) -> None:
    async with RealtimeTap(gateway.ws) as tap:
        # LiveKit's defaults otherwise: its voice, transcription model and turn detection
        model = RealtimeModel(base_url=tap.url + "/v1", api_key="unused")
        session = model.session()
        try:
            driver = LiveKitDriver(session)
            await session.update_instructions("Answer briefly.")
            await session.update_tools([get_weather])
            await run_scenario(driver, tap, chat)
            assert not session._main_atask.done(), "LiveKit's connection task is alive"
            assert driver.errors == []
            assert [json.loads(o.output) for o in driver.tool_outputs] == [{"forecast": forecast("Paris")}]
            check_clean_run(tap)
        finally:
            await session.aclose()
            await model.aclose()
