"""pipecat's own ``OpenAIRealtimeLLMService`` in a small pipecat pipeline (context aggregators, the
service, a frame recorder; no transport) against a live gateway: user turns spoken (Piper speech,
server VAD), a function tool run by pipecat, an interruption through the pipeline's own interruption
frame, and a barge-in by speech."""

from __future__ import annotations

import asyncio
import contextlib
import json

from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    ErrorFrame,
    FunctionCallResultFrame,
    InputAudioRawFrame,
    InterruptionWorkerFrame,
    LLMRunFrame,
    TTSAudioRawFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

from realtime_gw.testing.gateway import LiveServer
from tests.chat_server import ChatServer
from tests.frameworks.pipecat_parts import WEATHER, Recorder, get_weather
from tests.frameworks.scenario import (
    GREETING,
    RATE,
    check_clean_run,
    forecast,
    run_scenario,
    speak_turn,
    transcript_of,
)
from tests.frameworks.tap import RealtimeTap


class PipecatDriver:
    def __init__(self, task: PipelineTask, tap: RealtimeTap) -> None:
        self.task = task
        self.tap = tap

    async def say(self, text: str) -> None:
        # pipecat's realtime pipelines take user turns as speech (an LLMMessagesAppendFrame only
        # updates the local context), so the user speaks and server VAD ends the turn
        await speak_turn(self, self.tap, text)

    async def interrupt(self) -> None:
        # what a transport's VAD does when the user starts speaking
        await self.task.queue_frame(InterruptionWorkerFrame())

    async def send_audio(self, pcm: bytes) -> None:
        await self.task.queue_frame(InputAudioRawFrame(audio=pcm, sample_rate=RATE, num_channels=1))


async def test_pipecat_tools_interrupt_and_barge_in(chat: ChatServer, gateway: LiveServer) -> None:
    async with RealtimeTap(gateway.ws) as tap:
        session = events.SessionProperties(
            audio=events.AudioConfiguration(
                input=events.AudioInput(
                    transcription=events.InputAudioTranscription(model="gpt-4o-transcribe"),
                    turn_detection=events.TurnDetection(type="server_vad", silence_duration_ms=500),
                )
            )
        )
        llm = OpenAIRealtimeLLMService(
            api_key="unused",
            base_url=tap.url + "/v1/realtime",
            settings=OpenAIRealtimeLLMService.Settings(
                model="gpt-realtime", system_instruction="Answer briefly.", session_properties=session
            ),
        )
        llm.register_function("get_weather", get_weather)
        context = LLMContext(messages=[], tools=ToolsSchema(standard_tools=[WEATHER]))
        aggregators = LLMContextAggregatorPair(context)
        recorder = Recorder()
        task = PipelineTask(
            Pipeline([aggregators.user(), llm, recorder, aggregators.assistant()]),
            params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
            idle_timeout_secs=None,
        )
        runner = asyncio.create_task(PipelineRunner(handle_sigint=False).run(task))
        try:
            # as pipecat's examples start: the bot speaks first, which sets the conversation up
            # (context and tools) before the user's first turn
            await task.queue_frame(LLMRunFrame())
            greeted = await tap.wait_for("response.done")
            assert transcript_of(tap, tap.event(greeted)["response"]["id"]) == GREETING
            await run_scenario(PipecatDriver(task, tap), tap, chat)
            assert not runner.done(), "the pipeline is still running"
            assert llm._websocket is not None, "pipecat's connection is alive"
        finally:
            await task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
    errors = [f for f in recorder.frames if isinstance(f, ErrorFrame)]
    assert errors == [], errors
    results = [f for f in recorder.frames if isinstance(f, FunctionCallResultFrame)]
    assert [json.dumps(f.result) for f in results] == [json.dumps({"forecast": forecast("Paris")})]
    assert any(isinstance(f, TTSAudioRawFrame) for f in recorder.frames)
    check_clean_run(tap, still_open=False)
