"""A live gateway with ``--s2s personaplex`` (tiny, random init) and a voice directory: ``/v1/models``
lists the model, its capabilities and its voices, and a ``/v1/realtime`` session of model
``personaplex`` through the official ``openai`` SDK opens on the stage (its default voice prefilled)
and hears the model speak, 80 ms a delta."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import soundfile
from openai import AsyncOpenAI

from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.server.realtime_sdk_client import recv

STEP_BYTES = 1920 * 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    voices = tmp_path_factory.mktemp("voices")
    t = np.arange(12000) / 24000
    soundfile.write(str(voices / "ada.wav"), (0.1 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 24000)
    server = start_server(
        "--policy", "none", "--tts", "tone", "--api-key", "test-key", "--s2s", "personaplex",
        "--s2s-config", "tiny", "--s2s-slots", "2", "--s2s-voices-dir", str(voices), "--s2s-voice", "ada",
        name="personaplex",
    )  # fmt: skip
    yield server
    stop_server(server)


async def test_the_model_and_its_voices_are_listed_and_a_session_hears_it_speak(server: LiveServer) -> None:
    models = httpx.get(server.http + "/v1/models", headers={"Authorization": "Bearer test-key"}).json()
    [model] = [m for m in models["data"] if m["id"] == "personaplex"]
    assert model["capabilities"] == ["audio_in", "audio_out", "text_out", "voice_prompt", "persona"]
    assert model["voices"] == ["ada"] and model["default_voice"] == "ada" and model["max_prompt_frames"] == 97
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key")
    async with client.realtime.connect(model="personaplex", extra_query={"seed": "3"}) as conn:
        created = await recv(conn)
        assert created.type == "session.created" and created.session.model == "personaplex"
        silence = base64.b64encode(bytes(STEP_BYTES)).decode()

        async def first_audio() -> bytes:
            while True:
                event = await recv(conn)
                assert event.type != "error", event
                if event.type == "response.output_audio.delta":
                    return base64.b64decode(event.delta)

        listen = asyncio.create_task(first_audio())
        for _ in range(150):  # up to 12 s of microphone at real time
            if listen.done():
                break
            await conn.input_audio_buffer.append(audio=silence)
            await asyncio.sleep(0.08)
        assert len(await asyncio.wait_for(listen, 1)) == STEP_BYTES
