"""Responders turn the conversation into reply text, streamed as it is produced.

``echo`` (the default) speaks back what the user said; ``openai`` streams from any OpenAI-compatible
``/v1/chat/completions`` endpoint (vLLM, llama.cpp server, OpenAI itself). Both are async sources of
text: they do no heavy compute, so they run on the event loop and the TTS stage worker consumes them.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Protocol

import httpx

from realtime_gw.config import GatewayConfig
from realtime_gw.records.voice import ChatRequest, ReplyPiece


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
        text = next((m.content for m in reversed(request.messages) if m.role == "user" and m.content.strip()), "")
        if not text.strip():
            text = "I did not catch that."
        words = re.findall(r"\S+\s*", text)
        if max_tokens is not None:
            words = words[:max_tokens]
        for w in words:
            yield w


class OpenAIChatResponder:
    """Streams ``choices[0].delta.content`` from an OpenAI-compatible chat completions endpoint."""

    name = "openai"

    def __init__(self, base_url: str, model: str, api_key: str | None, timeout_s: float, max_tokens: int) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = httpx.Timeout(timeout_s, connect=5.0)
        self.max_tokens = max_tokens
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout)
        return self._client

    async def stream(self, request: ChatRequest) -> AsyncIterator[ReplyPiece]:
        body = {
            "model": self.model,
            "stream": True,
            "max_tokens": request.max_tokens or self.max_tokens,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
        }
        try:
            async with self._http().stream("POST", self.url, json=body, headers=self.headers) as resp:
                if resp.status_code != 200:
                    detail = (await resp.aread())[:300].decode(errors="replace")
                    raise ResponderError(f"chat endpoint answered {resp.status_code}: {detail}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    try:
                        chunk = json.loads(data)
                        piece = (chunk["choices"][0].get("delta") or {}).get("content")
                    except (ValueError, KeyError, IndexError, TypeError) as e:
                        raise ResponderError(f"bad chunk from chat endpoint: {data[:200]}") from e
                    if piece:
                        yield piece
        except httpx.HTTPError as e:
            raise ResponderError(f"chat endpoint unreachable: {e}") from e


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
