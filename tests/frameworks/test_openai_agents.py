"""openai-agents' own realtime classes (``RealtimeRunner`` / ``RealtimeAgent``, its
``OpenAIRealtimeWebSocketModel`` underneath) against a live gateway: a function tool called and
answered, an interruption through ``session.interrupt()``, and a server-VAD barge-in by speech."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner, RealtimeSession

from realtime_gw.testing.gateway import LiveServer
from tests.chat_server import ChatServer
from tests.frameworks.scenario import check_clean_run, forecast, run_scenario
from tests.frameworks.tap import RealtimeTap


@function_tool
def get_weather(city: str) -> dict[str, str]:
    """The weather forecast for a city."""
    return {"forecast": forecast(city)}


class AgentsDriver:
    def __init__(self, session: RealtimeSession) -> None:
        self.session = session

    async def say(self, text: str) -> None:
        await self.session.send_message(text)

    async def interrupt(self) -> None:
        await self.session.interrupt()

    async def send_audio(self, pcm: bytes) -> None:
        await self.session.send_audio(pcm)


async def drain(session: RealtimeSession, seen: list[Any]) -> None:
    """The application's event loop: openai-agents runs tools while its events are consumed."""
    async for event in session:
        seen.append(event)


async def test_openai_agents_tools_interrupt_and_barge_in(chat: ChatServer, gateway: LiveServer) -> None:
    agent = RealtimeAgent(name="assistant", instructions="Answer briefly.", tools=[get_weather])
    async with RealtimeTap(gateway.ws) as tap:
        # the framework's defaults otherwise: semantic_vad with interrupt_response, its transcription model
        session = await RealtimeRunner(agent).run(
            model_config={"url": tap.url + "/v1/realtime?model=gpt-realtime", "headers": {}}
        )
        seen: list[Any] = []
        async with session:
            consumer = asyncio.create_task(drain(session, seen))
            try:
                await run_scenario(AgentsDriver(session), tap, chat)
                assert not consumer.done(), "the framework's event loop is still running"
            finally:
                consumer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await consumer
            assert [e for e in seen if e.type == "error"] == []
            assert {"tool_start", "tool_end", "audio", "audio_interrupted"} <= {e.type for e in seen}
            check_clean_run(tap)
