"""MCP tools end to end: the official ``openai`` SDK drives a live gateway (``--responder openai`` on
the scripted chat server, which calls a tool when asked) that is the MCP client of a real MCP server
built with the ``mcp`` package. Every event is validated against the SDK's models (``recv``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from realtime_gw.testing.gateway import LiveServer, free_port, start_server, stop_server
from tests.chat_server import ChatServer, call_when_asked, running_chat_server
from tests.mcp_server import McpTestServer, running_mcp_server
from tests.server.test_realtime_tools import recv, text_session, until_done, user_text

TIMEOUT_S = 1.0
MAX_RESULT_CHARS = 64


@pytest.fixture(scope="module")
def peers() -> Iterator[tuple[ChatServer, McpTestServer, LiveServer]]:
    with running_chat_server(call_when_asked) as chat, running_mcp_server() as mcp:
        gateway = start_server(
            "--policy", "none", "--tts", "tone", "--responder", "openai", "--responder-url", chat.url,
            "--mcp-allowed-urls", mcp.url, "--mcp-allowed-urls", closed_url(),
            "--mcp-timeout-s", str(TIMEOUT_S), "--mcp-max-result-chars", str(MAX_RESULT_CHARS),
            name="realtime-mcp",
        )  # fmt: skip
        yield chat, mcp, gateway
        stop_server(gateway)


def closed_url() -> str:
    """An allowed MCP URL where nothing listens."""
    return f"http://127.0.0.1:{CLOSED_PORT}/mcp"


CLOSED_PORT = free_port()


def mcp_tool(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "calc",
        "server_url": url,
        "allowed_tools": ["add", "explode", "nap", "shout"],
        "require_approval": "never",
        "headers": {"Authorization": "Bearer mcp-secret"},
        **extra,
    }


async def listed(conn: Any) -> Any:
    """The listing's events after session.updated; returns the mcp_list_tools item."""
    added = await recv(conn)
    assert added.type == "conversation.item.added" and added.item.type == "mcp_list_tools"
    assert (await recv(conn)).type == "mcp_list_tools.in_progress"
    completed = await recv(conn)
    assert completed.type == "mcp_list_tools.completed", completed
    done = await recv(conn)
    assert done.type == "conversation.item.done" and done.item.id == completed.item_id
    return done.item


async def ask(conn: Any, text: str) -> list[Any]:
    """A user message and a response; every event until the follow-up response's done."""
    await conn.conversation.item.create(item=user_text(text))
    assert (await recv(conn)).type == "conversation.item.added"
    assert (await recv(conn)).type == "conversation.item.done"
    await conn.response.create()
    first = await until_done(conn)
    if first[-1].response.status != "completed":
        return first
    return first + await until_done(conn)


async def test_list_call_and_answer(peers: tuple[ChatServer, McpTestServer, LiveServer]) -> None:
    chat, mcp, gateway = peers
    async with text_session(gateway, tools=[mcp_tool(mcp.url)]) as conn:
        item = await listed(conn)
        assert [t.name for t in item.tools] == ["add", "explode", "nap", "shout"]  # "secret" filtered out
        assert item.tools[0].input_schema["properties"]["a"]["type"] == "integer"
        assert {h.get("authorization") for h in mcp.headers} == {"Bearer mcp-secret"}
        events = await ask(conn, 'call add {"a": 2, "b": 40}')
        sent_tools = [t["function"]["name"] for t in chat.requests[-2]["tools"]]
        assert sent_tools == ["add", "explode", "nap", "shout"]
        kinds = [e.type for e in events if e.type != "rate_limits.updated"]
        assert kinds.index("response.mcp_call_arguments.done") < kinds.index("response.mcp_call.in_progress")
        assert kinds.index("response.mcp_call.in_progress") < kinds.index("response.mcp_call.completed")
        dones = [e for e in events if e.type == "response.done"]
        assert len(dones) == 2
        call = next(o for o in dones[0].response.output if o.type == "mcp_call")
        assert (call.name, json.loads(call.arguments), call.output, call.server_label) == (
            "add", {"a": 2, "b": 40}, "42", "calc"
        )  # fmt: skip
        answer = dones[1].response.output[0].content[0].text
        assert answer == "The tool said: 42"
        assert chat.requests[-1]["messages"][-1] == {"role": "tool", "tool_call_id": call.id, "content": "42"}
        await conn.response.create()  # the conversation goes on: no more MCP rounds were started
        assert (await until_done(conn))[-1].response.status == "completed"
        assert len([r for r in chat.requests if r["messages"][-1]["role"] == "tool"]) == 1
    assert "mcp-secret" not in gateway.logs()


async def test_a_failing_and_a_slow_tool_fail_their_calls(
    peers: tuple[ChatServer, McpTestServer, LiveServer],
) -> None:
    _, mcp, gateway = peers
    async with text_session(gateway, tools=[mcp_tool(mcp.url)]) as conn:
        await listed(conn)
        events = await ask(conn, "call explode {}")
        assert "response.mcp_call.failed" in [e.type for e in events]
        done = next(e for e in events if e.type == "response.done")
        call = next(o for o in done.response.output if o.type == "mcp_call")
        assert call.error.type == "tool_execution_error" and call.output is None
        assert events[-1].response.output[0].content[0].text.startswith("The tool said: error:")

        began = time.monotonic()
        events = await ask(conn, 'call nap {"seconds": 30}')
        assert time.monotonic() - began < TIMEOUT_S + 5
        done = next(e for e in events if e.type == "response.done")
        call = next(o for o in done.response.output if o.type == "mcp_call")
        assert "did not answer within" in call.error.message


async def test_cancel_during_a_slow_call_ends_the_response_at_once(
    peers: tuple[ChatServer, McpTestServer, LiveServer],
) -> None:
    _, mcp, gateway = peers
    async with text_session(gateway, tools=[mcp_tool(mcp.url)]) as conn:
        await listed(conn)
        await conn.conversation.item.create(item=user_text('call nap {"seconds": 0.8}'))
        await recv(conn), await recv(conn)
        await conn.response.create()
        while (await recv(conn)).type != "response.mcp_call.in_progress":
            pass
        began = time.monotonic()
        await conn.response.cancel()
        rest = await until_done(conn)
        assert time.monotonic() - began < 0.5
        assert rest[-1].response.status == "cancelled"
        assert "response.mcp_call.failed" in [e.type for e in rest]


async def test_a_url_not_on_the_allow_list_is_refused(
    peers: tuple[ChatServer, McpTestServer, LiveServer],
) -> None:
    _, mcp, gateway = peers
    before = len(mcp.headers)
    async with text_session(gateway) as conn:
        other = mcp.url.replace("/mcp", "/elsewhere")
        await conn.session.update(session={"type": "realtime", "tools": [mcp_tool(other)]})
        err = await recv(conn)
        assert err.type == "error" and "not allowed" in err.error.message
        assert err.error.param == "session.tools[0].server_url"
    assert len(mcp.headers) == before  # never connected to


async def test_approval_then_the_call(peers: tuple[ChatServer, McpTestServer, LiveServer]) -> None:
    _, mcp, gateway = peers
    always = {"always": {"tool_names": ["add"]}}
    async with text_session(gateway, tools=[mcp_tool(mcp.url, require_approval=always)]) as conn:
        await listed(conn)
        await conn.conversation.item.create(item=user_text('call add {"a": 1, "b": 2}'))
        await recv(conn), await recv(conn)
        await conn.response.create()
        while (event := await recv(conn)).type != "response.output_item.done":
            assert event.type != "response.mcp_call.in_progress"
        request = event.item
        assert request.type == "mcp_approval_request" and request.name == "add"
        answer = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
        await conn.conversation.item.create(item=answer)
        events = await until_done(conn)
        call = next(o for o in events[-1].response.output if o.type == "mcp_call")
        assert call.approval_request_id == request.id and call.output == "3"
        follow = await until_done(conn)
        assert follow[-1].response.output[0].content[0].text == "The tool said: 3"


async def test_a_long_result_is_cut_and_an_unreachable_server_fails_its_listing(
    peers: tuple[ChatServer, McpTestServer, LiveServer],
) -> None:
    _, mcp, gateway = peers
    async with text_session(gateway, tools=[mcp_tool(mcp.url)]) as conn:
        await listed(conn)
        events = await ask(conn, 'call shout {"times": 5000}')
        done = next(e for e in events if e.type == "response.done")
        call = next(o for o in done.response.output if o.type == "mcp_call")
        assert call.output.startswith("A" * MAX_RESULT_CHARS + " [result cut: 5000 characters")
    async with text_session(gateway, tools=[mcp_tool(closed_url())]) as conn:
        assert (await recv(conn)).type == "conversation.item.added"
        assert (await recv(conn)).type == "mcp_list_tools.in_progress"
        assert (await recv(conn)).type == "mcp_list_tools.failed"
        done = await recv(conn)
        assert done.type == "conversation.item.done" and done.item.tools == []
