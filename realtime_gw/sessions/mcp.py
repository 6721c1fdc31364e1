"""MCP tools of a realtime session: the servers it names, their listed tools, and the calls a
response makes to them. Pure: the transport lists and calls (``ListMcpTools``, ``CallMcpTool``) and
feeds the answers back (``McpToolsListed``, ``McpCallDone``).

- At ``session.update`` each ``{"type": "mcp", ...}`` tool whose URL is on the gateway's allow-list
  (else the update is refused and nothing is connected to) is listed once: an ``mcp_list_tools`` item
  joins the conversation (``conversation.item.added``), ``mcp_list_tools.in_progress``, then
  ``mcp_list_tools.completed`` (or ``.failed``) and ``conversation.item.done`` with the tools. The
  listing is cached for the session: an update naming the same server (URL, headers, filter) again
  does not list it again (unless its listing failed: that is how a client retries).
- The listed tools (``allowed_tools`` applied) reach the responder model as functions under their own
  names (a function tool of the same name wins). When the model calls one, the response, once its
  text is generated, announces an ``mcp_call`` item (``response.output_item.added``, the
  ``response.mcp_call_arguments.delta``/``.done`` events, ``response.mcp_call.in_progress``) and stays
  live while the gateway runs the call; ``.completed`` or ``.failed`` and ``response.output_item.done``
  follow with its output or error. A call that ``require_approval`` covers is first announced as an
  ``mcp_approval_request`` item, and the response waits for the client's ``mcp_approval_response``
  item: approved, the call runs (its ``mcp_call`` names the request); denied, it is never made and
  the model hears so (``context.py``). Then the response completes, and when it called MCP tools only
  (no client function call is outstanding) the gateway creates the next response itself, which reads
  the results and answers (at most ``MAX_MCP_ROUNDS`` in a row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from realtime_gw.protocols import realtime as rt
from realtime_gw.protocols import realtime_mcp as mcp_rt
from realtime_gw.sessions.conversation import Conversation
from realtime_gw.sessions.events import CallMcpTool, Effect, Ids, ListMcpTools, McpCallDone, McpToolsListed
from realtime_gw.sessions.settings import SessionError
from realtime_gw.sessions.tools import FunctionCall

if TYPE_CHECKING:
    from realtime_gw.sessions.response_state import LiveResponse

MAX_MCP_ROUNDS = 8
"""Responses the gateway creates in a row to answer MCP results (a model that keeps calling stops)."""


def check_allowed(tools: list[dict[str, Any]], allowed_urls: tuple[str, ...]) -> None:
    """Every MCP server URL is on the gateway's allow-list (compared without a trailing ``/``)."""
    allowed = {u.rstrip("/") for u in allowed_urls}
    for i, tool in enumerate(tools):
        if tool["type"] == "mcp" and tool["server_url"].rstrip("/") not in allowed:
            raise SessionError(
                f"MCP server URL '{tool['server_url']}' is not allowed by this gateway (mcp_allowed_urls)",
                "invalid_value",
                f"session.tools[{i}].server_url",
            )


def check_approval(item: rt.Item, conversation: Conversation) -> None:
    """A client's ``mcp_approval_response`` answers an ``mcp_approval_request`` of the conversation."""
    asked = item.approval_request_id
    if item.type != "mcp_approval_response":
        return
    if asked not in conversation or conversation.get(asked).item.type != "mcp_approval_request":  # type: ignore[arg-type]
        raise SessionError(
            f"approval_request_id '{asked}' names no mcp_approval_request",
            "invalid_value",
            "item.approval_request_id",
        )


@dataclass(slots=True)
class McpServer:
    label: str
    url: str
    headers: dict[str, str]
    allowed: list[str] | None
    item_id: str
    approval: Any = "always"
    """``require_approval``: "always", "never" or {"always": {"tool_names"}, "never": {"tool_names"}}."""
    tools: list[dict[str, Any]] | None = None
    """Listed tools (the filter applied); None while listing or after a failed listing."""
    failed: bool = False
    """Its listing failed: the next update naming it lists it again."""

    def needs_approval(self, name: str) -> bool:
        """A name under ``never`` runs at once; otherwise (named under ``always``, or not named) the
        client is asked first."""
        if isinstance(self.approval, dict):
            return name not in (self.approval.get("never") or {}).get("tool_names", [])
        return bool(self.approval != "never")

    def key(self) -> tuple[Any, ...]:
        return (self.url, sorted(self.headers.items()), self.allowed)


class McpServers:
    """The session's MCP servers by label, with their cached listings."""

    def __init__(self, ids: Ids, conversation: Conversation) -> None:
        self.ids = ids
        self.conversation = conversation
        self.by_label: dict[str, McpServer] = {}

    def configure(self, tools: list[dict[str, Any]]) -> list[Effect]:
        """The session's tools changed: list the servers not listed yet (or listed otherwise)."""
        wanted: dict[str, McpServer] = {}
        out: list[Effect] = []
        for t in tools:
            if t["type"] != "mcp":
                continue
            server = McpServer(t["server_label"], t["server_url"], t["headers"], t["allowed_tools"], "")
            server.approval = t["require_approval"]
            old = self.by_label.get(server.label)
            if old is not None and old.key() == server.key() and not old.failed:
                old.approval = server.approval
                wanted[server.label] = old  # cached
                continue
            server.item_id = self.ids.new("item")
            wanted[server.label] = server
            item = self._item(server)
            previous = self.conversation.last_id()
            self.conversation.add(item, force=True)
            out += [
                self.ids.send(rt.ConversationItemAdded(item=item, previous_item_id=previous)),
                self.ids.send(mcp_rt.McpListToolsInProgress(item_id=server.item_id)),
                ListMcpTools(server.item_id, server.url, server.headers),
            ]
        self.by_label = wanted
        return out

    def _item(self, server: McpServer) -> rt.Item:
        return rt.Item(
            type="mcp_list_tools",
            id=server.item_id,
            server_label=server.label,
            tools=list(server.tools or []),
        )

    def listed(self, ev: McpToolsListed) -> list[Effect]:
        server = next((s for s in self.by_label.values() if s.item_id == ev.item_id), None)
        if server is None:
            return []  # the session dropped that server meanwhile
        server.failed = ev.tools is None
        if ev.tools is not None:
            server.tools = [t for t in ev.tools if server.allowed is None or t["name"] in server.allowed]
        item = self._item(server)
        if ev.item_id in self.conversation:
            self.conversation.get(ev.item_id).item = item
        previous = self.conversation.previous_id(ev.item_id) if ev.item_id in self.conversation else None
        done = mcp_rt.McpListToolsCompleted if ev.tools is not None else mcp_rt.McpListToolsFailed
        return [
            self.ids.send(done(item_id=ev.item_id)),
            self.ids.send(rt.ConversationItemDone(item=item, previous_item_id=previous)),
        ]

    def functions(self, taken: set[str]) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """The listed tools as function tools for the model, and which server each name is on."""
        tools: list[dict[str, Any]] = []
        names: dict[str, str] = {}
        for server in self.by_label.values():
            for t in server.tools or []:
                if t["name"] in taken or t["name"] in names:
                    continue  # a function tool (or an earlier server) has that name
                names[t["name"]] = server.label
                fn = {
                    "type": "function",
                    "name": t["name"],
                    "parameters": t.get("input_schema") or {"type": "object"},
                }
                tools.append({**fn, "description": t["description"]} if t.get("description") else fn)
        return tools, names


def follow_up(r: LiveResponse) -> rt.ResponseParams:
    """The response that answers MCP results asks what the one that called them asked (instructions,
    modalities, voice, metadata; tools and the reply limit are the session's), but never forces a
    tool call again."""
    forced = r.tool_choice == "required" or isinstance(r.tool_choice, dict)
    voice = rt.AudioConfig(output=rt.AudioOutputConfig(voice=r.voice, speed=r.speed)) if r.audio else None
    return rt.ResponseParams(
        instructions=r.instructions,
        output_modalities=["audio"] if r.audio else ["text"],
        audio=voice,
        metadata=r.metadata,
        tool_choice="auto" if forced else None,
    )


# -- calls within a response ------------------------------------------------------------------------
def start_calls(
    r: LiveResponse, servers: McpServers, send: Any, conversation: Conversation, new_id: Any
) -> list[Effect]:
    """The model's text is done and it called MCP tools: run each, or first ask the client's approval."""
    out: list[Effect] = []
    for call in r.calls:
        label = r.mcp_names.get(call.name)
        server = servers.by_label.get(label) if label is not None else None
        if server is None:
            continue
        call.server_label, call.server_url, call.headers = server.label, server.url, server.headers
        r.mcp_started = True
        if server.needs_approval(call.name):
            call.approval_id, call.awaiting = new_id("mcpr"), True
            out += _announce(r, "approval", call, send, conversation, done=True)
        else:
            out += _run(r, call, send, conversation)
    return out


def _announce(
    r: LiveResponse, kind: str, call: FunctionCall, send: Any, conversation: Conversation, done: bool
) -> list[Effect]:
    """A new output item of the response (and of the conversation); ``done``: complete at once."""
    index = (1 if r.opened else 0) + len(r.mcp_outputs)
    r.mcp_outputs.append((kind, call))
    item = call.approval_item() if kind == "approval" else call.item("in_progress")
    if kind == "call":
        call.output_index = index
    out = [send(r, rt.ResponseOutputItemAddedEvent(response_id=r.id, output_index=index, item=item))]
    if r.in_conversation:
        previous = conversation.last_id()
        conversation.add(item, force=True).response_id = r.id
        out.append(send(r, rt.ConversationItemAdded(item=item, previous_item_id=previous)))
    if done:
        out.append(send(r, rt.ResponseOutputItemDoneEvent(response_id=r.id, output_index=index, item=item)))
        if r.in_conversation:
            previous = conversation.previous_id(item.id or "")
            out.append(send(r, rt.ConversationItemDone(item=item, previous_item_id=previous)))
    return out


def _run(r: LiveResponse, call: FunctionCall, send: Any, conversation: Conversation) -> list[Effect]:
    """Announce an ``mcp_call`` and hand it to the transport."""
    call.pending = True
    out = _announce(r, "call", call, send, conversation, done=False)
    ref = {"response_id": r.id, "item_id": call.item_id, "output_index": call.output_index}
    out += [send(r, mcp_rt.ResponseMcpCallArgumentsDelta(**ref, delta=f)) for f in call.fragments]
    out.append(send(r, mcp_rt.ResponseMcpCallArgumentsDone(**ref, arguments=call.arguments)))
    out.append(
        send(r, mcp_rt.ResponseMcpCallInProgress(item_id=call.item_id, output_index=call.output_index))
    )
    out.append(
        CallMcpTool(r.id, r.epoch, call.item_id, call.server_url, call.headers, call.name, call.arguments)
    )
    return out


def advance(
    r: LiveResponse, ev: McpCallDone | rt.Item, send: Any, conversation: Conversation
) -> tuple[list[Effect], bool]:
    """A call's result (its item is done), or the client's approval (the call runs) or denial (it is
    never made; the model hears so). Returns the events and whether every MCP call has ended."""
    out: list[Effect] = []
    if isinstance(ev, rt.Item):
        call = next((c for c in r.calls if c.awaiting and c.approval_id == ev.approval_request_id), None)
        if call is None:
            return [], False  # not this response's (a cancelled one's, or answered already)
        call.awaiting = False
        out = _run(r, call, send, conversation) if ev.approve else []
    else:
        call = next((c for c in r.calls if c.item_id == ev.item_id and c.pending), None)
        if call is None:
            return [], False
        out = end_call(r, call, ev.output, ev.error, send, conversation)
    return out, not any(c.pending or c.awaiting for c in r.calls)


def end_call(
    r: LiveResponse,
    call: FunctionCall,
    output: str | None,
    error: dict[str, Any] | None,
    send: Any,
    conversation: Conversation,
) -> list[Effect]:
    call.pending, call.output, call.error = False, output, error
    made = call.item("completed")
    ended = mcp_rt.ResponseMcpCallFailed if error is not None else mcp_rt.ResponseMcpCallCompleted
    out = [
        send(r, ended(item_id=call.item_id, output_index=call.output_index)),
        send(r, rt.ResponseOutputItemDoneEvent(response_id=r.id, output_index=call.output_index, item=made)),
    ]
    if call.item_id in conversation:
        conversation.get(call.item_id).item = made
        previous = conversation.previous_id(call.item_id)
        out.append(send(r, rt.ConversationItemDone(item=made, previous_item_id=previous)))
    return out


def abandon_calls(r: LiveResponse, send: Any, conversation: Conversation) -> list[Effect]:
    """The response ends (cancelled, failed) with calls still running: each fails, so no item hangs
    (a call still awaiting approval was never made: nothing to end)."""
    error = {"type": "tool_execution_error", "message": "the response ended before the call finished"}
    return [e for c in r.calls if c.pending for e in end_call(r, c, None, error, send, conversation)]
