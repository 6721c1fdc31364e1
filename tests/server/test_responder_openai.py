"""The `openai` responder against a real OpenAI-compatible chat endpoint (streaming SSE over HTTP,
as vLLM or llama.cpp serve it), run here as a small local server that streams slowly."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import uvicorn
import websockets
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.audio_tools import transcribe, wer
from tests.conftest import LiveServer, free_port, start_server, stop_server

REPLY = ["The door ", "is open now. ", "Your coffee ", "is on the table. ", "Have a nice day."]
CHUNK_DELAY_S = 0.4


class ChatServer:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.last_chunk_at = 0.0
        self.fail = False
        app = Starlette(routes=[Route("/v1/chat/completions", self.completions, methods=["POST"])])
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))

    async def completions(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        if self.fail:
            return JSONResponse({"error": {"message": "model overloaded"}}, status_code=503)
        assert body["stream"] is True

        async def sse() -> AsyncIterator[str]:
            for piece in REPLY:
                chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": piece}}]}
                yield f"data: {json.dumps(chunk)}\n\n"
                self.last_chunk_at = time.monotonic()
                await asyncio.sleep(CHUNK_DELAY_S)
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def chat_and_gateway() -> Iterator[tuple[ChatServer, LiveServer]]:
    chat = ChatServer()
    thread = threading.Thread(target=chat.server.run, daemon=True)
    thread.start()
    while not chat.server.started:
        time.sleep(0.05)
    gateway = start_server(
        "--policy", "none", "--responder", "openai", "--responder-url", f"http://127.0.0.1:{chat.port}/v1",
        "--responder-model", "local-llm", name="responder",
    )  # fmt: skip
    yield chat, gateway
    stop_server(gateway)
    chat.server.should_exit = True
    thread.join(timeout=5)


async def _turn(gateway: LiveServer, text: str) -> list[tuple[float, dict[str, Any]]]:
    async with websockets.connect(gateway.ws + "/v1/realtime") as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "session.update", "session": {"instructions": "Be kind."}}))
        await ws.recv()
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await ws.send(json.dumps({"type": "response.create"}))
        events = []
        while True:
            ev = json.loads(await asyncio.wait_for(ws.recv(), 60))
            events.append((time.monotonic(), ev))
            if ev["type"] == "response.done":
                return events


async def test_streams_llm_text_into_speech_sentence_by_sentence(
    chat_and_gateway: tuple[ChatServer, LiveServer],
) -> None:
    chat, gateway = chat_and_gateway
    chat.fail = False
    events = await _turn(gateway, "Where is my coffee?")
    done = events[-1][1]
    assert done["response"]["status"] == "completed"
    sent = chat.requests[-1]
    assert sent["model"] == "local-llm"
    assert sent["messages"] == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Where is my coffee?"},
    ]
    transcript = next(e for _, e in events if e["type"] == "response.output_audio_transcript.done")["transcript"]
    assert transcript == "".join(REPLY).strip()
    # speech starts while the model is still writing: the first sentence is spoken before the last chunk
    first_audio = next(t for t, e in events if e["type"] == "response.output_audio.delta")
    assert first_audio < chat.last_chunk_at
    pcm = b"".join(base64.b64decode(e["delta"]) for _, e in events if e["type"] == "response.output_audio.delta")
    assert wer("".join(REPLY), transcribe(pcm, 24000)) <= 0.25


async def test_chat_endpoint_failure_fails_the_response_not_the_session(
    chat_and_gateway: tuple[ChatServer, LiveServer],
) -> None:
    chat, gateway = chat_and_gateway
    chat.fail = True
    try:
        events = [e for _, e in await _turn(gateway, "Hello?")]
    finally:
        chat.fail = False
    kinds = [e["type"] for e in events]
    assert "error" in kinds and "503" in events[kinds.index("error")]["error"]["message"]
    assert events[-1]["response"]["status"] == "failed"
    assert kinds.count("response.done") == 1
