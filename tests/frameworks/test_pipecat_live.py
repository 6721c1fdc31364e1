"""pipecat's own ``OpenAILiveLLMService`` (GPT-Live) in a small pipecat pipeline (context aggregators,
the service, a frame recorder; no transport) against a live gateway's ``/v1/live/sessions``: the
session starts from the pipeline's context, spoken input (Piper speech) is heard and transcribed,
the voice answers aloud, and pipecat sees no error."""

from __future__ import annotations

import asyncio
import contextlib
import time

from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
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
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.live.llm import OpenAILiveLLMService

from realtime_gw.testing.audio import wer
from realtime_gw.testing.gateway import LiveServer
from tests.frameworks.scenario import RATE, speech


class Recorder(FrameProcessor):
    """Keeps the frames the live service pushes downstream."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append(frame)
        await self.push_frame(frame, direction)

    def of(self, kind: type) -> list[Frame]:
        return [f for f in self.frames if isinstance(f, kind)]


async def wait_for(check: object, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_pipecat_live_service_hears_and_answers(gateway: LiveServer) -> None:
    llm = OpenAILiveLLMService(
        api_key="unused",
        base_url=gateway.ws + "/v1/live/sessions",
        settings=OpenAILiveLLMService.Settings(model="gpt-live-1", system_instruction="Answer briefly."),
    )
    started: list[object] = []
    llm.add_event_handler("on_session_started", lambda _service, session: started.append(session))
    context = LLMContext(messages=[])
    aggregators = LLMContextAggregatorPair(context)
    recorder, upstream = Recorder(), Recorder()  # what the service pushes down, and up (transcripts)
    task = PipelineTask(
        Pipeline([aggregators.user(), upstream, llm, recorder, aggregators.assistant()]),
        params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
        idle_timeout_secs=None,
    )
    runner = asyncio.create_task(PipelineRunner(handle_sigint=False).run(task))
    text = "Please open the door for me."
    try:
        await task.queue_frame(LLMRunFrame())  # the session starts from the context
        await wait_for(lambda: started)
        chunk = RATE * 2 // 10
        pcm = b"\0" * (RATE * 2 * 4 // 10) + speech(text) + b"\0" * (RATE * 2 * 2)
        for pos in range(0, len(pcm), chunk):
            await task.queue_frame(InputAudioRawFrame(audio=pcm[pos : pos + chunk], sample_rate=RATE, num_channels=1))
            await asyncio.sleep(0.08)
        said = lambda: "".join(f.text for f in recorder.of(LLMTextFrame))  # noqa: E731
        await wait_for(lambda: upstream.of(TranscriptionFrame) and said().startswith("You said"))
        # the answer is heard: GPT-Live's continuous stream, silence and then speech
        await wait_for(lambda: any(any(f.audio) for f in recorder.of(SpeechOutputAudioRawFrame)))
        assert any(not any(f.audio) for f in recorder.of(SpeechOutputAudioRawFrame))
        assert not runner.done(), "the pipeline is still running"
    finally:
        await task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    assert recorder.of(ErrorFrame) == [], recorder.of(ErrorFrame)
    heard = " ".join(f.text for f in upstream.of(TranscriptionFrame))
    assert wer(text, heard) <= 0.25, heard
