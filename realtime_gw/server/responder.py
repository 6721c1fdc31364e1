"""Responders turn the conversation into a reply, streamed as it is produced.

``echo`` (the default) speaks back what the user said; ``openai`` streams from any OpenAI-compatible
``/v1/chat/completions`` endpoint (vLLM, llama.cpp server, OpenAI itself), tools and images included.
Both are async sources of ``ReplyPiece`` (text, tool-call fragments, usage): they do no heavy compute,
so they run on the event loop and the TTS stage worker consumes their text.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

import httpx

from realtime_gw.config import GatewayConfig
from realtime_gw.records.voice import ChatMessage, ChatRequest, ChatUsage, ReplyPiece, ToolCallDelta


class ResponderError(RuntimeError):
    pass


class Responder(Protocol):
    name: str

    def stream(self, request: ChatRequest) -> AsyncIterator[ReplyPiece]:
        """Text pieces, tool-call fragments and (last, when known) usage, as the model produces them."""
        ...


class EchoResponder:
    """Repeats the latest user message, piece by piece, as a streaming LLM would deliver it."""

    name = "echo"

    async def stream(self, request: ChatRequest) -> AsyncIterator[ReplyPiece]:
        max_tokens = request.max_tokens
        text = next(
            (m.content for m in reversed(request.messages) if m.role == "user" and m.content.strip()), ""
        )
        if not text.strip():
            text = "I did not catch that."
        words = re.findall(r"\S+\s*", text)
        if max_tokens is not None:
            words = words[:max_tokens]
        for w in words:
            yield w


class OpenAIChatResponder:
    """Streams a reply from an OpenAI-compatible chat completions endpoint: ``delta.content`` as text,
    ``delta.tool_calls`` as ``ToolCallDelta`` fragments, and the final ``usage`` chunk as ``ChatUsage``."""

    name = "openai"

    def __init__(
        self, base_url: str, model: str, api_key: str | None, timeout_s: float, max_tokens: int
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = httpx.Timeout(timeout_s, connect=5.0)
        self.max_tokens = max_tokens
        self.ask_usage = True
        """Cleared for good when the endpoint refuses ``stream_options`` (older servers)."""
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout)
        return self._client

    def request_body(self, request: ChatRequest) -> dict[str, Any]:
        """The chat-completions request for ``request`` (public so tests can read what is sent)."""
        body: dict[str, Any] = {
            "model": self.model,
            "stream": True,
            "max_tokens": request.max_tokens or self.max_tokens,
            "messages": [chat_message(m) for m in request.messages],
        }
        if self.ask_usage:
            body["stream_options"] = {"include_usage": True}
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.tools:  # chat endpoints refuse tool_choice without tools
            body["tools"] = [chat_tool(t) for t in request.tools]
            body["tool_choice"] = chat_tool_choice(request.tool_choice)
        return body

    async def stream(self, request: ChatRequest) -> AsyncIterator[ReplyPiece]:
        body = self.request_body(request)
        try:
            async with self._http().stream("POST", self.url, json=body, headers=self.headers) as resp:
                if resp.status_code != 200:
                    detail = (await resp.aread())[:300].decode(errors="replace")
                    if self.ask_usage and 400 <= resp.status_code < 500 and "stream_options" in detail:
                        self.ask_usage = False
                        raise _RetryWithoutUsage
                    raise _refusal(resp.status_code, detail, request)
                usage: ChatUsage | None = None
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                        pieces = list(chunk_pieces(chunk))
                    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
                        raise ResponderError(f"bad chunk from chat endpoint: {data[:200]}") from e
                    for piece in pieces:
                        if isinstance(piece, ChatUsage):
                            usage = piece  # servers with continuous usage send it often: keep the last
                        else:
                            yield piece
                if usage is not None:
                    yield usage
        except _RetryWithoutUsage:
            async for piece in self.stream(request):
                yield piece
        except httpx.HTTPError as e:
            raise ResponderError(f"chat endpoint unreachable: {e}") from e


class _RetryWithoutUsage(Exception):
    """The endpoint does not know ``stream_options``: ask again without it."""


def _refusal(status: int, detail: str, request: ChatRequest) -> ResponderError:
    if 400 <= status < 500 and "image" in detail.lower() and any(m.images for m in request.messages):
        return ResponderError(f"the chat model cannot take images (endpoint answered {status}: {detail})")
    return ResponderError(f"chat endpoint answered {status}: {detail}")


def chunk_pieces(chunk: dict[str, Any]) -> Iterator[ReplyPiece]:
    """Text, tool-call fragments and usage of one ``chat.completion.chunk`` (a usage-only chunk has
    no choices)."""
    for choice in chunk.get("choices") or []:
        if choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta") or {}
        if delta.get("content"):
            yield delta["content"]
        for position, call in enumerate(delta.get("tool_calls") or []):
            function = call.get("function") or {}
            yield ToolCallDelta(
                index=call.get("index", position),
                arguments=function.get("arguments") or "",
                call_id=call.get("id") or None,
                name=function.get("name") or None,
            )
    usage = chunk.get("usage")
    if usage:
        details = usage.get("prompt_tokens_details") or {}
        yield ChatUsage(
            input_tokens=usage.get("prompt_tokens") or 0,
            output_tokens=usage.get("completion_tokens") or 0,
            cached_tokens=details.get("cached_tokens") or 0,
        )


def chat_message(m: ChatMessage) -> dict[str, Any]:
    """A conversation message in chat-completions form."""
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    if m.tool_calls:
        calls = [
            {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
        return {"role": m.role, "content": m.content or None, "tool_calls": calls}
    if m.images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
        parts += [{"type": "image_url", "image_url": {"url": url}} for url in m.images]
        return {"role": m.role, "content": parts}
    return {"role": m.role, "content": m.content}


def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A Realtime function tool (flat) as a chat-completions tool (nested under ``function``)."""
    function = {"name": tool["name"]}
    for key in ("description", "parameters"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, dict):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def build_responder(config: GatewayConfig) -> Responder:
    if config.responder == "openai":
        return OpenAIChatResponder(
            config.responder_url,
            config.responder_model,
            config.responder_api_key,
            config.responder_timeout_s,
            config.responder_max_tokens,
        )
    return EchoResponder()
