"""MCP tools of a realtime session: the servers it names, their listed tools, and the calls a
response makes to them. Pure: the transport lists and calls (``ListMcpTools``, ``CallMcpTool``) and
feeds the answers back (``McpToolsListed``, ``McpCallDone``).

- MCP servers are named by ``{"type": "mcp", ...}`` tools in ``session.update`` (for every later
  response) or in ``response.create``'s ``tools`` (for that response; out-of-band ones too). A URL
  not on the gateway's allow-list is refused (``session.tools[i]``/``response.tools[i]``) and never
  connected to. Each server is listed once per session: an ``mcp_list_tools`` item joins the
  conversation (``conversation.item.added``), ``mcp_list_tools.in_progress``, then
  ``mcp_list_tools.completed`` (or ``.failed``) and ``conversation.item.done`` with the tools. The
  listing is cached for the session by label, URL, headers and filter (a failed one is tried again
  when named again). A response waits for the listings it needs before its model starts.
- The listed tools (``allowed_tools`` applied) reach the responder model as functions under their own
  names (a function tool of the same name wins). When the model calls one, the response, once its
  text is generated, announces an ``mcp_call`` item (``response.output_item.added``, the
  ``response.mcp_call_arguments.delta``/``.done`` events, ``response.mcp_call.in_progress``) and stays
  live while the gateway runs the call; ``.completed`` or ``.failed`` and ``response.output_item.done``
  follow with its output or error. A call that ``require_approval`` covers is first announced as an
  ``mcp_approval_request`` item, and the response waits for an ``mcp_approval_response`` item:
  approved, the call runs (its ``mcp_call`` names the request); denied, it is never made and the
  model hears so (``context.py``). A request unanswered for ``mcp_approval_timeout_s`` is denied by
  the gateway: it adds the ``mcp_approval_response`` itself (``approve: false``, its ``reason`` says
  the approval timed out), so the client sees why, and the response goes on.
- When every MCP call of a round has ended, and no function call waits for the client, the model
  goes on within the same response (as OpenAI's Realtime API does): it is started again with the
  results, and what it says is a new message item after the calls, in the same response; it may
  call tools again. One ``response.done`` ends it all. At most ``MAX_MODEL_ROUNDS`` rounds: the
  last is offered no tools, so it answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from realtime_gw.protocols import realtime as rt
from realtime_gw.protocols import realtime_mcp as mcp_rt
from realtime_gw.sessions.conversation import Conversation, Entry
from realtime_gw.sessions.events import CallMcpTool, Effect, Ids, ListMcpTools, McpCallDone, McpToolsListed
from realtime_gw.sessions.response_state import forced_server
from realtime_gw.sessions.settings import SessionError
from realtime_gw.sessions.tools import FunctionCall

if TYPE_CHECKING:
    from realtime_gw.sessions.response_state import LiveResponse
    from realtime_gw.sessions.settings import SessionSettings

MAX_MODEL_ROUNDS = 8
"""Model rounds in one response (each after the MCP calls of the one before); the last is offered
no tools, so a model that keeps calling still answers."""


def check_allowed(tools: list[dict[str, Any]], allowed_urls: tuple[str, ...], where: str = "session.tools") -> None:
    """Every MCP server URL is on the gateway's allow-list (compared without a trailing ``/``)."""
    allowed = {u.rstrip("/") for u in allowed_urls}
    for i, tool in enumerate(tools):
        if tool["type"] == "mcp" and tool["server_url"].rstrip("/") not in allowed:
            raise SessionError(
                f"MCP server URL '{tool['server_url']}' is not allowed by this gateway (mcp_allowed_urls)",
                "invalid_value",
                f"{where}[{i}].server_url",
            )


def check_approval(item: rt.Item, conversation: Conversation, asked_elsewhere: set[str]) -> None:
    """A client's ``mcp_approval_response`` answers an ``mcp_approval_request`` of the conversation
    (or of a live out-of-band response: ``asked_elsewhere``)."""
    asked = item.approval_request_id
    if item.type != "mcp_approval_response" or asked in asked_elsewhere:
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
    tools: list[dict[str, Any]] | None = None
    """Listed tools (the filter applied); None while listing or after a failed listing."""
    failed: bool = False
    """Its listing failed: the next update naming it lists it again."""

    def key(self) -> tuple[Any, ...]:
        return (self.url, sorted(self.headers.items()), self.allowed)


def needs_approval(approval: Any, name: str) -> bool:
    """``require_approval`` ("always", "never" or {"always": {"tool_names"}, "never": {"tool_names"}}):
    a name under ``never`` runs at once; otherwise (named under ``always``, or not named) the client is
    asked first."""
    if isinstance(approval, dict):
        return name not in (approval.get("never") or {}).get("tool_names", [])
    return bool(approval != "never")


MAX_RESPONSE_SERVERS = 32
"""Listings of servers named only by ``response.create`` kept per session (by label)."""

UsedServers = dict[str, tuple[McpServer, Any]]
"""A response's MCP servers by label, each with the ``require_approval`` it was named with."""


class McpServers:
    """The session's MCP servers by label, with their cached listings."""

    def __init__(self, ids: Ids, conversation: Conversation) -> None:
        self.ids = ids
        self.conversation = conversation
        self.by_label: dict[str, McpServer] = {}
        self.by_response: dict[str, McpServer] = {}
        """Servers named only by a ``response.create`` (their listing is cached too)."""

    def use(self, tools: list[dict[str, Any]]) -> tuple[UsedServers, list[Effect]]:
        """A response's MCP tools: their servers (listed now when not listed yet)."""
        used: UsedServers = {}
        out: list[Effect] = []
        for t in tools:
            wanted = McpServer(t["server_label"], t["server_url"], t["headers"], t["allowed_tools"], "")
            server = self.by_label.get(wanted.label)  # the session's (retried by a session.update)
            if server is None or server.key() != wanted.key():
                server = self.by_response.get(wanted.label)
                if server is not None and (server.key() != wanted.key() or server.failed):
                    server = None
            if server is None:
                self.by_response.pop(wanted.label, None)
                server = self.by_response[wanted.label] = wanted
                listed = [k for k, v in self.by_response.items() if v.tools is not None or v.failed]
                for label in listed[: max(0, len(self.by_response) - MAX_RESPONSE_SERVERS)]:
                    del self.by_response[label]  # the oldest listings are forgotten (never one in flight)
                out += self._list(server)
            used[server.label] = (server, t["require_approval"])
        return used, out

    def _list(self, server: McpServer) -> list[Effect]:
        server.item_id = self.ids.new("item")
        item = self._item(server)
        previous = self.conversation.last_id()
        self.conversation.add(item, force=True)
        return [
            self.ids.send(rt.ConversationItemAdded(item=item, previous_item_id=previous)),
            self.ids.send(mcp_rt.McpListToolsInProgress(item_id=server.item_id)),
            ListMcpTools(server.item_id, server.url, server.headers),
        ]

    def configure(self, tools: list[dict[str, Any]]) -> list[Effect]:
        """The session's tools changed: list the servers not listed yet (or listed otherwise)."""
        wanted: dict[str, McpServer] = {}
        out: list[Effect] = []
        for t in tools:
            if t["type"] != "mcp":
                continue
            server = McpServer(t["server_label"], t["server_url"], t["headers"], t["allowed_tools"], "")
            old = self.by_label.get(server.label)
            if old is not None and old.key() == server.key() and not old.failed:
                wanted[server.label] = old  # cached (its require_approval comes with each response's tools)
                continue
            wanted[server.label] = server
            out += self._list(server)
        self.by_label = wanted
        return out

    def check_choice(self, choice: Any, tools: list[dict[str, Any]], param: str) -> None:
        """An MCP ``tool_choice`` naming a tool its server's cached listing lacks is refused at once
        (while the server is being listed, at the response's start: ``unmet_choice``)."""
        if not (isinstance(choice, dict) and choice["type"] == "mcp" and choice["name"] is not None):
            return
        tool = next(t for t in tools if t["type"] == "mcp" and t["server_label"] == choice["server_label"])
        wanted = McpServer(tool["server_label"], tool["server_url"], tool["headers"], tool["allowed_tools"], "")
        known = (self.by_label.get(wanted.label), self.by_response.get(wanted.label))
        server = next((s for s in known if s is not None and s.key() == wanted.key() and s.tools is not None), None)
        if server is not None and choice["name"] not in [t["name"] for t in server.tools or []]:
            raise SessionError(_not_listed(choice, server), "invalid_value", f"{param}.name")

    def _item(self, server: McpServer) -> rt.Item:
        return rt.Item(
            type="mcp_list_tools",
            id=server.item_id,
            server_label=server.label,
            tools=list(server.tools or []),
        )

    def listed(self, ev: McpToolsListed) -> list[Effect]:
        known = [*self.by_label.values(), *self.by_response.values()]
        server = next((s for s in known if s.item_id == ev.item_id), None)
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



def functions(
    used: UsedServers, taken: set[str], first: str | None = None
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """A response's listed MCP tools as function tools for the model, and which server each name is on
    (a name two servers list goes to the ``first`` server, the one a ``tool_choice`` forces, then to
    the earlier one)."""
    tools: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for server, _ in sorted(used.values(), key=lambda s: s[0].label != first):
        for t in server.tools or []:
            if t["name"] in taken or t["name"] in names:
                continue  # a function tool (or an earlier server) has that name
            names[t["name"]] = server.label
            fn = {"type": "function", "name": t["name"], "parameters": t.get("input_schema") or {"type": "object"}}
            tools.append({**fn, "description": t["description"]} if t.get("description") else fn)
    return tools, names


def listing(used: UsedServers) -> bool:
    """A server the response needs is still being listed."""
    return any(server.tools is None and not server.failed for server, _ in used.values())


def offer(r: LiveResponse) -> None:
    """The tools the model is offered this round: the function tools, then the listed MCP tools (a
    ``tool_choice`` forcing an MCP server without naming its tool: that server's tools only)."""
    label = forced_server(r.tool_choice)
    offered, r.mcp_names = functions(r.mcp_servers, {t["name"] for t in r.function_tools}, label)
    if label is not None and r.tool_choice["name"] is None:  # type: ignore[index]
        r.tools = [t for t in offered if r.mcp_names[t["name"]] == label]
    else:
        r.tools = r.function_tools + offered


def _not_listed(choice: dict[str, Any], server: McpServer) -> str:
    listed = ", ".join(t["name"] for t in server.tools or []) or "no tools"
    return f"tool_choice names tool '{choice['name']}', which MCP server '{server.label}' does not list (it lists: {listed})"


def unmet_choice(r: LiveResponse, ids: Ids) -> tuple[Effect, rt.ResponseStatusDetails] | None:
    """The response cannot call the MCP tool its ``tool_choice`` forces (its servers listed): the
    error that says why, and the response's failure (None: it can, or the choice forces none)."""
    why = _unmet(r)
    if why is None:
        return None
    error = {"type": "invalid_request_error", "message": why}
    return ids.error(why, "invalid_value", "tool_choice"), rt.ResponseStatusDetails(type="failed", error=error)


def _unmet(r: LiveResponse) -> str | None:
    label = forced_server(r.tool_choice)
    if label is None or label not in r.mcp_servers:
        return None
    server, name = r.mcp_servers[label][0], r.tool_choice["name"]  # type: ignore[index]
    if server.failed:
        return f"tool_choice names MCP server '{label}', whose tools could not be listed"
    listed = [t["name"] for t in server.tools or []]
    if not listed:
        return f"tool_choice names MCP server '{label}', which lists no tools"
    if name is not None and name not in listed:
        return _not_listed(r.tool_choice, server)  # type: ignore[arg-type]
    taken = {t["name"] for t in r.function_tools}
    if name in taken or not set(listed) - taken:
        return f"tool_choice names MCP server '{label}', but function tools of the same names take the place of its tools"
    return None


def earlier_entries(r: LiveResponse) -> list[Entry]:
    """An out-of-band response's earlier rounds (and the approvals given for them), as entries: the
    model reads them after its context."""
    return [Entry(item, response_id=r.id) for item in [*r.earlier, *r.round_outputs(), *r.answers]]


# -- calls within a response ------------------------------------------------------------------------
def start_calls(r: LiveResponse, send: Any, conversation: Conversation, new_id: Any, now: float) -> list[Effect]:
    """The model's text is done and it called MCP tools: run each, or first ask the client's approval."""
    out: list[Effect] = []
    for call in r.calls:
        label = r.mcp_names.get(call.name)
        if label is None or label not in r.mcp_servers:
            continue
        server, approval = r.mcp_servers[label]
        call.server_label, call.server_url, call.headers = server.label, server.url, server.headers
        r.mcp_started = True
        if needs_approval(approval, call.name):
            call.approval_id, call.awaiting, call.asked_at = new_id("mcpr"), True, now
            out += _announce(r, "approval", call, send, conversation, done=True)
        else:
            out += _run(r, call, send, conversation)
    return out


def _announce(
    r: LiveResponse, kind: str, call: FunctionCall, send: Any, conversation: Conversation, done: bool
) -> list[Effect]:
    """A new output item of the response (and of the conversation); ``done``: complete at once."""
    index = r.message_index + (1 if r.opened else 0) + len(r.mcp_outputs)
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
        if not r.in_conversation:
            r.answers.append(ev)  # the model of an out-of-band response reads it from there
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


def expired(r: LiveResponse, now: float, timeout_s: float, new_id: Any) -> list[rt.Item]:
    """The gateway's denials of the approval requests that waited ``timeout_s``."""
    return [
        rt.Item(
            type="mcp_approval_response",
            id=new_id("item"),
            approval_request_id=c.approval_id,
            approve=False,
            reason=f"the approval timed out: no mcp_approval_response within {timeout_s:g} s",
        )
        for c in r.calls
        if c.awaiting and now - c.asked_at >= timeout_s
    ]


def record_answer(r: LiveResponse, answer: rt.Item, send: Any, conversation: Conversation) -> list[Effect]:
    """The gateway's own ``mcp_approval_response`` joins the conversation as a client's would (an
    out-of-band response keeps it: ``advance``)."""
    if not r.in_conversation:
        return []
    answer.object, answer.status = "realtime.item", "completed"
    previous = conversation.last_id()
    conversation.add(answer, force=True)
    return [
        send(rt.ConversationItemAdded(item=answer, previous_item_id=previous)),
        send(rt.ConversationItemDone(item=answer, previous_item_id=previous)),
    ]


def expire_approvals(slots: list[Any], now: float, settings: SessionSettings) -> list[Effect]:
    """Approval requests that waited ``mcp_approval_timeout_s`` are denied by the gateway (``slots``:
    the session's response slots, ``response_lifecycle.Responses``)."""
    out: list[Effect] = []
    for slot in slots:
        r = slot.live
        if r is None:
            continue
        for answer in expired(r, now, slot.limits.mcp_approval_timeout_s, slot.ids.new):
            out += record_answer(r, answer, partial(slot.ids.send, response_id=r.id), slot.conversation)
            out += slot.on_mcp(answer, settings)
    return out


def route_approval(slots: list[Any], item: rt.Item, settings: SessionSettings) -> list[Effect]:
    """An ``mcp_approval_response`` goes to the live response that asked (main or out-of-band)."""
    return [e for slot in slots for e in slot.on_mcp(item, settings)]


def asked_out_of_band(slots: list[Any]) -> set[str]:
    """The approval requests out-of-band responses wait on (they are not in the conversation)."""
    live = [slot.live for slot in slots if slot.live is not None and not slot.live.in_conversation]
    return {c.approval_id or "" for r in live for c in r.calls if c.awaiting}
