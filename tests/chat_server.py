"""A scriptable streaming chat-completions server (OpenAI's SSE wire format, as vLLM serves it) for
tests of the ``openai`` responder: text, tool calls (single or parallel, arguments in fragments),
usage chunks; every request body it received is kept for assertions."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from realtime_gw.testing.gateway import free_port


@dataclass
class ToolCallReply:
    name: str
    arguments: str
    """JSON text, streamed in ``fragment_chars`` pieces."""
    call_id: str = ""


@dataclass
class Reply:
    """One scripted answer: text first (word by word), then the tool calls (one after the other, as
    OpenAI streams parallel calls)."""

    text: str = ""
    tool_calls: list[ToolCallReply] = field(default_factory=list)
    chunk_delay_s: float = 0.0
    fragment_chars: int = 7
    cached_tokens: int = 0


def last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body["messages"]):
        if message["role"] == "user":
            content = message["content"]
            if isinstance(content, list):
                return " ".join(p["text"] for p in content if p.get("type") == "text")
            return content
    return ""


def say_back(body: dict[str, Any]) -> Reply:
    """The default answer: repeats the latest user text."""
    return Reply(f"You said: {last_user_text(body)}")


def call_when_asked(body: dict[str, Any]) -> Reply:
    """Calls a tool when the latest user text says ``call NAME {json arguments}``; after a tool's
    result, answers with it (``The tool said: ...``); else says back what it heard."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return Reply(f"The tool said: {last['content']}")
    text = last_user_text(body)
    if text.startswith("call "):
        name, _, arguments = text[5:].partition(" ")
        return Reply("", [ToolCallReply(name, arguments or "{}")])
    return say_back(body)


def estimate_tokens(messages: list[dict[str, Any]]) -> int:
    """A stand-in tokenizer for ``usage.prompt_tokens``: about four characters per token."""
    return max(1, len(json.dumps(messages)) // 4)


class ChatServer:
    """``POST /v1/chat/completions`` on a free loopback port, served from a thread.

    Answers come from ``queue(...)`` in order while any are queued, else from ``answer(body)``.
    ``fail`` makes every request answer that (status, message); ``refuse_stream_options`` plays an
    older server that does not know ``stream_options``."""

    def __init__(self, answer: Callable[[dict[str, Any]], Reply] = say_back) -> None:
        self.answer = answer
        self.requests: list[dict[str, Any]] = []
        self.scripted: deque[Reply] = deque()
        self.fail: tuple[int, str] | None = None
        self.refuse_stream_options = False
        self.last_chunk_at = 0.0
        self.port = free_port()
        app = Starlette(routes=[Route("/v1/chat/completions", self.completions, methods=["POST"])])
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def queue(self, *replies: Reply) -> None:
        self.scripted.extend(replies)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.server.run, daemon=True, name="chat-server")
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("chat server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)

    async def completions(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        if self.fail is not None:
            status, message = self.fail
            return JSONResponse({"error": {"message": message}}, status_code=status)
        if "stream_options" in body and self.refuse_stream_options:
            message = "Unrecognized request argument supplied: stream_options"
            return JSONResponse({"error": {"message": message}}, status_code=400)
        reply = self.scripted.popleft() if self.scripted else self.answer(body)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            self._sse(reply, body["messages"], include_usage), media_type="text/event-stream"
        )

    async def _sse(
        self, reply: Reply, messages: list[dict[str, Any]], include_usage: bool
    ) -> AsyncIterator[str]:
        deltas = list(reply_deltas(reply, f"call_{len(self.requests)}_"))
        for delta in deltas:
            chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
            yield f"data: {json.dumps(chunk)}\n\n"
            self.last_chunk_at = time.monotonic()
            if reply.chunk_delay_s:
                await asyncio.sleep(reply.chunk_delay_s)
        finish = "tool_calls" if reply.tool_calls else "stop"
        yield f"data: {json.dumps({'choices': [{'index': 0, 'delta': {}, 'finish_reason': finish}]})}\n\n"
        if include_usage:
            usage = {
                "prompt_tokens": estimate_tokens(messages),
                "completion_tokens": len(deltas),
                "total_tokens": estimate_tokens(messages) + len(deltas),
                "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
            }
            yield f"data: {json.dumps({'object': 'chat.completion.chunk', 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"


def reply_deltas(reply: Reply, call_id_prefix: str = "call_") -> Iterator[dict[str, Any]]:
    """The ``delta`` objects of a streamed answer, in OpenAI's shapes."""
    words = reply.text.split(" ")
    for i, word in enumerate(words if reply.text else []):
        yield {"role": "assistant", "content": word + (" " if i < len(words) - 1 else "")}
    for index, call in enumerate(reply.tool_calls):
        call_id = call.call_id or f"{call_id_prefix}{index}"
        yield {
            "tool_calls": [
                {
                    "index": index,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }
            ]
        }
        args = call.arguments
        for start in range(0, len(args), reply.fragment_chars):
            fragment = args[start : start + reply.fragment_chars]
            yield {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}


@contextmanager
def running_chat_server(answer: Callable[[dict[str, Any]], Reply] = say_back) -> Iterator[ChatServer]:
    chat = ChatServer(answer)
    chat.start()
    try:
        yield chat
    finally:
        chat.stop()
