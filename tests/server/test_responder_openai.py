"""The `openai` responder against a real OpenAI-compatible chat endpoint (streaming SSE over HTTP,
as vLLM or llama.cpp serve it), run here as a small local server that streams slowly."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import websockets

from realtime_gw.records.voice import ChatMessage, ChatRequest, ChatUsage, ReplyPiece, ToolCall, ToolCallDelta
from realtime_gw.server.responder import (
    EchoResponder,
    OpenAIChatResponder,
    Responder,
    ResponderError,
    chunk_pieces,
)
from realtime_gw.testing.audio import transcribe, wer
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.chat_server import ChatServer, Reply, ToolCallReply, estimate_tokens, running_chat_server

REPLY = ["The door ", "is open now. ", "Your coffee ", "is on the table. ", "Have a nice day."]
CHUNK_DELAY_S = 0.15  # per word


def slow_reply(body: dict[str, Any]) -> Reply:
    return Reply("".join(REPLY), chunk_delay_s=CHUNK_DELAY_S)


@pytest.fixture(scope="module")
def chat_and_gateway() -> Iterator[tuple[ChatServer, LiveServer]]:
    with running_chat_server(slow_reply) as chat:
        gateway = start_server(
            "--policy", "none", "--responder", "openai", "--responder-url", chat.url,
            "--responder-model", "local-llm", "--no-cpu-backend-spare", name="responder",
        )  # fmt: skip
        yield chat, gateway
        stop_server(gateway)


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
    events = await _turn(gateway, "Where is my coffee?")
    done = events[-1][1]
    assert done["response"]["status"] == "completed"
    sent = chat.requests[-1]
    assert sent["model"] == "local-llm"
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["messages"] == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Where is my coffee?"},
    ]
    transcript = next(e for _, e in events if e["type"] == "response.output_audio_transcript.done")[
        "transcript"
    ]
    assert transcript == "".join(REPLY).strip()
    # speech starts while the model is still writing: the first sentence is spoken before the last chunk
    first_audio = next(t for t, e in events if e["type"] == "response.output_audio.delta")
    assert first_audio < chat.last_chunk_at
    pcm = b"".join(
        base64.b64decode(e["delta"]) for _, e in events if e["type"] == "response.output_audio.delta"
    )
    assert wer("".join(REPLY), transcribe(pcm, 24000)) <= 0.25


async def test_chat_endpoint_failure_fails_the_response_not_the_session(
    chat_and_gateway: tuple[ChatServer, LiveServer],
) -> None:
    chat, gateway = chat_and_gateway
    chat.fail = (503, "model overloaded")
    try:
        events = [e for _, e in await _turn(gateway, "Hello?")]
    finally:
        chat.fail = None
    kinds = [e["type"] for e in events]
    assert "error" in kinds and "503" in events[kinds.index("error")]["error"]["message"]
    assert events[-1]["response"]["status"] == "failed"
    assert kinds.count("response.done") == 1


# -- the responder itself against the chat server (no gateway) ----------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def chat() -> Iterator[ChatServer]:
    with running_chat_server() as server:
        yield server


@pytest.fixture
def responder(chat: ChatServer) -> OpenAIChatResponder:
    chat.fail = None
    chat.refuse_stream_options = False
    return OpenAIChatResponder(chat.url, "local-llm", api_key=None, timeout_s=10.0, max_tokens=64)


async def pieces_of(responder: Responder, request: ChatRequest) -> list[ReplyPiece]:
    return [piece async for piece in responder.stream(request)]


def user(text: str, images: list[str] | None = None) -> ChatMessage:
    return ChatMessage("user", text, images=images or [])


async def test_tools_tool_choice_and_temperature_are_sent_in_chat_form(
    chat: ChatServer, responder: OpenAIChatResponder
) -> None:
    request = ChatRequest(
        [user("Weather in Paris?")],
        max_tokens=32,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0.6,
    )
    await pieces_of(responder, request)
    sent = chat.requests[-1]
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city.",
                "parameters": WEATHER_TOOL["parameters"],
            },
        }
    ]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["temperature"] == 0.6
    assert sent["max_tokens"] == 32
    for choice in ("auto", "none", "required"):
        await pieces_of(responder, ChatRequest([user("Hi")], tools=[WEATHER_TOOL], tool_choice=choice))
        assert chat.requests[-1]["tool_choice"] == choice
    # no tools: neither tools nor tool_choice (chat endpoints refuse tool_choice alone), no temperature
    await pieces_of(responder, ChatRequest([user("Hi")], tool_choice="none"))
    assert not {"tools", "tool_choice", "temperature"} & set(chat.requests[-1])


async def test_images_tool_calls_and_tool_results_are_sent_as_chat_messages(
    chat: ChatServer, responder: OpenAIChatResponder
) -> None:
    photo = "data:image/png;base64,iVBORw0KGgo="
    messages = [
        ChatMessage("system", "Be brief."),
        user("What is this, and the weather?", images=[photo, "https://example.com/b.jpg"]),
        ChatMessage(
            "assistant",
            "Let me check.",
            tool_calls=[
                ToolCall("call_a", "get_weather", '{"city": "Paris"}'),
                ToolCall("call_b", "get_weather", '{"city": "Rome"}'),
            ],
        ),
        ChatMessage("tool", '{"sky": "clear"}', tool_call_id="call_a"),
        ChatMessage("tool", '{"sky": "rain"}', tool_call_id="call_b"),
        user("", images=[photo]),
    ]
    await pieces_of(responder, ChatRequest(messages, tools=[WEATHER_TOOL]))
    assert chat.requests[-1]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this, and the weather?"},
                {"type": "image_url", "image_url": {"url": photo}},
                {"type": "image_url", "image_url": {"url": "https://example.com/b.jpg"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": '{"sky": "clear"}'},
        {"role": "tool", "tool_call_id": "call_b", "content": '{"sky": "rain"}'},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": photo}}]},
    ]


def joined_calls(pieces: list[ReplyPiece]) -> dict[int, tuple[str | None, str | None, str]]:
    """index -> (call_id, name, arguments) from the streamed fragments; id and name only on the first."""
    calls: dict[int, tuple[str | None, str | None, str]] = {}
    for p in pieces:
        if isinstance(p, ToolCallDelta):
            if p.index not in calls:
                calls[p.index] = (p.call_id, p.name, p.arguments)
            else:
                call_id, name, args = calls[p.index]
                assert p.call_id is None and p.name is None
                calls[p.index] = (call_id, name, args + p.arguments)
    return calls


async def test_text_then_parallel_tool_calls_stream_as_fragments_then_usage(
    chat: ChatServer, responder: OpenAIChatResponder
) -> None:
    paris, rome = json.dumps({"city": "Paris"}), json.dumps({"city": "Rome", "unit": "celsius"})
    chat.queue(
        Reply(
            "One moment.",
            [ToolCallReply("get_weather", paris, "call_p"), ToolCallReply("get_weather", rome, "call_r")],
            fragment_chars=5,
            cached_tokens=3,
        )
    )
    pieces = await pieces_of(
        responder, ChatRequest([user("Weather in Paris and Rome?")], tools=[WEATHER_TOOL])
    )
    assert "".join(p for p in pieces if isinstance(p, str)) == "One moment."
    assert joined_calls(pieces) == {0: ("call_p", "get_weather", paris), 1: ("call_r", "get_weather", rome)}
    assert sum(isinstance(p, ToolCallDelta) for p in pieces) > 2 + len(paris) // 5, "arguments in fragments"
    usage = pieces[-1]
    assert isinstance(usage, ChatUsage) and sum(isinstance(p, ChatUsage) for p in pieces) == 1
    assert usage.input_tokens == estimate_tokens(chat.requests[-1]["messages"])
    assert usage.output_tokens > 0 and usage.cached_tokens == 3


async def test_single_tool_call_without_text(chat: ChatServer, responder: OpenAIChatResponder) -> None:
    chat.queue(Reply(tool_calls=[ToolCallReply("get_weather", '{"city": "Oslo"}', "call_o")]))
    pieces = await pieces_of(responder, ChatRequest([user("Oslo?")], tools=[WEATHER_TOOL]))
    assert not any(isinstance(p, str) for p in pieces)
    assert joined_calls(pieces) == {0: ("call_o", "get_weather", '{"city": "Oslo"}')}


async def test_server_that_refuses_stream_options_is_asked_again_without(
    chat: ChatServer, responder: OpenAIChatResponder
) -> None:
    chat.refuse_stream_options = True
    pieces = await pieces_of(responder, ChatRequest([user("Hello there")]))
    assert "".join(p for p in pieces if isinstance(p, str)) == "You said: Hello there"
    assert not any(isinstance(p, ChatUsage) for p in pieces), "no usage from a server that cannot give it"
    assert "stream_options" in chat.requests[-2] and "stream_options" not in chat.requests[-1]


def test_usage_only_chunks_and_missing_fields_are_tolerated() -> None:
    assert list(chunk_pieces({"choices": [], "usage": None})) == []
    assert list(chunk_pieces({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})) == []
    usage = {"prompt_tokens": 12, "completion_tokens": 4}  # no prompt_tokens_details
    assert list(chunk_pieces({"choices": [], "usage": usage})) == [ChatUsage(12, 4, 0)]
    # a server that sends whole calls without index: position in the list
    delta = {"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}]}
    assert list(chunk_pieces({"choices": [{"delta": delta}]})) == [ToolCallDelta(0, "{}", "a", "f")]


async def test_backend_that_cannot_take_images_is_a_clear_error(
    chat: ChatServer, responder: OpenAIChatResponder
) -> None:
    chat.fail = (400, "This model does not support image input.")
    with pytest.raises(ResponderError, match="cannot take images"):
        await pieces_of(
            responder, ChatRequest([user("What is this?", images=["data:image/png;base64,AAAA"])])
        )
    with pytest.raises(ResponderError, match="answered 400") as err:
        await pieces_of(responder, ChatRequest([user("No picture here")]))
    assert "cannot take images" not in str(err.value)


async def test_echo_speaks_the_latest_user_text_around_tool_messages() -> None:
    messages = [
        user("What is the weather in Paris?"),
        ChatMessage("assistant", "", tool_calls=[ToolCall("call_a", "get_weather", "{}")]),
        ChatMessage("tool", '{"sky": "clear"}', tool_call_id="call_a"),
    ]
    pieces = await pieces_of(EchoResponder(), ChatRequest(messages, tools=[WEATHER_TOOL]))
    assert "".join(p for p in pieces if isinstance(p, str)) == "What is the weather in Paris?"
    assert all(isinstance(p, str) for p in pieces)
