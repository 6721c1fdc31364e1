"""A live gateway over the tiny Qwen3-TTS VoiceDesign and Base checkpoints (tests/fixtures, greedy):
``instructions`` on ``POST /v1/audio/speech`` describe the voice; voices registered at start-up
(``--tts-voice-design``, ``--tts-voice-clone``) are selected by ``voice``, over HTTP and ``/v1/realtime``."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import httpx
import openai
import pytest
import websockets
from openai import AsyncOpenAI
from openai.types.audio import Voice

from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.server.qwen3_fixtures import CLONE_WAV, FIXTURES, greedy_copy
from tests.server.realtime_sdk_client import FRAME_BYTES, connect, text_turn

TEXT = "Please open the door."
WARM = "A warm, low voice, speaking slowly."
BRIGHT = "A bright, quick voice."


@pytest.fixture(scope="module")
def design_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    ckpt = greedy_copy("qwen3_tts_tiny_voice_design", tmp_path_factory.mktemp("design"))
    server = start_server(
        "--policy", "none", "--api-key", "test-key", "--tts", "qwen3", "--tts-path", str(ckpt),
        "--tts-instructions", BRIGHT, "--tts-voice-design", json.dumps([f"narrator={WARM}"]),
        "--no-cpu-backend-spare", name="qwen3-design",
    )  # fmt: skip
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def clone_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    ckpt = greedy_copy("qwen3_tts_tiny_base", tmp_path_factory.mktemp("base"))
    wav = FIXTURES / "qwen3_tts_tiny_clone.wav"
    server = start_server(
        "--policy", "none", "--api-key", "test-key", "--tts", "qwen3", "--tts-path", str(ckpt),
        "--no-cpu-backend-spare",
        "--tts-voice-clone", f"anna={wav}", "--tts-voice-clone", f"bob={wav}:Hi.", name="qwen3-clone",
    )  # fmt: skip
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def warm_pcm(design_server: LiveServer) -> bytes:
    """The audio of ``TEXT`` in the voice ``WARM`` describes (greedy: every request for it gives these
    bytes), rendered once for the tests that compare other ways of asking for that voice with it."""
    return _pcm(design_server, instructions=WARM)


def _speech(server: LiveServer, **body: object) -> httpx.Response:
    return httpx.post(
        server.http + "/v1/audio/speech",
        json={"input": TEXT, "response_format": "pcm", **body},
        headers={"Authorization": "Bearer test-key"},
        timeout=120,
    )


def _pcm(server: LiveServer, **body: object) -> bytes:
    resp = _speech(server, **body)
    assert resp.status_code == 200, resp.text
    assert len(resp.content) > 0 and len(resp.content) % 2 == 0
    return resp.content


def test_speech_instructions_describe_the_voice(design_server: LiveServer, warm_pcm: bytes) -> None:
    """``instructions`` is the voice: a named design speaks as its description given inline; another
    description, or none (the server's ``--tts-instructions``), speaks differently."""
    assert _pcm(design_server, voice="narrator") == warm_pcm
    assert _pcm(design_server, voice="alloy", instructions=WARM) == warm_pcm
    bright = _pcm(design_server)
    assert bright != warm_pcm
    assert _pcm(design_server, instructions=BRIGHT) == bright


def test_speech_instructions_bounded(design_server: LiveServer) -> None:
    resp = _speech(design_server, instructions="x" * 5000)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "instructions"


def test_instructions_past_the_models_token_limit_are_a_400(design_server: LiveServer) -> None:
    """Under the protocol's character cap but over the checkpoint's instruction tokens: refused with the
    reason before any audio (not a 200 with an empty body), and the server goes on speaking."""
    resp = _speech(design_server, instructions="a b c d " * 140)
    assert resp.status_code == 400, resp.status_code
    assert "tokens" in resp.json()["error"]["message"]
    assert _pcm(design_server, instructions=WARM)


async def test_speech_socket_takes_instructions(design_server: LiveServer, warm_pcm: bytes) -> None:
    """The speech WebSocket's ``session.config`` carries ``instructions`` as the HTTP body does: one
    sentence, one segment, the same audio."""
    headers = {"Authorization": "Bearer test-key"}
    async with websockets.connect(
        design_server.ws + "/v1/audio/speech/stream", additional_headers=headers
    ) as ws:
        await ws.send(json.dumps({"type": "session.config", "instructions": WARM}))
        await ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        await ws.send(json.dumps({"type": "input.done"}))
        frames = []
        while True:
            msg = await ws.recv()
            if isinstance(msg, bytes):
                frames.append(msg)
            elif json.loads(msg)["type"] == "audio.done":
                break
            else:
                assert json.loads(msg)["type"] == "audio.start", msg
    assert b"".join(frames) == warm_pcm


async def test_realtime_speaks_a_designed_voice(design_server: LiveServer) -> None:
    """Realtime sessions pick a registered design by ``voice`` (their ``instructions`` are the LLM's)."""
    audio = {"input": {"turn_detection": None}, "output": {"voice": "narrator"}}
    async with connect(design_server, audio=audio) as conn:
        events = await text_turn(conn, "Thank you.")
    assert events[-1].response.status == "completed"
    sizes = [len(base64.b64decode(e.delta)) for e in events if e.type == "response.output_audio.delta"]
    assert sizes and all(s == FRAME_BYTES for s in sizes[:-1])


async def test_a_voice_designed_through_the_api_speaks_as_its_prompt(
    design_server: LiveServer, warm_pcm: bytes
) -> None:
    """``client.audio.voices.create(type="prompt")``: ``voice: {"id": ...}`` then speaks as that description
    given as ``instructions``; this checkpoint cannot clone, and says so."""
    c = AsyncOpenAI(base_url=design_server.http + "/v1", api_key="test-key", max_retries=0, timeout=120)
    raw = await c.audio.voices.with_raw_response.create(name="Warm", prompt=WARM, type="prompt")
    voice = Voice.model_validate(raw.http_response.json())
    assert voice.type == "prompt" and voice.prompt == WARM
    assert _pcm(design_server, voice={"id": voice.id}) == warm_pcm  # type: ignore[arg-type]
    consent = await c.audio.voice_consents.create(recording=CLONE_WAV.open("rb"), name="n", language="en")
    with pytest.raises(openai.BadRequestError, match="cannot clone voices"):
        await c.audio.voices.create(audio_sample=CLONE_WAV.open("rb"), consent=consent.id, name="x")


def test_speech_speaks_a_cloned_voice(clone_server: LiveServer) -> None:
    """``voice: anna`` is the recording registered with ``--tts-voice-clone`` (x-vector), ``bob`` the same
    recording with its transcript (ICL); OpenAI names and "default" map to the default (the first);
    other names are refused."""
    anna = _pcm(clone_server, voice="anna")
    assert _pcm(clone_server, voice="bob") != anna
    assert _pcm(clone_server, voice="default") == anna
    assert _pcm(clone_server, voice="alloy") == anna
    resp = _speech(clone_server, voice="nobody")
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "voice"
