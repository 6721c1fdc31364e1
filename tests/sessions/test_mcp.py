"""MCP tools on the pure session: the allow-list, the listing (items, events, cache, filter), calls the
gateway runs within a response (events in order, results back to the model, which answers them within
the same response), failures, cancellation, and function tools beside MCP tools. Every event is validated
against the openai SDK's models (``events``)."""

from __future__ import annotations

import json
from typing import Any

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import TtsFrame
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
    StartResponse,
)
from realtime_gw.sessions.mcp import MAX_MODEL_ROUNDS
from realtime_gw.sessions.realtime import RealtimeSession
from tests.sessions.mcp_helpers import MCP, TOOLS, URL, listed_session, mcp_session, model_calls
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


def test_a_call_runs_on_the_gateway_and_the_model_answers_within_the_response() -> None:
    s = listed_session(tool_choice="required")
    say(s, "Add 2 and 3")
    start, _ = respond(s, instructions="Be brief.", metadata={"turn": "7"})
    s.handle(ResponseTextDelta(start.response_id, start.epoch, "Adding."), 0.0)
    effects = model_calls(s, start, ("add", json.dumps({"a": 2, "b": 3})))
    assert types(effects) == [
        "response.output_text.done",  # the round's message is done before its calls
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.output_item.added",
        "conversation.item.added",
        *["response.mcp_call_arguments.delta"] * 4,
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
    ]
    (run,) = of(effects, CallMcpTool)
    assert (run.name, json.loads(run.arguments), run.headers) == ("add", {"a": 2, "b": 3}, MCP["headers"])
    assert events(effects)[4].output_index == 1  # type: ignore[attr-defined]
    assert s.response is not None  # live while the gateway runs the call
    done = s.handle(McpCallDone(start.response_id, start.epoch, run.item_id, "5"), 0.0)
    assert types(done) == ["response.mcp_call.completed", "response.output_item.done", "conversation.item.done"]
    # the model goes on within the same response: no response.done, no second response
    (follow,) = of(done, StartResponse)
    assert follow.response_id == start.response_id and follow.epoch > start.epoch
    assert follow.messages[-2].tool_calls[0].name == "add" and follow.messages[-2].content == "Adding."
    assert follow.messages[0].content == "Be brief." and follow.tool_choice == "auto"  # never forced again
    assert follow.messages[-1].role == "tool" and follow.messages[-1].content == "5"
    assert [t["name"] for t in follow.tools] == ["add"]  # it may call again
    assert s.handle(ResponseTextDelta(start.response_id, start.epoch, "stale"), 0.0) == []
    said = events(s.handle(ResponseTextDelta(follow.response_id, follow.epoch, "It is 5."), 0.0))
    assert [(type(e).__name__, getattr(e, "output_index", None)) for e in said] == [
        ("ResponseOutputItemAddedEvent", 2),
        ("ConversationItemAdded", None),
        ("ResponseContentPartAddedEvent", 2),
        ("ResponseTextDeltaEvent", 2),
    ]
    answered = s.handle(ResponseFinished(follow.response_id, follow.epoch), 0.0)
    assert types(answered).count("response.done") == 1 and of(answered, StartResponse) == []
    final = next(e for e in events(answered) if isinstance(e, rt.ResponseDoneEvent))
    assert final.response.id == start.response_id and final.response.metadata == {"turn": "7"}
    assert [o.type for o in final.response.output] == ["message", "mcp_call", "message"]
    assert final.response.output[1].output == "5" and final.response.output[1].server_label == "calc"
    assert final.response.output[2].content[0].text == "It is 5."
    assert [e.item.type for e in s.conversation.entries()][-3:] == ["message", "mcp_call", "message"]


def test_a_model_that_keeps_calling_answers_in_its_last_round() -> None:
    s = listed_session()
    say(s, "Add forever")
    start, _ = respond(s)
    rounds = [start]
    while rounds[-1].tools:
        current = rounds[-1]
        (run,) = of(model_calls(s, current, ("add", "{}")), CallMcpTool)
        rounds += of(s.handle(McpCallDone(start.response_id, current.epoch, run.item_id, "1"), 0.0), StartResponse)
    assert len(rounds) == MAX_MODEL_ROUNDS and rounds[-1].tool_choice == "none"
    answered = s.handle(ResponseFinished(start.response_id, rounds[-1].epoch), 0.0)
    final = next(e for e in events(answered) if isinstance(e, rt.ResponseDoneEvent))
    assert [o.type for o in final.response.output] == ["mcp_call"] * (MAX_MODEL_ROUNDS - 1) + ["message"]
    assert [o.output_index for o in events(answered) if isinstance(o, rt.ResponseOutputItemAddedEvent)] == [
        MAX_MODEL_ROUNDS - 1
    ]


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
    (follow,) = of(done, StartResponse)
    assert follow.messages[-1].content == "2"
    final = next(e for e in events(s.handle(ResponseFinished(start.response_id, follow.epoch), 0.0)) if isinstance(e, rt.ResponseDoneEvent))
    assert [o.type for o in final.response.output] == ["mcp_approval_request", "mcp_call", "message"]


def test_a_denied_call_is_never_made_and_the_model_hears_so() -> None:
    s, start, effects = asked_approval({"always": {"tool_names": ["add"]}})
    request = events(effects)[0].item  # type: ignore[attr-defined]
    denied = approval(s, request.id, False, "not now")
    assert of(denied, CallMcpTool) == [] and "response.done" not in types(denied)
    (follow,) = of(denied, StartResponse)
    assert follow.messages[-2].tool_calls[0].name == "add"
    assert follow.messages[-1].content == "error: the user denied this call (not now)"
    final = next(e for e in events(s.handle(ResponseFinished(start.response_id, follow.epoch), 0.0)) if isinstance(e, rt.ResponseDoneEvent))
    assert final.response.status == "completed"
    assert [o.type for o in final.response.output] == ["mcp_approval_request", "message"]


def test_a_never_filter_runs_at_once_and_a_bad_approval_is_refused() -> None:
    s, start, effects = asked_approval({"never": {"tool_names": ["add"]}})
    assert len(of(effects, CallMcpTool)) == 1
    (err,) = errors(approval(s, "mcpr_nope", True))
    assert err.error.param == "item.approval_request_id"


def test_a_spoken_response_speaks_again_after_the_call_in_a_new_message() -> None:
    s = session(Limits(mcp_allowed_urls=(URL,)), output_modalities=["audio"])
    (listing,) = of(client(s, {"type": "session.update", "session": {"tools": [MCP]}}), ListMcpTools)
    s.handle(McpToolsListed(listing.item_id, TOOLS), 0.0)
    say(s, "Add")
    start, _ = respond(s)
    s.handle(ResponseAudio(start.response_id, start.epoch, TtsFrame(FRAME, text="Let me add.")), 0.0)
    calling = model_calls(s, start, ("add", "{}"))
    assert types(calling)[:2] == ["response.output_audio.done", "response.output_audio_transcript.done"]
    (run,) = of(calling, CallMcpTool)
    (follow,) = of(s.handle(McpCallDone(start.response_id, start.epoch, run.item_id, "0"), 0.0), StartResponse)
    assert follow.audio and follow.messages[-2].content == "Let me add."
    playback = s.playbacks.get(start.response_id)
    assert playback is not None
    playback.started_at = 0.0  # its first frame left at once: all of it was heard long before
    spoken = events(s.handle(ResponseAudio(start.response_id, follow.epoch, TtsFrame(FRAME, text="Zero.")), 10.0))
    second = next(e for e in spoken if isinstance(e, rt.ResponseAudioDeltaEvent))
    assert second.output_index == 2 and second.item_id != events(calling)[0].item_id  # type: ignore[attr-defined]
    assert playback.played_ms(10.0) < playback.audio_ms  # the new message is heard from now on
    finished = s.handle(ResponseFinished(start.response_id, follow.epoch), 10.0)
    assert of(finished, AwaitDelivery) and "response.done" not in types(finished)
    delivered = s.handle(AudioDelivered(start.response_id, follow.epoch), 10.0)
    final = next(e for e in events(delivered) if isinstance(e, rt.ResponseDoneEvent))
    assert [o.type for o in final.response.output] == ["message", "mcp_call", "message"]
    assert final.response.output[2].content[0].transcript == "Zero."
    assert final.response.usage.output_token_details.audio_tokens > 0  # type: ignore[union-attr]
