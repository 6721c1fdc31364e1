"""MCP tools on the pure session: the allow-list, the listing (items, events, cache, filter), calls the
gateway runs within a response (events in order, results back to the model, a follow-up response that
answers them), failures, cancellation, and function tools beside MCP tools. Every event is validated
against the openai SDK's models (``events``)."""

from __future__ import annotations

import json
from typing import Any

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import ToolCallDelta, TtsFrame
from realtime_gw.sessions.events import (
    AudioDelivered,
    AwaitDelivery,
    CallMcpTool,
    CancelResponse,
    Limits,
    ListMcpTools,
    McpCallDone,
    McpToolsListed,
    ResponseAudio,
    ResponseFinished,
    ResponseTextDelta,
    ResponseToolCall,
    StartResponse,
)
from realtime_gw.sessions.realtime import RealtimeSession
from tests.sessions.realtime_helpers import (
    FRAME,
    WEATHER,
    client,
    errors,
    events,
    of,
    respond,
    say,
    session,
    types,
)

URL = "http://127.0.0.1:9/mcp"
TOOLS = [
    {"name": "add", "description": "Add two numbers.", "input_schema": {"type": "object", "properties": {}}},
    {"name": "secret", "description": "Not allowed.", "input_schema": {"type": "object"}},
]
MCP = {
    "type": "mcp",
    "server_label": "calc",
    "server_url": URL,
    "allowed_tools": ["add"],
    "require_approval": "never",
    "headers": {"Authorization": "Bearer hush"},
}


def mcp_session(**settings: Any) -> tuple[RealtimeSession, list[Any]]:
    s = session(Limits(mcp_allowed_urls=(URL + "/",)), output_modalities=["text"])
    return s, client(s, {"type": "session.update", "session": {"tools": [MCP], **settings}})


def listed_session(**settings: Any) -> RealtimeSession:
    s, effects = mcp_session(**settings)
    (listing,) = of(effects, ListMcpTools)
    events(s.handle(McpToolsListed(listing.item_id, TOOLS), 0.0))
    return s


def model_calls(s: RealtimeSession, start: StartResponse, *calls: tuple[str, str]) -> list[Any]:
    out: list[Any] = []
    for index, (name, args) in enumerate(calls):
        out += s.handle(
            ResponseToolCall(start.response_id, start.epoch, ToolCallDelta(index, "", f"call_{index}", name)),
            0,
        )
        for i in range(0, len(args), 4):
            out += s.handle(
                ResponseToolCall(start.response_id, start.epoch, ToolCallDelta(index, args[i : i + 4])), 0
            )
    return out + s.handle(ResponseFinished(start.response_id, start.epoch), 0.0)


def test_a_url_not_on_the_allow_list_is_refused_and_never_listed() -> None:
    s = session(output_modalities=["text"])
    effects = client(s, {"type": "session.update", "session": {"tools": [MCP]}})
    (err,) = errors(effects)
    assert "not allowed" in err.error.message and err.error.param == "session.tools[0].server_url"
    assert of(effects, ListMcpTools) == [] and s.settings.tools == []
    (err,) = errors(
        client(
            s, {"type": "session.update", "session": {"tools": [{**MCP, "require_approval": "sometimes"}]}}
        )
    )
    assert err.error.param == "session.tools[0].require_approval"


def test_listing_items_events_filter_and_cache() -> None:
    s, effects = mcp_session()
    assert types(effects) == ["session.updated", "conversation.item.added", "mcp_list_tools.in_progress"]
    updated = events(effects)[0]
    assert updated.session.tools[0]["headers"] == {"Authorization": "<redacted>"}  # type: ignore[attr-defined]
    (listing,) = of(effects, ListMcpTools)
    assert listing.server_url == URL and listing.headers == {"Authorization": "Bearer hush"}
    done = events(s.handle(McpToolsListed(listing.item_id, TOOLS), 0.0))
    assert [type(e).__name__ for e in done] == ["McpListToolsCompleted", "ConversationItemDone"]
    item = done[1].item  # type: ignore[attr-defined]
    assert item.type == "mcp_list_tools" and item.server_label == "calc"
    assert [t["name"] for t in item.tools] == ["add"]  # allowed_tools
    # the same server again: cached, not listed again
    again = client(s, {"type": "session.update", "session": {"tools": [MCP, WEATHER]}})
    assert types(again) == ["session.updated"] and of(again, ListMcpTools) == []
    say(s, "Add 2 and 3")
    start, _ = respond(s)
    assert [t["name"] for t in start.tools] == ["get_weather", "add"]


def test_a_failed_listing_offers_nothing() -> None:
    s, effects = mcp_session()
    (listing,) = of(effects, ListMcpTools)
    assert types(s.handle(McpToolsListed(listing.item_id, None, "unreachable"), 0.0)) == [
        "mcp_list_tools.failed",
        "conversation.item.done",
    ]
    say(s, "hi")
    start, _ = respond(s)
    assert start.tools == []
    retry = client(s, {"type": "session.update", "session": {"tools": [MCP]}})
    assert len(of(retry, ListMcpTools)) == 1  # a failed listing is tried again


def test_a_call_runs_on_the_gateway_and_the_model_answers_its_result() -> None:
    s = listed_session(tool_choice="required")
    say(s, "Add 2 and 3")
    start, _ = respond(s, instructions="Be brief.", metadata={"turn": "7"})
    s.handle(ResponseTextDelta(start.response_id, start.epoch, "Adding."), 0.0)
    effects = model_calls(s, start, ("add", json.dumps({"a": 2, "b": 3})))
    assert types(effects) == [
        "response.output_item.added",
        "conversation.item.added",
        *["response.mcp_call_arguments.delta"] * 4,
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
    ]
    (run,) = of(effects, CallMcpTool)
    assert (run.name, json.loads(run.arguments), run.headers) == ("add", {"a": 2, "b": 3}, MCP["headers"])
    assert events(effects)[0].output_index == 1  # type: ignore[attr-defined]
    assert s.response is not None  # live while the gateway runs the call
    done = s.handle(McpCallDone(start.response_id, start.epoch, run.item_id, "5"), 0.0)
    names = types(done)
    assert names[:3] == ["response.mcp_call.completed", "response.output_item.done", "conversation.item.done"]
    final = next(e for e in events(done) if isinstance(e, rt.ResponseDoneEvent))
    assert [o.type for o in final.response.output] == ["message", "mcp_call"]
    assert final.response.output[1].output == "5" and final.response.output[1].server_label == "calc"
    assert names.count("response.created") == 1  # the follow-up that answers the result
    (follow,) = of(done, StartResponse)
    assert follow.messages[-2].tool_calls[0].name == "add" and follow.messages[-2].content == "Adding."
    assert (
        follow.messages[0].content == "Be brief." and follow.tool_choice == "auto"
    )  # asked as the first, never forced
    created = next(e for e in events(done) if isinstance(e, rt.ResponseCreatedEvent))
    assert created.response.metadata == {"turn": "7"}
    assert follow.messages[-1].role == "tool" and follow.messages[-1].content == "5"
    s.handle(ResponseTextDelta(follow.response_id, follow.epoch, "It is 5."), 0.0)
    answered = s.handle(ResponseFinished(follow.response_id, follow.epoch), 0.0)
    assert "response.done" in types(answered) and of(answered, StartResponse) == []  # no further round


def test_a_failing_call_fails_its_item_and_the_model_hears_the_error() -> None:
    s = listed_session()
    say(s, "Add")
    start, _ = respond(s)
    (run,) = of(model_calls(s, start, ("add", "{}")), CallMcpTool)
    error = {"type": "tool_execution_error", "message": "boom"}
    done = s.handle(McpCallDone(start.response_id, start.epoch, run.item_id, None, error), 0.0)
    assert types(done)[0] == "response.mcp_call.failed"
    item = events(done)[1].item  # type: ignore[attr-defined]
    assert item.error == error and item.output is None
    (follow,) = of(done, StartResponse)
    assert follow.messages[-1].content == "error: boom"


def test_cancel_during_a_call_ends_the_response_at_once() -> None:
    s = listed_session()
    say(s, "Add")
    start, _ = respond(s)
    (run,) = of(model_calls(s, start, ("add", "{}")), CallMcpTool)
    effects = client(s, {"type": "response.cancel"})
    assert CancelResponse(start.response_id, start.epoch) in effects
    names = types(effects)
    assert names[0] == "response.mcp_call.failed" and names[-2:] == ["response.done", "rate_limits.updated"]
    assert events(effects)[-2].response.status == "cancelled"  # type: ignore[attr-defined]
    assert s.response is None and of(effects, StartResponse) == []
    assert s.handle(McpCallDone(start.response_id, start.epoch, run.item_id, "late"), 0.0) == []


def test_function_calls_beside_mcp_calls_go_to_the_client() -> None:
    s = listed_session()
    client(s, {"type": "session.update", "session": {"tools": [MCP, WEATHER]}})
    say(s, "Both")
    start, _ = respond(s)
    (run,) = of(model_calls(s, start, ("add", "{}"), ("get_weather", '{"city":"Paris"}')), CallMcpTool)
    done = s.handle(McpCallDone(start.response_id, start.epoch, run.item_id, "5"), 0.0)
    final = next(e for e in events(done) if isinstance(e, rt.ResponseDoneEvent))
    assert [o.type for o in final.response.output] == ["mcp_call", "function_call"]
    added = [e for e in events(done) if isinstance(e, rt.ResponseOutputItemAddedEvent)]
    assert [(e.item.type, e.output_index) for e in added] == [("function_call", 1)]
    assert of(done, StartResponse) == []  # the client runs get_weather, then asks again


def approval(s: RealtimeSession, request_id: str, approve: bool, reason: str | None = None) -> list[Any]:
    item = {"type": "mcp_approval_response", "approval_request_id": request_id, "approve": approve}
    return client(
        s, {"type": "conversation.item.create", "item": {**item, **({"reason": reason} if reason else {})}}
    )


def asked_approval(require: Any) -> tuple[RealtimeSession, StartResponse, list[Any]]:
    s = session(Limits(mcp_allowed_urls=(URL,)), output_modalities=["text"])
    effects = client(
        s, {"type": "session.update", "session": {"tools": [{**MCP, "require_approval": require}]}}
    )
    (listing,) = of(effects, ListMcpTools)
    s.handle(McpToolsListed(listing.item_id, TOOLS), 0.0)
    say(s, "Add 1 and 1")
    start, _ = respond(s)
    return s, start, model_calls(s, start, ("add", '{"a": 1, "b": 1}'))


def test_an_approved_call_runs_and_names_its_request() -> None:
    s, start, effects = asked_approval("always")
    assert types(effects) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.output_item.done",
        "conversation.item.done",
    ]
    request = events(effects)[0].item  # type: ignore[attr-defined]
    assert (request.type, request.name, request.server_label) == ("mcp_approval_request", "add", "calc")
    assert of(effects, CallMcpTool) == [] and s.response is not None  # waits for the client
    approved = approval(s, request.id, True)
    assert types(approved)[:3] == [
        "conversation.item.added",
        "conversation.item.done",
        "response.output_item.added",
    ]
    call_item = events(approved)[2].item  # type: ignore[attr-defined]
    assert call_item.type == "mcp_call" and call_item.approval_request_id == request.id
    assert events(approved)[2].output_index == 1  # type: ignore[attr-defined]
    (run,) = of(approved, CallMcpTool)
    done = s.handle(McpCallDone(start.response_id, start.epoch, run.item_id, "2"), 0.0)
    final = next(e for e in events(done) if isinstance(e, rt.ResponseDoneEvent))
    assert [o.type for o in final.response.output] == ["mcp_approval_request", "mcp_call"]
    (follow,) = of(done, StartResponse)
    assert follow.messages[-1].content == "2"


def test_a_denied_call_is_never_made_and_the_model_hears_so() -> None:
    s, start, effects = asked_approval({"always": {"tool_names": ["add"]}})
    request = events(effects)[0].item  # type: ignore[attr-defined]
    denied = approval(s, request.id, False, "not now")
    assert of(denied, CallMcpTool) == []
    final = next(e for e in events(denied) if isinstance(e, rt.ResponseDoneEvent))
    assert final.response.status == "completed"
    assert [o.type for o in final.response.output] == ["mcp_approval_request"]
    (follow,) = of(denied, StartResponse)
    assert follow.messages[-2].tool_calls[0].name == "add"
    assert follow.messages[-1].content == "error: the user denied this call (not now)"


def test_a_never_filter_runs_at_once_and_a_bad_approval_is_refused() -> None:
    s, start, effects = asked_approval({"never": {"tool_names": ["add"]}})
    assert len(of(effects, CallMcpTool)) == 1
    (err,) = errors(approval(s, "mcpr_nope", True))
    assert err.error.param == "item.approval_request_id"


def test_a_spoken_response_delivers_its_audio_after_the_call_then_answers() -> None:
    s = session(Limits(mcp_allowed_urls=(URL,)), output_modalities=["audio"])
    (listing,) = of(client(s, {"type": "session.update", "session": {"tools": [MCP]}}), ListMcpTools)
    s.handle(McpToolsListed(listing.item_id, TOOLS), 0.0)
    say(s, "Add")
    start, _ = respond(s)
    s.handle(ResponseAudio(start.response_id, start.epoch, TtsFrame(FRAME, text="Let me add.")), 0.0)
    (run,) = of(model_calls(s, start, ("add", "{}")), CallMcpTool)
    done = s.handle(McpCallDone(start.response_id, start.epoch, run.item_id, "0"), 0.0)
    assert of(done, AwaitDelivery) and "response.done" not in types(done)
    delivered = s.handle(AudioDelivered(start.response_id, start.epoch), 0.0)
    final = next(e for e in events(delivered) if isinstance(e, rt.ResponseDoneEvent))
    assert [o.type for o in final.response.output] == ["message", "mcp_call"]
    (follow,) = of(delivered, StartResponse)
    assert follow.audio and follow.messages[-2].content == "Let me add."
