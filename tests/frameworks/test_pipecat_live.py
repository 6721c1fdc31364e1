"""pipecat's own ``OpenAILiveLLMService`` (GPT-Live) in a small pipecat pipeline (context aggregators,
the service, a frame recorder; no transport) against a live gateway's ``/v1/live/sessions``: the
session starts from the pipeline's context, spoken input (Piper speech) is heard and transcribed,
the voice answers aloud, and pipecat sees no error. With Responses delegation and a registered
function, the voice hands the weather to the backend model, pipecat runs the function the backend
calls, and the voice speaks the backend's answer. On the speech-to-speech model, what pipecat sends with
every start (instructions, its delegation, an opening instruction as commentary) is taken without an
error and the model talks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    ErrorFrame,
    FunctionCallResultFrame,
    InputAudioRawFrame,
    LLMRunFrame,
    LLMTextFrame,
    SpeechOutputAudioRawFrame,
    TranscriptionFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.openai.live.llm import OpenAILiveLLMService
from pipecat.services.openai.responses.llm import OpenAIResponsesLLMService

from realtime_gw.testing.audio import wer
from realtime_gw.testing.gateway import LiveServer
from tests.chat_server import ChatServer
from tests.frameworks.pipecat_parts import WEATHER, Recorder, get_weather
from tests.frameworks.scenario import RATE, forecast, speech


async def wait_for(check: object, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def pipeline(llm: OpenAILiveLLMService, context: LLMContext) -> AsyncIterator[tuple[PipelineTask, Recorder, Recorder]]:
    """The service in a running pipeline whose session has started (from ``context``); yields the
    task and what the service pushed down and up (transcripts). pipecat reports no error."""
    started: list[object] = []
    llm.add_event_handler("on_session_started", lambda _service, session: started.append(session))
    aggregators = LLMContextAggregatorPair(context)
    recorder, upstream = Recorder(), Recorder()
    task = PipelineTask(
        Pipeline([aggregators.user(), upstream, llm, recorder, aggregators.assistant()]),
        params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
        idle_timeout_secs=None,
    )
    runner = asyncio.create_task(PipelineRunner(handle_sigint=False).run(task))
    try:
        await task.queue_frame(LLMRunFrame())  # the session starts from the context
        await wait_for(lambda: started)
        yield task, recorder, upstream
        assert not runner.done(), "the pipeline is still running"
    finally:
        await task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    assert recorder.of(ErrorFrame) == [], recorder.of(ErrorFrame)


async def say(task: PipelineTask, text: str) -> None:
    chunk = RATE * 2 // 10
    pcm = b"\0" * (RATE * 2 * 4 // 10) + speech(text) + b"\0" * (RATE * 2 * 2)
    for pos in range(0, len(pcm), chunk):
        await task.queue_frame(InputAudioRawFrame(audio=pcm[pos : pos + chunk], sample_rate=RATE, num_channels=1))
        await asyncio.sleep(0.08)


def said(recorder: Recorder) -> str:
    return "".join(f.text for f in recorder.of(LLMTextFrame))


async def test_pipecat_live_service_hears_and_answers(gateway: LiveServer) -> None:
    llm = OpenAILiveLLMService(
        api_key="unused",
        base_url=gateway.ws + "/v1/live/sessions",
        settings=OpenAILiveLLMService.Settings(model="gpt-live-1", system_instruction="Answer briefly."),
    )
    text = "Please open the door for me."
    async with pipeline(llm, LLMContext(messages=[])) as (task, recorder, upstream):
        await say(task, text)
        await wait_for(lambda: upstream.of(TranscriptionFrame) and said(recorder).startswith("You said"))
        # the answer is heard: GPT-Live's continuous stream, silence and then speech
        await wait_for(lambda: any(any(f.audio) for f in recorder.of(SpeechOutputAudioRawFrame)))
        assert any(not any(f.audio) for f in recorder.of(SpeechOutputAudioRawFrame))
    heard = " ".join(f.text for f in upstream.of(TranscriptionFrame))
    assert wer(text, heard) <= 0.25, heard


async def test_pipecat_responses_delegation_runs_a_function_and_speaks_the_result(chat: ChatServer, gateway: LiveServer) -> None:
    backend = OpenAIResponsesLLMService.Settings(model="gpt-5.4-mini", system_instruction="Use the tools.")
    llm = OpenAILiveLLMService(
        api_key="unused",
        base_url=gateway.ws + "/v1/live/sessions",
        settings=OpenAILiveLLMService.Settings(model="gpt-live-1", system_instruction="Answer briefly."),
        delegation=OpenAILiveLLMService.ResponsesDelegation(settings=backend),
    )
    llm.register_function("get_weather", get_weather)
    delegations: list[object] = []
    llm.add_event_handler("on_delegation_created", lambda _service, d: delegations.append(d))
    context = LLMContext(messages=[], tools=ToolsSchema(standard_tools=[WEATHER]))
    answer = f"The weather service says {forecast('Paris')}."
    asked_before = len(chat.requests)
    async with pipeline(llm, context) as (task, recorder, _):
        await say(task, "What is the weather like in Paris?")
        await wait_for(lambda: answer in said(recorder))
        await wait_for(lambda: any(any(f.audio) for f in recorder.of(SpeechOutputAudioRawFrame)))
    assert [d.target for d in delegations] == ["responses"]  # type: ignore[attr-defined]
    results = recorder.of(FunctionCallResultFrame)
    assert [json.dumps(f.result) for f in results] == [json.dumps({"forecast": forecast("Paris")})]  # type: ignore[attr-defined]
    assert said(recorder).startswith("One moment please.")
    # the backend model was asked with pipecat's tools and its own instructions, and then with the result
    backend_asks = [b for b in chat.requests[asked_before:] if b["messages"][0]["content"] == "Use the tools."]
    assert [t["function"]["name"] for t in backend_asks[0]["tools"]] == ["get_weather"]
    assert backend_asks[-1]["messages"][-1]["role"] == "tool"


async def test_pipecat_live_service_on_the_speech_to_speech_model(duplex_gateway: LiveServer) -> None:
    llm = OpenAILiveLLMService(
        api_key="unused",
        base_url=duplex_gateway.ws + "/v1/live/sessions",
        settings=OpenAILiveLLMService.Settings(model="moshi", system_instruction="Answer briefly."),
        delegation=OpenAILiveLLMService.ResponsesDelegation(settings=OpenAIResponsesLLMService.Settings(model="gpt-5.4-mini")),
    )
    llm.register_function("get_weather", get_weather)
    # a trailing developer message: pipecat's way to have the bot speak first (sent as commentary)
    context = LLMContext(messages=[{"role": "developer", "content": "Greet the user."}], tools=ToolsSchema(standard_tools=[WEATHER]))
    async with pipeline(llm, context) as (task, recorder, _):
        await say(task, "Hello, how are you?")
        await wait_for(lambda: said(recorder) and any(any(f.audio) for f in recorder.of(SpeechOutputAudioRawFrame)))
