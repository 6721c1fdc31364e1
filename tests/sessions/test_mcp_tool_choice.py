"""An MCP ``tool_choice`` (``{"type": "mcp", "server_label", "name"?}``) on the pure session: checked
against the tools and the server's listing, echoed as the SDK types it, and handed to the model as the
choice of that tool's function (or, naming no tool, of the server's tools only); ``connector_id`` and
``tunnel_id`` are refused, ``authorization`` becomes the server's bearer token. Every event is
validated against the openai SDK's models (``events``)."""

from __future__ import annotations

import json
from typing import Any

from openai.types.realtime import SessionUpdatedEvent
from openai.types.responses import ToolChoiceMcp

from realtime_gw.protocols import realtime as rt
from realtime_gw.sessions.events import (
    CallMcpTool,
    Limits,
    ListMcpTools,
    McpCallDone,
    McpToolsListed,
    StartResponse,
)
from realtime_gw.sessions.realtime import RealtimeSession
from tests.sessions.mcp_helpers import MCP, TOOLS, URL, listed_session, mcp_session, model_calls
from tests.sessions.realtime_helpers import WEATHER, client, errors, events, of, respond, say, session, types

CHOOSE_ADD = {"type": "mcp", "server_label": "calc", "name": "add"}


def update(s: Any, **fields: Any) -> list[Any]:
    return client(s, {"type": "session.update", "session": fields})


def test_a_session_choice_is_echoed_and_makes_the_model_call_that_tool() -> None:
    s = listed_session(tool_choice=CHOOSE_ADD)
    updated = events(update(s, tools=[MCP, WEATHER]))[0]
    wire = SessionUpdatedEvent.model_validate_json(rt.encode_server_event(updated))
    assert isinstance(wire.session.tool_choice, ToolChoiceMcp)  # type: ignore[union-attr]
    assert (wire.session.tool_choice.server_label, wire.session.tool_choice.name) == ("calc", "add")  # type: ignore[union-attr]
    say(s, "What is 2 and 3?")
    start, _ = respond(s)
    assert start.tool_choice == {"type": "function", "name": "add"}
    assert [t["name"] for t in start.tools] == ["get_weather", "add"]
    effects = model_calls(s, start, ("add", json.dumps({"a": 2, "b": 3})))
    (run,) = of(effects, CallMcpTool)
    (follow,) = of(s.handle(McpCallDone(start.response_id, start.epoch, run.item_id, "5"), 0.0), StartResponse)
    assert follow.tool_choice == "auto"  # the forced call was made: the model answers its result


def test_a_choice_of_a_server_alone_offers_only_its_tools_and_requires_a_call() -> None:
    s = listed_session(tools=[MCP, WEATHER], tool_choice={"type": "mcp", "server_label": "calc"})
    assert s.settings.tool_choice == {"type": "mcp", "server_label": "calc", "name": None}
    echoed = events(update(s, tool_choice={"type": "mcp", "server_label": "calc"}))[0]  # validated: name null
    assert echoed.session.tool_choice == {"type": "mcp", "server_label": "calc", "name": None}  # type: ignore[union-attr]
    say(s, "hi")
    start, _ = respond(s)
    assert start.tool_choice == "required" and [t["name"] for t in start.tools] == ["add"]
    # a response's own choice wins over the session's: a function, with every tool offered again
    client(s, {"type": "response.cancel"})
    start, _ = respond(s, tool_choice={"type": "function", "name": "get_weather"})
    assert start.tool_choice == {"type": "function", "name": "get_weather"}
    assert [t["name"] for t in start.tools] == ["get_weather", "add"]


def test_an_unknown_server_or_tool_is_refused_naming_what_exists() -> None:
    s = listed_session()
    (err,) = errors(update(s, tool_choice={"type": "mcp", "server_label": "maths", "name": "add"}))
    assert err.error.param == "session.tool_choice.server_label"
    assert "'maths'" in err.error.message and "MCP servers: 'calc'" in err.error.message
    (err,) = errors(update(s, tool_choice={"type": "mcp", "server_label": "calc", "name": "secret"}))
    assert err.error.param == "session.tool_choice.name" and "allowed: add" in err.error.message
    # no filter: the server's cached listing decides
    open_server = {**MCP, "allowed_tools": None}
    effects = update(s, tools=[open_server])
    (listing,) = of(effects, ListMcpTools)
    s.handle(McpToolsListed(listing.item_id, TOOLS), 0.0)
    (err,) = errors(update(s, tool_choice={"type": "mcp", "server_label": "calc", "name": "mul"}))
    assert err.error.param == "session.tool_choice.name"
    assert "does not list (it lists: add, secret)" in err.error.message
    assert s.settings.tool_choice == "auto"  # nothing changed
    say(s, "hi")
    refused = client(s, {"type": "response.create", "response": {"tool_choice": {**CHOOSE_ADD, "server_label": "x"}}})
    (err,) = errors(refused)
    assert err.error.param == "response.tool_choice.server_label" and s.response is None


def test_a_tool_the_listing_lacks_fails_the_response_when_the_listing_ends() -> None:
    s, effects = mcp_session(tools=[{**MCP, "allowed_tools": None}])
    (listing,) = of(effects, ListMcpTools)
    say(s, "hi")
    chosen = client(s, {"type": "response.create", "response": {"tool_choice": {**CHOOSE_ADD, "name": "mul"}}})
    assert of(chosen, StartResponse) == []  # it waits for the listing
    ended = s.handle(McpToolsListed(listing.item_id, TOOLS), 0.0)
    assert of(ended, StartResponse) == []
    (err,) = errors(ended)
    assert err.error.param == "tool_choice" and "it lists: add, secret" in err.error.message
    done = events(ended)[-2]
    assert isinstance(done, rt.ResponseDoneEvent) and done.response.status == "failed"
    assert s.response is None  # the session goes on
    start, _ = respond(s, tool_choice=CHOOSE_ADD)
    assert start.tool_choice == {"type": "function", "name": "add"}


def test_a_choice_of_a_server_whose_listing_failed_fails_its_response() -> None:
    s, effects = mcp_session(tool_choice={"type": "mcp", "server_label": "calc"})
    (listing,) = of(effects, ListMcpTools)
    s.handle(McpToolsListed(listing.item_id, None, "unreachable"), 0.0)
    say(s, "hi")
    created = client(s, {"type": "response.create"})
    assert "could not be listed" in errors(created)[0].error.message
    assert types(created)[-2:] == ["response.done", "rate_limits.updated"]


def test_an_out_of_band_response_may_force_its_own_server() -> None:
    s = session(Limits(mcp_allowed_urls=(URL,)), output_modalities=["text"])
    asked = {"conversation": "none", "tools": [MCP], "tool_choice": CHOOSE_ADD, "input": []}
    created = client(s, {"type": "response.create", "response": asked})
    (listing,) = of(created, ListMcpTools)
    (start,) = of(s.handle(McpToolsListed(listing.item_id, TOOLS), 0.0), StartResponse)
    assert start.tool_choice == {"type": "function", "name": "add"} and [t["name"] for t in start.tools] == ["add"]


def test_hosted_connectors_and_tunnels_are_refused_naming_the_field() -> None:
    s = session(Limits(mcp_allowed_urls=(URL,)), output_modalities=["text"])
    drive = {"type": "mcp", "server_label": "drive", "connector_id": "connector_googledrive"}
    (err,) = errors(update(s, tools=[drive]))
    assert err.error.param == "session.tools[0].connector_id"
    assert "connector_googledrive" in err.error.message and "server_url" in err.error.message
    (err,) = errors(update(s, tools=[{**drive, "connector_id": None, "tunnel_id": "tun_1"}]))
    assert err.error.param == "session.tools[0].tunnel_id" and "server_url" in err.error.message
    (err,) = errors(client(s, {"type": "response.create", "response": {"tools": [drive]}}))
    assert err.error.param == "response.tools[0].connector_id"


def test_an_oauth_token_reaches_the_server_as_a_bearer_and_is_never_echoed() -> None:
    s = session(Limits(mcp_allowed_urls=(URL,)), output_modalities=["text"])
    tool = {**MCP, "headers": None, "authorization": "oauth-token"}
    effects = update(s, tools=[tool])
    (listing,) = of(effects, ListMcpTools)
    assert listing.headers == {"Authorization": "Bearer oauth-token"}
    assert events(effects)[0].session.tools[0]["headers"] == {"Authorization": "<redacted>"}  # type: ignore[union-attr]
    assert "oauth-token" not in str(events(effects))
    (err,) = errors(update(s, tools=[{**MCP, "authorization": "oauth-token"}]))  # and a header of its own
    assert err.error.param == "session.tools[0].authorization"


def test_a_config_given_before_the_session_starts_is_listed_when_it_starts() -> None:
    """A client secret's session config (or a call's ``session`` part) is applied before ``start``:
    nothing is sent or listed then; ``start`` shows it in ``session.created`` and lists its servers."""
    s = RealtimeSession("sess_preset", Limits(mcp_allowed_urls=(URL,)))
    before = s.handle(rt.SessionUpdateEvent(session=rt.SessionParams(tools=[MCP], tool_choice=CHOOSE_ADD)), 0.0)
    assert of(before, ListMcpTools) == [] and s.conversation.last_id() is None
    started = s.start(0.0)
    assert types(started) == ["session.created", "conversation.item.added", "mcp_list_tools.in_progress"]
    assert events(started)[0].session.tool_choice == CHOOSE_ADD  # type: ignore[union-attr]
    (listing,) = of(started, ListMcpTools)
    assert listing.server_url == URL
    s.handle(McpToolsListed(listing.item_id, TOOLS), 0.0)
    say(s, "hi")
    start, _ = respond(s)
    assert start.tool_choice == {"type": "function", "name": "add"}
    refused = RealtimeSession("sess_refused", Limits())  # the allow-list still applies
    (err,) = errors(refused.handle(rt.SessionUpdateEvent(session=rt.SessionParams(tools=[MCP])), 0.0))
    assert "not allowed" in err.error.message and refused.settings.tools == []


def test_a_choice_reaches_the_server_it_names_when_another_lists_the_same_tool() -> None:
    """Two servers list ``add``: the forced one's tool is the one offered and called (without a choice,
    the earlier server's)."""
    staging = {**MCP, "server_label": "staging", "headers": {"Authorization": "Bearer stage"}}
    s, effects = mcp_session(tools=[MCP, staging], tool_choice={"type": "mcp", "server_label": "staging", "name": "add"})
    for listing in of(effects, ListMcpTools):
        s.handle(McpToolsListed(listing.item_id, TOOLS), 0.0)
    say(s, "What is 2 and 3?")
    start, _ = respond(s)
    assert start.tool_choice == {"type": "function", "name": "add"}
    (run,) = of(model_calls(s, start, ("add", json.dumps({"a": 2, "b": 3}))), CallMcpTool)
    assert run.headers["Authorization"] == "Bearer stage"  # staging's call, not calc's


def test_a_server_label_that_is_not_a_name_is_refused_as_a_bad_value() -> None:
    s = listed_session()
    (err,) = errors(update(s, tool_choice={"type": "mcp", "server_label": ["calc"]}))
    assert err.error.param == "session.tool_choice.server_label" and err.error.code == "invalid_value"
