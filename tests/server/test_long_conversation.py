"""A long call through the official ``openai`` SDK: 600 turns with ``truncation: "auto"`` keep being
answered, and what the ``openai`` responder sends the chat backend stays under its context budget
(the oldest items leave the model's context, not the client's view)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI

from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.chat_server import ChatServer, estimate_tokens, running_chat_server
from tests.server.sdk_events import validate

TURNS = 600
CONTEXT_TOKENS = 600
"""The backend's context budget given to the gateway: a few dozen turns fit, 600 do not."""
INSTRUCTIONS = "Answer in one short sentence."


@pytest.fixture(scope="module")
def chat_and_gateway() -> Iterator[tuple[ChatServer, LiveServer]]:
    with running_chat_server() as chat:
        gateway = start_server(
            "--policy", "none", "--tts", "tone", "--responder", "openai", "--responder-url", chat.url,
            "--responder-context-tokens", str(CONTEXT_TOKENS), "--no-cpu-backend-spare", name="long-call",
        )  # fmt: skip
        yield chat, gateway
        stop_server(gateway)


async def recv(conn: Any) -> Any:
    return validate(await asyncio.wait_for(conn.recv_bytes(), 30))


async def test_600_turns_with_truncation_auto_stay_under_the_backend_budget(
    chat_and_gateway: tuple[ChatServer, LiveServer],
) -> None:
    chat, gateway = chat_and_gateway
    client = AsyncOpenAI(base_url=gateway.http + "/v1", api_key="unused")
    session = {
        "type": "realtime",
        "instructions": INSTRUCTIONS,
        "output_modalities": ["text"],
        "truncation": "auto",
        "audio": {"input": {"turn_detection": None}},
    }
    first_item_id = None
    async with client.realtime.connect(model="gpt-realtime") as conn:
        assert (await recv(conn)).type == "session.created"
        await conn.session.update(session=session)
        updated = await recv(conn)
        assert updated.type == "session.updated" and updated.session.truncation == "auto"
        for turn in range(TURNS):
            text = f"Turn {turn}: the parcel goes to house number {turn * 7}."
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
            await conn.conversation.item.create(item=item)
            await conn.response.create()
            while (event := await recv(conn)).type != "response.done":
                assert event.type != "error", event
                if event.type == "conversation.item.added" and first_item_id is None:
                    first_item_id = event.item.id
            assert event.response.status == "completed", event.response
            (message,) = event.response.output
            assert message.content[0].text == f"You said: {text}"
        # the client's view still has the first item, though the model no longer sees it
        await conn.conversation.item.retrieve(item_id=first_item_id)
        retrieved = await recv(conn)
        assert retrieved.type == "conversation.item.retrieved", retrieved
        assert retrieved.item.content[0].text.startswith("Turn 0:")

    assert len(chat.requests) == TURNS
    # the backend's window holds the prompt (as the chat server counts it) and the reply it may write
    sizes = [estimate_tokens(r["messages"]) + r["max_tokens"] for r in chat.requests]
    assert max(sizes) <= CONTEXT_TOKENS, f"largest request + reply {max(sizes)} tokens"
    last = chat.requests[-1]["messages"]
    assert last[0] == {"role": "system", "content": INSTRUCTIONS}, "instructions are never truncated"
    assert last[-1]["content"] == f"Turn {TURNS - 1}: the parcel goes to house number {(TURNS - 1) * 7}."
    assert not any("Turn 0:" in str(m["content"]) for m in last), "the oldest turns left the model context"
    assert len(last) > 10, "truncation keeps a useful tail, not just the last turn"
