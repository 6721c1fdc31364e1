"""Tools, images and usage end to end through the ``openai`` responder: the official ``openai`` SDK
drives a live gateway whose chat backend is the scripted chat server (text-only replies: fast)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from openai import AsyncOpenAI

from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.chat_server import ChatServer, Reply, ToolCallReply, estimate_tokens, running_chat_server
from tests.server.sdk_events import validate

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
PHOTO = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="


@pytest.fixture(scope="module")
def chat_and_gateway() -> Iterator[tuple[ChatServer, LiveServer]]:
    with running_chat_server() as chat:
        gateway = start_server(
            "--policy", "none", "--tts", "tone", "--responder", "openai", "--responder-url", chat.url,
            "--no-cpu-backend-spare", name="realtime-tools",
        )  # fmt: skip
        yield chat, gateway
        stop_server(gateway)


@asynccontextmanager
async def text_session(gateway: LiveServer, **session: Any) -> AsyncIterator[Any]:
    client = AsyncOpenAI(base_url=gateway.http + "/v1", api_key="unused")
    async with client.realtime.connect(model="gpt-realtime") as conn:
        assert (await recv(conn)).type == "session.created"
        settings = {
            "type": "realtime",
            "output_modalities": ["text"],
            "audio": {"input": {"turn_detection": None}},
        }
        await conn.session.update(session={**settings, **session})
        assert (await recv(conn)).type == "session.updated"
        yield conn


async def recv(conn: Any) -> Any:
    return validate(await asyncio.wait_for(conn.recv_bytes(), 30))


async def until_done(conn: Any) -> list[Any]:
    events = [await recv(conn)]
    while events[-1].type != "response.done":
        events.append(await recv(conn))
    return events


def user_text(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def test_text_and_parallel_tool_calls_then_results_in_order(
    chat_and_gateway: tuple[ChatServer, LiveServer],
) -> None:
    chat, gateway = chat_and_gateway
    paris, rome = json.dumps({"city": "Paris"}), json.dumps({"city": "Rome"})
    calls = [ToolCallReply("get_weather", paris, "call_p"), ToolCallReply("get_weather", rome, "call_r")]
    chat.queue(Reply("Checking both.", calls, cached_tokens=4), Reply("Sunny in Paris, rain in Rome."))
    async with text_session(gateway, tools=[WEATHER], tool_choice="auto") as conn:
        await conn.conversation.item.create(item=user_text("Weather in Paris and Rome?"))
        await conn.response.create()
        events = [e for e in await until_done(conn) if e.type != "rate_limits.updated"]
        assert [e for e in events if e.type == "error"] == []
        sent = chat.requests[-1]
        assert sent["tools"] == [
            {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}
        ]
        assert sent["tool_choice"] == "auto"

        done = events[-1].response
        assert done.status == "completed"
        assert [o.type for o in done.output] == ["message", "function_call", "function_call"]
        assert done.output[0].content[0].text == "Checking both."
        assert [(o.call_id, o.name, o.arguments) for o in done.output[1:]] == [
            ("call_p", "get_weather", paris),
            ("call_r", "get_weather", rome),
        ]
        for call in done.output[1:]:
            deltas = [
                e.delta
                for e in events
                if e.type == "response.function_call_arguments.delta" and e.item_id == call.id
            ]
            assert "".join(deltas) == call.arguments and len(deltas) > 1, "arguments streamed in pieces"
            (args_done,) = [
                e
                for e in events
                if e.type == "response.function_call_arguments.done" and e.item_id == call.id
            ]
            assert args_done.arguments == call.arguments
        assert done.usage.input_tokens == estimate_tokens(sent["messages"])
        assert done.usage.output_tokens > 0
        assert done.usage.input_token_details.cached_tokens == 4

        for call_id, forecast in (("call_p", "sunny"), ("call_r", "rain")):
            output = {
                "type": "function_call_output",
                "call_id": call_id,
                "output": json.dumps({"sky": forecast}),
            }
            await conn.conversation.item.create(item=output)
            assert (await recv(conn)).type == "conversation.item.added"
            assert (await recv(conn)).type == "conversation.item.done"
        await conn.response.create()
        answer = await until_done(conn)
        assert answer[-1].response.status == "completed"
    messages = chat.requests[-1]["messages"]
    assert messages[-3:] == [
        {
            "role": "assistant",
            "content": "Checking both.",
            "tool_calls": [
                {"id": "call_p", "type": "function", "function": {"name": "get_weather", "arguments": paris}},
                {"id": "call_r", "type": "function", "function": {"name": "get_weather", "arguments": rome}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_p", "content": json.dumps({"sky": "sunny"})},
        {"role": "tool", "tool_call_id": "call_r", "content": json.dumps({"sky": "rain"})},
    ]


async def test_images_reach_the_backend_and_a_refusal_fails_only_that_response(
    chat_and_gateway: tuple[ChatServer, LiveServer],
) -> None:
    chat, gateway = chat_and_gateway
    item = {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": PHOTO},
        ],
    }
    async with text_session(gateway) as conn:
        await conn.conversation.item.create(item=item)
        await conn.response.create()
        assert (await until_done(conn))[-1].response.status == "completed"
        assert chat.requests[-1]["messages"][-1] == {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": PHOTO}},
            ],
        }

        chat.fail = (400, "This model does not support image input.")
        try:
            await conn.response.create()
            failed = await until_done(conn)
        finally:
            chat.fail = None
        assert failed[-1].response.status == "failed"
        said = json.dumps([e.model_dump() for e in failed])
        assert "cannot take images" in said, said
        # the session goes on
        await conn.conversation.item.create(item=user_text("Thanks."))
        await conn.response.create()
        assert (await until_done(conn))[-1].response.status == "completed"
