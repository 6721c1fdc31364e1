"""One live gateway for the framework tests: tone TTS (cheap), Silero VAD and pocketsphinx (real
speech in), and the ``openai`` responder talking to a scripted chat-completions server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.chat_server import ChatServer, running_chat_server
from tests.frameworks.scenario import weather_agent


@pytest.fixture(scope="session")
def chat() -> Iterator[ChatServer]:
    with running_chat_server(weather_agent) as server:
        yield server


@pytest.fixture(scope="session")
def gateway(chat: ChatServer) -> Iterator[LiveServer]:
    server = start_server(
        "--policy", "none", "--tts", "tone", "--responder", "openai", "--responder-url", chat.url,
        "--responder-model", "local-llm", "--max-sessions", "8", "--no-cpu-backend-spare", name="frameworks",
    )  # fmt: skip
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def duplex_gateway() -> Iterator[LiveServer]:
    """A gateway serving a tiny random-init Moshi on its speech-to-speech stage (GPT-Live on the model)."""
    server = start_server(
        "--policy", "none", "--tts", "tone", "--s2s", "moshi", "--s2s-config", "tiny", "--s2s-slots", "2",
        "--no-cpu-backend-spare", name="frameworks-duplex",
    )  # fmt: skip
    yield server
    stop_server(server)
