"""MCP tools end to end: the official ``openai`` SDK drives a live gateway (``--responder openai`` on
the scripted chat server, which calls a tool when asked) that is the MCP client of a real MCP server
built with the ``mcp`` package. As on OpenAI's Realtime API, the model's answer to an MCP result comes
within the response that called the tool (one ``response.done``). Every event is validated against
the SDK's models (``recv``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI, BadRequestError
from openai.types.responses import ToolChoiceMcp

from realtime_gw.testing.gateway import LiveServer, free_port, start_server, stop_server
from tests.chat_server import ChatServer, Reply, ToolCallReply, call_when_asked, running_chat_server
from tests.conftest import ROOT
from tests.mcp_server import McpTestServer, running_mcp_server
from tests.server.sdk_events import validate
from tests.server.test_realtime_tools import recv, text_session, until_done, user_text
from tests.server.webrtc.caller import Caller, call

TIMEOUT_S = 3.0
"""Long enough for a listing on a busy box (connect, initialize, list), short for the slow-tool test."""
APPROVAL_TIMEOUT_S = 1.5
MAX_RESULT_CHARS = 64


@pytest.fixture(scope="module")
def peers() -> Iterator[tuple[ChatServer, McpTestServer, LiveServer]]:
    with running_chat_server(call_when_asked) as chat, running_mcp_server() as mcp:
        gateway = start_server(
            "--policy", "none", "--tts", "tone", "--responder", "openai", "--responder-url", chat.url,
            "--mcp-allowed-urls", mcp.url, "--mcp-allowed-urls", closed_url(),
            "--mcp-timeout-s", str(TIMEOUT_S), "--mcp-max-result-chars", str(MAX_RESULT_CHARS),
            "--mcp-approval-timeout-s", str(APPROVAL_TIMEOUT_S),
            "--no-cpu-backend-spare", name="realtime-mcp",
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
    """A user message and a response; every event until its response.done."""
    await conn.conversation.item.create(item=user_text(text))
    assert (await recv(conn)).type == "conversation.item.added"
    assert (await recv(conn)).type == "conversation.item.done"
    await conn.response.create()
    return await until_done(conn)


def answer_of(done: Any) -> str:
    """The text of a response's last output, its message after the MCP calls."""
    message = done.response.output[-1]
    assert message.type == "message"
    return str(message.content[0].text)


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
        assert kinds.index("response.mcp_call.completed") < kinds.index("response.output_text.delta")
        assert kinds.count("response.created") == 1 and kinds.count("response.done") == 1
        assert {e.response_id for e in events if hasattr(e, "response_id")} == {events[-1].response.id}
        call, message = events[-1].response.output
        assert (call.name, json.loads(call.arguments), call.output, call.server_label) == (
            "add", {"a": 2, "b": 40}, "42", "calc"
        )  # fmt: skip
        assert answer_of(events[-1]) == "The tool said: 42"
        added = [e for e in events if e.type == "response.output_item.added"]
        assert [(e.item.type, e.output_index) for e in added] == [("mcp_call", 0), ("message", 1)]
        assert chat.requests[-1]["messages"][-1] == {"role": "tool", "tool_call_id": call.id, "content": "42"}
        await conn.response.create()  # the conversation goes on (the model reads the answered call)
        again = await until_done(conn)
        assert [o.type for o in again[-1].response.output] == ["mcp_call", "message"]
        assert [m["role"] for m in chat.requests[-2]["messages"]] == ["user", "assistant", "tool", "assistant"]
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
        assert answer_of(events[-1]).startswith("The tool said: error:")

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
        assert answer_of(events[-1]) == "The tool said: 3"


async def test_an_unanswered_approval_times_out_and_the_response_goes_on(
    peers: tuple[ChatServer, McpTestServer, LiveServer],
) -> None:
    _, mcp, gateway = peers
    async with text_session(gateway, tools=[mcp_tool(mcp.url, require_approval="always")]) as conn:
        await listed(conn)
        began = time.monotonic()
        events = await ask(conn, 'call add {"a": 1, "b": 2}')
        assert APPROVAL_TIMEOUT_S <= time.monotonic() - began < APPROVAL_TIMEOUT_S + 3
        added = [e.item for e in events if e.type == "conversation.item.added"]
        denial = next(item for item in added if item.type == "mcp_approval_response")
        request = next(o for o in events[-1].response.output if o.type == "mcp_approval_request")
        assert (denial.approval_request_id, denial.approve) == (request.id, False) and "timed out" in denial.reason
        assert [o.type for o in events[-1].response.output] == ["mcp_approval_request", "message"]  # no call
        assert answer_of(events[-1]).startswith("The tool said: error: the user denied this call (the approval")


async def test_mcp_tools_of_an_out_of_band_response_create(
    peers: tuple[ChatServer, McpTestServer, LiveServer],
) -> None:
    _, mcp, gateway = peers
    async with text_session(gateway) as conn:
        asked = {
            "conversation": "none",
            "output_modalities": ["text"],
            "tools": [mcp_tool(mcp.url)],
            "input": [user_text('call add {"a": 20, "b": 22}')],
        }
        await conn.response.create(response=asked)
        events = await until_done(conn)
        kinds = [e.type for e in events]
        assert kinds.index("mcp_list_tools.completed") < kinds.index("response.mcp_call.in_progress")
        assert [o.type for o in events[-1].response.output] == ["mcp_call", "message"]
        assert events[-1].response.conversation_id is None
        assert answer_of(events[-1]) == "The tool said: 42"
        other = mcp_tool(mcp.url.replace("/mcp", "/elsewhere"))
        await conn.response.create(response={**asked, "tools": [other]})
        err = await recv(conn)
        assert err.type == "error" and err.error.param == "response.tools[0].server_url"


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


async def test_a_spoken_response_speaks_the_answer_after_its_call(
    peers: tuple[ChatServer, McpTestServer, LiveServer],
) -> None:
    _, mcp, gateway = peers
    async with text_session(gateway, tools=[mcp_tool(mcp.url)], output_modalities=["audio"]) as conn:
        await listed(conn)
        events = await ask(conn, 'call add {"a": 5, "b": 6}')
        done = events[-1]
        assert done.response.status == "completed" and [o.type for o in done.response.output] == ["mcp_call", "message"]
        assert done.response.output[1].content[0].transcript == "The tool said: 11"
        kinds = [e.type for e in events]
        assert kinds.count("response.done") == 1
        assert kinds.index("response.mcp_call.completed") < kinds.index("response.output_audio.delta")
        audio = [e for e in events if e.type == "response.output_audio.delta"]
        assert audio and {e.output_index for e in audio} == {1}
        assert done.response.usage.output_token_details.audio_tokens > 0


async def test_a_forced_mcp_tool_is_echoed_and_is_what_the_model_must_call(
    peers: tuple[ChatServer, McpTestServer, LiveServer],
) -> None:
    chat, mcp, gateway = peers
    choice = {"type": "mcp", "server_label": "calc", "name": "add"}
    async with text_session(gateway, tools=[mcp_tool(mcp.url)]) as conn:
        await listed(conn)
        await conn.session.update(session={"type": "realtime", "tool_choice": choice})
        updated = await recv(conn)
        assert isinstance(updated.session.tool_choice, ToolChoiceMcp) and updated.session.tool_choice.name == "add"
        chat.queue(Reply("", [ToolCallReply("add", '{"a": 4, "b": 5}')]))  # a model obeys the choice
        events = await ask(conn, "What are four and five?")
        assert chat.requests[-2]["tool_choice"] == {"type": "function", "function": {"name": "add"}}
        assert chat.requests[-1]["tool_choice"] == "auto"  # the forced call was made: now it answers
        assert [o.type for o in events[-1].response.output] == ["mcp_call", "message"]
        assert answer_of(events[-1]) == "The tool said: 9"
        await conn.session.update(session={"type": "realtime", "tool_choice": {**choice, "name": "secret"}})
        err = await recv(conn)
        assert err.type == "error" and err.error.param == "session.tool_choice.name"
        assert "allowed: add, explode, nap, shout" in err.error.message


async def test_a_client_secret_carries_mcp_tools_into_the_session_it_opens(
    peers: tuple[ChatServer, McpTestServer, LiveServer],
) -> None:
    _, mcp, gateway = peers
    minting = AsyncOpenAI(base_url=gateway.http + "/v1", api_key="unused")
    config = {"type": "realtime", "output_modalities": ["text"], "tools": [mcp_tool(mcp.url)]}
    secret = await minting.realtime.client_secrets.create(session=config)  # type: ignore[arg-type]
    assert secret.session.tools[0].headers == {"Authorization": "<redacted>"}  # type: ignore[union-attr]
    ephemeral = AsyncOpenAI(base_url=gateway.http + "/v1", api_key=secret.value)
    async with ephemeral.realtime.connect(model="gpt-realtime") as conn:
        created = await recv(conn)
        assert created.type == "session.created" and created.session.tools[0].server_label == "calc"
        item = await listed(conn)  # listed as the session starts
        assert [t.name for t in item.tools] == ["add", "explode", "nap", "shout"]
        events = await ask(conn, 'call add {"a": 2, "b": 3}')
        assert answer_of(events[-1]) == "The tool said: 5"
    elsewhere = {**config, "tools": [mcp_tool(mcp.url.replace("/mcp", "/elsewhere"))]}
    with pytest.raises(BadRequestError, match="not allowed") as refused:
        await minting.realtime.client_secrets.create(session=elsewhere)  # type: ignore[arg-type]
    assert refused.value.body["param"] == "session.tools[0].server_url"  # type: ignore[index]


async def test_a_calls_session_part_lists_its_mcp_servers_on_the_data_channel(
    peers: tuple[ChatServer, McpTestServer, LiveServer],
) -> None:
    _, mcp, gateway = peers
    caller = Caller(parse=validate)
    try:
        config = {"type": "realtime", "output_modalities": ["text"], "tools": [mcp_tool(mcp.url)]}
        elsewhere = {**config, "tools": [mcp_tool(mcp.url.replace("/mcp", "/elsewhere"))]}
        refused = await call(gateway, caller, multipart=True, session=elsewhere)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "session.tools[0].server_url"
        answered = await call(gateway, caller, multipart=True, session=config)
        assert answered.status_code == 201
        await caller.wait_for(lambda e: e.type == "session.created")
        listed = await caller.wait_for(lambda e: e.type == "conversation.item.done" and e.item.type == "mcp_list_tools")
        assert [t.name for t in listed.item.tools] == ["add", "explode", "nap", "shout"]
    finally:
        await caller.close()


def test_the_mcp_package_loads_on_the_first_request_not_with_the_app() -> None:
    """Half of the gateway's import time; most gateways never call an MCP server."""
    code = "import sys, realtime_gw.app\nprint('mcp loaded:', 'mcp' in sys.modules)\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "mcp loaded: False" in done.stdout, done.stdout
