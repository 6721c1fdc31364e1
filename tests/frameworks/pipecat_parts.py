"""What the pipecat tests build their pipelines from: the weather function the scenario's model calls,
and a processor that keeps the frames a service pushes."""

from __future__ import annotations

from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.frames.frames import Frame
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams

from tests.frameworks.scenario import forecast

WEATHER = FunctionSchema(
    name="get_weather",
    description="The weather forecast for a city.",
    properties={"city": {"type": "string"}},
    required=["city"],
)


async def get_weather(params: FunctionCallParams) -> None:
    await params.result_callback({"forecast": forecast(params.arguments["city"])})


class Recorder(FrameProcessor):
    """Keeps the frames the service pushes (downstream, or upstream where it sits above it)."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append(frame)
        await self.push_frame(frame, direction)

    def of(self, kind: type) -> list[Frame]:
        return [f for f in self.frames if isinstance(f, kind)]
