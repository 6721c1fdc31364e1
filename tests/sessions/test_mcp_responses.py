"""MCP tools beyond the session's main response: the approval timeout, MCP servers named by
``response.create`` (listed first, allow-listed), out-of-band responses that call MCP tools, and a
barge-in on a response that spoke before and after its calls. Every event is validated against the
openai SDK's models (``events``)."""

from __future__ import annotations

from typing import Any

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import TtsFrame
from realtime_gw.sessions.events import (
    CallMcpTool,
    Limits,
    ListMcpTools,
    McpCallDone,
    McpToolsListed,
    ResponseAudio,
    ResponseFinished,
    StartResponse,
    Tick,
)
from tests.sessions.mcp_helpers import MCP, TOOLS, URL, listed_session, model_calls
from tests.sessions.realtime_helpers import FRAME, client, errors, events, of, respond, say, session, types

ASK = {**MCP, "require_approval": "always"}


def test_an_unanswered_approval_expires_the_gateway_denies_it_and_the_response_goes_on() -> None:
    s = session(Limits(mcp_allowed_urls=(URL,), mcp_approval_timeout_s=30.0), output_modalities=["text"])
    (listing,) = of(client(s, {"type": "session.update", "session": {"tools": [ASK]}}), ListMcpTools)
    s.handle(McpToolsListed(listing.item_id, TOOLS), 0.0)
    say(s, "Add")
    start, _ = respond(s)
    asked = model_calls(s, start, ("add", "{}"))
    request = events(asked)[0].item  # type: ignore[attr-defined]
    assert request.type == "mcp_approval_request"
    assert s.handle(Tick(), 29.0) == []  # not yet
    expired = s.handle(Tick(), 30.5)
    assert types(expired)[:2] == ["conversation.item.added", "conversation.item.done"]
    answer = events(expired)[0].item  # type: ignore[attr-defined]
    assert (answer.type, answer.approval_request_id, answer.approve) == ("mcp_approval_response", request.id, False)
    assert "timed out" in answer.reason
    assert of(expired, CallMcpTool) == []  # never made
    (follow,) = of(expired, StartResponse)  # the model hears it was not approved, within the response
    assert follow.messages[-1].content.startswith("error: the user denied this call (the approval timed out")
    assert s.handle(Tick(), 60.0) == []  # nothing waits any more
    late = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    assert of(client(s, {"type": "conversation.item.create", "item": late}), CallMcpTool) == []
    done = s.handle(ResponseFinished(start.response_id, follow.epoch), 61.0)
    final = next(e for e in events(done) if isinstance(e, rt.ResponseDoneEvent))
    assert final.response.status == "completed"
    assert [o.type for o in final.response.output] == ["mcp_approval_request", "message"]


def test_mcp_tools_named_by_response_create_are_listed_first_then_offered() -> None:
    s = session(Limits(mcp_allowed_urls=(URL,)), output_modalities=["text"])
    say(s, "Add")
    effects = client(s, {"type": "response.create", "response": {"tools": [MCP]}})
    assert types(effects) == ["response.created", "conversation.item.added", "mcp_list_tools.in_progress"]
    assert of(effects, StartResponse) == []  # waits for the listing
    (listing,) = of(effects, ListMcpTools)
    listed = s.handle(McpToolsListed(listing.item_id, TOOLS), 0.0)
    (start,) = of(listed, StartResponse)
    assert [t["name"] for t in start.tools] == ["add"]
    (run,) = of(model_calls(s, start, ("add", "{}")), CallMcpTool)
    assert run.server_url == URL
    (follow,) = of(s.handle(McpCallDone(start.response_id, start.epoch, run.item_id, "0"), 0.0), StartResponse)
    assert follow.messages[-1].content == "0"
    s.handle(ResponseFinished(start.response_id, follow.epoch), 0.0)
    # cached for the session: naming it again lists nothing; the session's own tools are untouched
    again = client(s, {"type": "response.create", "response": {"tools": [MCP]}})
    assert of(again, ListMcpTools) == [] and len(of(again, StartResponse)) == 1
    assert s.settings.tools == []


def test_a_response_names_only_allowed_urls() -> None:
    s = session(Limits(mcp_allowed_urls=(URL,)), output_modalities=["text"])
    other = {**MCP, "server_url": "http://127.0.0.1:9/elsewhere"}
    (err,) = errors(client(s, {"type": "response.create", "response": {"tools": [other]}}))
    assert err.error.param == "response.tools[0].server_url" and "not allowed" in err.error.message
    assert s.response is None and len(s.conversation.entries()) == 0


def test_an_out_of_band_response_calls_mcp_tools_and_answers_outside_the_conversation() -> None:
    s = listed_session()
    client(s, {"type": "session.update", "session": {"tools": [ASK]}})
    say(s, "Add")
    before = len(s.conversation.entries())
    asked = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Add 1 and 1"}]}
    out_of_band = {"conversation": "none", "input": [asked]}
    start, _ = respond(s, **out_of_band)
    assert [t["name"] for t in start.tools] == ["add"]
    request = events(model_calls(s, start, ("add", '{"a":1,"b":1}')))[0].item  # type: ignore[attr-defined]
    assert request.type == "mcp_approval_request"
    answer = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    approved = client(s, {"type": "conversation.item.create", "item": answer})
    (run,) = of(approved, CallMcpTool)
    (follow,) = of(s.handle(McpCallDone(start.response_id, start.epoch, run.item_id, "2"), 0.0), StartResponse)
    assert [m.role for m in follow.messages] == ["user", "assistant", "tool"]  # its input, then its call
    assert follow.messages[-1].content == "2"
    done = s.handle(ResponseFinished(start.response_id, follow.epoch), 0.0)
    final = next(e for e in events(done) if isinstance(e, rt.ResponseDoneEvent))
    assert final.response.conversation_id is None
    assert [o.type for o in final.response.output] == ["mcp_approval_request", "mcp_call", "message"]
    kinds = {e.item.type for e in s.conversation.entries()[before:]}
    assert kinds == {"mcp_approval_response"}  # only what the client itself added joined the conversation


def test_barge_in_cuts_the_message_being_heard_and_leaves_the_earlier_one_whole() -> None:
    s = session(Limits(mcp_allowed_urls=(URL,)), output_modalities=["audio"])
    (listing,) = of(client(s, {"type": "session.update", "session": {"tools": [MCP]}}), ListMcpTools)
    s.handle(McpToolsListed(listing.item_id, TOOLS), 0.0)
    say(s, "Add")
    start, _ = respond(s)
    first = events(s.handle(ResponseAudio(start.response_id, start.epoch, TtsFrame(FRAME, text="One moment.")), 0.0))
    s.handle(rt_playback_started(start.response_id), 0.0)
    (run,) = of(model_calls(s, start, ("add", "{}")), CallMcpTool)
    (follow,) = of(s.handle(McpCallDone(start.response_id, start.epoch, run.item_id, "0"), 5.0), StartResponse)
    for _ in range(10):  # 800 ms of the answer, from t = 5 s
        s.handle(ResponseAudio(start.response_id, follow.epoch, TtsFrame(FRAME, text="x")), 5.0)
    cut = events(client(s, {"type": "output_audio_buffer.clear"}, now=5.2))
    truncated = [e for e in cut if isinstance(e, rt.ConversationItemTruncatedEvent)]
    first_item = next(e for e in first if isinstance(e, rt.ResponseOutputItemAddedEvent)).item.id
    assert [t.item_id for t in truncated] != [] and first_item not in [t.item_id for t in truncated]
    assert 150 <= truncated[0].audio_end_ms <= 250  # 200 ms of the second message were heard


def rt_playback_started(response_id: str) -> Any:
    from realtime_gw.sessions.events import PlaybackStarted

    return PlaybackStarted(response_id, 0.0)
