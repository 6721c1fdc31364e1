"""Responses delegation: the backend model of a GPT-Live session, as the Responses API streams it. Pure.

Each backend run is an out-of-band, text-only response of the realtime session behind the face (its
own slot beside the voice, never cut by barge-in), asked of the configured responder with the
delegation's instructions and tools and the delegation's own conversation as input: the task the
voice handed over, then each function call and its output. Its realtime events become Responses
stream events (``response.created``, ``response.output_item.added|done``, ``response.output_text.*``,
``response.function_call_arguments.*``, ``response.completed|incomplete|failed``), each wrapped in a
``response.event`` under the delegation id.

A run that ends with function calls waits: the app answers every call with a ``function_call_output``
item (``response.item.create``) and then asks for the continuation with one ``response.create``; a
``response.create`` while any call of the session has no output yet is refused, as OpenAI refuses a
partial batch. A run that ends with an answer hands its text to the voice, which speaks it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec

from realtime_gw.protocols import live
from realtime_gw.protocols import realtime as rt
from realtime_gw.sessions.settings import SessionError, check_tool_choice, check_tools

BACKEND_INSTRUCTIONS = (
    "You carry out tasks a voice assistant delegated to you. Use the tools when they help. Answer with "
    "the result itself, briefly and in plain sentences: the assistant reads it to the user."
)
"""The backend's instructions when ``delegation.responses.instructions`` is not set."""
FAILED = "The delegated task could not be completed."
APP = "app:"
"""Key prefix of the app's own backend requests (no delegation: ``delegation_id`` null)."""
MAX_PENDING_MESSAGES = 32
CONTEXT_TURNS = 8
CONTEXT_INTRO = "The conversation with the user so far, for reference (the task follows):"


class LiveError(Exception):
    """A client event this session refuses: an ``error`` naming it, the session goes on."""

    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.param = code, param


@dataclass
class Run:
    """One backend response: its Responses events are numbered from 0."""

    delegation_id: str
    seq: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    """The function calls it made (as Responses input items)."""
    text: str = ""


@dataclass
class Task:
    """One delegation's backend conversation."""

    items: list[dict[str, Any]]
    outputs: dict[str, str | None] = field(default_factory=dict)
    """Calls waiting for the app -> their output once given (None: not yet)."""
    running: str | None = None
    """The run in progress (a realtime response id)."""


@dataclass
class Outcome:
    """What the backend's work on a delegation came to: text for the voice to speak."""

    delegation_id: str
    text: str


class Backend:
    def __init__(self, config: live.ResponsesConfig, default_model: str, unix_offset_s: float) -> None:
        self.config = config
        self.default_model = default_model
        self.unix_offset_s = unix_offset_s
        self.runs: dict[str, Run] = {}
        """Runs in progress, by realtime response id."""
        self.tasks: dict[str, Task] = {}
        """Delegations whose backend work is not finished, by delegation id (the app's own requests
        under a key of their own, ``APP`` + a number)."""
        self.pending: list[dict[str, Any]] = []
        """Messages the app added for the next ``response.create``."""
        self.app_runs = 0

    # -- configuration ---------------------------------------------------------------------------------
    def params(self, task: Task) -> rt.ResponseParams:
        c = self.config
        return rt.ResponseParams(
            conversation="none",
            output_modalities=["text"],
            instructions=c.instructions or BACKEND_INSTRUCTIONS,
            input=list(task.items),
            tools=list(c.tools or []),
            tool_choice=c.tool_choice if c.tool_choice is not None else "auto",
            max_output_tokens=c.max_output_tokens,
            parallel_tool_calls=c.parallel_tool_calls,
        )

    # -- delegations and the app's answers ------------------------------------------------------------
    def delegate(self, delegation_id: str, arguments: str, context: list[tuple[str, str]]) -> Task:
        """The voice handed over a task (the ``delegate`` call's arguments): its conversation starts,
        with the last turns of the spoken conversation (``context``: role, text) for reference."""
        try:
            task = json.loads(arguments).get("task")
        except (ValueError, AttributeError):
            task = None
        text = task if isinstance(task, str) and task.strip() else arguments
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        said = "\n".join(f"{role}: {words}" for role, words in context[-CONTEXT_TURNS:])
        heard = [_system(f"{CONTEXT_INTRO}\n{said}")] if said else []
        self.tasks[delegation_id] = Task(items=[*heard, item])
        return self.tasks[delegation_id]

    def started(self, delegation_id: str, response_id: str) -> None:
        self.tasks[delegation_id].running = response_id
        self.runs[response_id] = Run(delegation_id)

    def add_item(self, item: dict[str, Any]) -> None:
        """``response.item.create``: a function call's output, or a message for the next response
        (raises ``LiveError``)."""
        kind = item.get("type", "message")
        if kind == "message":
            self.pending.append(_message(item))
            if len(self.pending) > MAX_PENDING_MESSAGES:
                self.pending.pop()
                raise LiveError(f"At most {MAX_PENDING_MESSAGES} messages may wait for response.create", "invalid_value", "item")
            return
        if kind != "function_call_output":
            raise LiveError(
                f"Item type '{kind}' is not supported: send a 'message' or a 'function_call_output'",
                "unsupported_value",
                "item.type",
            )
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str):
            raise LiveError("A function_call_output needs its 'call_id'", "missing_required_parameter", "item.call_id")
        if not isinstance(output, str):
            raise LiveError("'output' must be a string", "invalid_value", "item.output")
        unknown = set(item) - {"type", "call_id", "output", "id", "status"}
        if unknown:
            name = sorted(unknown)[0]
            raise LiveError(f"Unknown parameter in 'item': '{name}'", "unknown_parameter", f"item.{name}")
        task = next((t for t in self.tasks.values() if call_id in t.outputs), None)
        if task is None:
            raise LiveError(f"No function call '{call_id}' is waiting for an output", "invalid_value", "item.call_id")
        if task.outputs[call_id] is not None:
            raise LiveError(f"Function call '{call_id}' already has its output", "invalid_value", "item.call_id")
        task.outputs[call_id] = output

    def continuations(self) -> list[tuple[str, Task]]:
        """``response.create``: the work to run next, each with its conversation: every delegation
        whose calls all have their outputs, with them (and the messages the app added); else, a
        response the app asks for over its messages. Raises ``LiveError`` for a partial batch, or
        when there is nothing to respond to."""
        waiting = [(d, t) for d, t in self.tasks.items() if t.outputs]
        for _, t in waiting:
            missing = [c for c, out in t.outputs.items() if out is None]
            if missing:
                raise LiveError(f"No tool output found for function call {missing[0]}.", "invalid_value", "type")
        ready = [(d, t) for d, t in waiting if t.running is None]
        if not ready and not self.pending:
            why = "a delegated response is still running" if waiting else "no function call outputs or messages were added"
            raise LiveError(f"Nothing to respond to: {why}", "invalid_value", "type")
        for _, t in ready:
            for call_id, out in t.outputs.items():
                t.items.append({"type": "function_call_output", "call_id": call_id, "output": out})
            t.outputs = {}
            t.items += self.pending
        if not ready:  # the app's own request: a task of the session, not of a delegation
            self.app_runs += 1
            key = f"{APP}{self.app_runs}"
            self.tasks[key] = Task(items=list(self.pending))
            ready = [(key, self.tasks[key])]
        self.pending = []
        return ready

    # -- the backend's events, as Responses stream events ----------------------------------------------
    def translate(self, ev: rt.ServerEvent, now: float) -> tuple[live.ResponseEventEnvelope | None, Outcome | None]:
        """A realtime event of a backend run as its ``response.event`` (or None when Responses has
        none), and the delegation's outcome when the run ended with an answer."""
        run = self.runs[ev.response.id if isinstance(ev, rt.ResponseCreatedEvent | rt.ResponseDoneEvent) else ev.response_id]  # type: ignore[attr-defined]
        event, outcome = self._event(run, ev, now)
        if event is None:
            return None, outcome
        event["sequence_number"] = run.seq
        run.seq += 1
        delegation_id = None if run.delegation_id.startswith(APP) else run.delegation_id
        return live.ResponseEventEnvelope(event=event, delegation_id=delegation_id), outcome

    def _event(self, run: Run, ev: rt.ServerEvent, now: float) -> tuple[dict[str, Any] | None, Outcome | None]:
        match ev:
            case rt.ResponseCreatedEvent():
                return {"type": "response.created", "response": self._snapshot(ev.response, "in_progress", now)}, None
            case rt.ResponseOutputItemAddedEvent():
                return {"type": "response.output_item.added", "output_index": ev.output_index, "item": _item(ev.item)}, None
            case rt.ResponseOutputItemDoneEvent():
                if ev.item.type == "function_call":
                    run.calls.append({"type": "function_call", "call_id": ev.item.call_id, "name": ev.item.name, "arguments": ev.item.arguments or ""})
                elif ev.item.type == "message":
                    run.text += "".join(p.text or "" for p in ev.item.content)
                return {"type": "response.output_item.done", "output_index": ev.output_index, "item": _item(ev.item)}, None
            case rt.ResponseContentPartAddedEvent() | rt.ResponseContentPartDoneEvent():
                kind = "added" if isinstance(ev, rt.ResponseContentPartAddedEvent) else "done"
                part = {"type": "output_text", "text": ev.part.text or "", "annotations": []}
                return {"type": f"response.content_part.{kind}", **_where(ev), "content_index": ev.content_index, "part": part}, None
            case rt.ResponseTextDeltaEvent():
                return {"type": "response.output_text.delta", **_where(ev), "content_index": ev.content_index, "delta": ev.delta, "logprobs": []}, None
            case rt.ResponseTextDoneEvent():
                return {"type": "response.output_text.done", **_where(ev), "content_index": ev.content_index, "text": ev.text, "logprobs": []}, None
            case rt.ResponseFunctionCallArgumentsDeltaEvent():
                return {"type": "response.function_call_arguments.delta", **_where(ev), "delta": ev.delta}, None
            case rt.ResponseFunctionCallArgumentsDoneEvent():
                return {"type": "response.function_call_arguments.done", **_where(ev), "arguments": ev.arguments}, None
            case rt.ResponseDoneEvent():
                return self._finished(run, ev, now)
        return None, None

    def _finished(self, run: Run, ev: rt.ResponseDoneEvent, now: float) -> tuple[dict[str, Any], Outcome | None]:
        del self.runs[ev.response.id]
        task = self.tasks[run.delegation_id]
        task.running = None
        status = ev.response.status
        details = ev.response.status_details
        if status == "completed" and run.calls:  # the app runs the calls; response.create continues
            if run.text:
                task.items.append(_said(run.text))
            task.items += run.calls
            task.outputs = {c["call_id"]: None for c in run.calls}
            return self._final(ev, "completed", now), None
        del self.tasks[run.delegation_id]
        if status == "completed":
            return self._final(ev, "completed", now), Outcome(run.delegation_id, run.text.strip() or FAILED)
        if status == "incomplete":
            event = self._final(ev, "incomplete", now)
            event["response"]["incomplete_details"] = {"reason": "max_output_tokens"}
            return event, Outcome(run.delegation_id, run.text.strip() or FAILED)
        event = self._final(ev, "failed", now)
        reason = (details.error or {}).get("message") if details and details.error else None
        message = reason or (f"The response was {details.reason}" if details and details.reason else "The response failed")
        event["response"]["error"] = {"code": "server_error", "message": str(message)}
        return event, Outcome(run.delegation_id, FAILED)

    def _final(self, ev: rt.ResponseDoneEvent, status: str, now: float) -> dict[str, Any]:
        snapshot = self._snapshot(ev.response, status, now)
        usage = ev.response.usage
        if usage is not None and status == "completed":
            snapshot["usage"] = {
                "input_tokens": usage.input_tokens,
                "input_tokens_details": {"cached_tokens": usage.input_token_details.cached_tokens, "cache_write_tokens": 0},
                "output_tokens": usage.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage.total_tokens,
            }
        return {"type": f"response.{status}", "response": snapshot}

    def _snapshot(self, response: rt.Response, status: str, now: float) -> dict[str, Any]:
        """A lifecycle snapshot as GPT-Live sends it: no input; instructions, tools and output cleared."""
        choice = self.config.tool_choice
        return {
            "id": response.id,
            "object": "response",
            "created_at": int(self.unix_offset_s + now),
            "model": self.config.model or self.default_model,
            "status": status,
            "output": [],
            "tools": [],
            "tool_choice": choice if choice is not None else "auto",
            "parallel_tool_calls": self.config.parallel_tool_calls is not False,
        }

    def close(self) -> None:
        self.runs.clear()
        self.tasks.clear()


def _message(item: dict[str, Any]) -> dict[str, Any]:
    """A Responses input message (text only) as a realtime input item; raises ``LiveError``."""
    role = item.get("role")
    if role not in ("user", "developer", "system", "assistant"):
        raise LiveError("A message's 'role' is user, developer, system or assistant", "invalid_value", "item.role")
    content = item.get("content")
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    if not isinstance(parts, list) or not parts:
        raise LiveError("A message needs 'content': text, or a list of text parts", "invalid_value", "item.content")
    texts = [p.get("text") for p in parts if isinstance(p, dict) and p.get("type") in ("input_text", "output_text")]
    if len(texts) != len(parts) or not all(isinstance(t, str) for t in texts):
        raise LiveError("Only text parts are supported in a message", "unsupported_value", "item.content")
    unknown = set(item) - {"type", "role", "content", "id", "status"}
    if unknown:
        name = sorted(unknown)[0]
        raise LiveError(f"Unknown parameter in 'item': '{name}'", "unknown_parameter", f"item.{name}")
    text = "\n".join(texts)  # type: ignore[arg-type]
    if role == "assistant":
        return _said(text)
    rt_role = "user" if role == "user" else "system"
    return {"type": "message", "role": rt_role, "content": [{"type": "input_text", "text": text}]}


def _where(ev: Any) -> dict[str, Any]:
    return {"item_id": ev.item_id, "output_index": ev.output_index}


def _system(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "system", "content": [{"type": "input_text", "text": text}]}


def _said(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def _item(item: rt.Item) -> dict[str, Any]:
    """A realtime output item as a Responses output item."""
    status = item.status or "completed"
    if item.type == "function_call":
        return {
            "type": "function_call",
            "id": item.id,
            "call_id": item.call_id,
            "name": item.name,
            "arguments": item.arguments or "",
            "status": status,
        }
    parts = [{"type": "output_text", "text": p.text or "", "annotations": []} for p in item.content]
    return {"type": "message", "id": item.id, "role": "assistant", "status": status, "content": parts}


def checked_config(
    given: live.ResponsesConfig | None, current: live.ResponsesConfig | None, max_tools: int, max_chars: int
) -> live.ResponsesConfig:
    """``delegation.responses`` at start (``current`` None: ``model`` is required) or as an update merged
    over ``current`` (omitted settings keep their values); raises ``LiveError`` naming the field."""
    where = "session.delegation.responses"
    if given is None:
        if current is None:
            raise LiveError("Responses delegation needs 'responses'", "missing_required_parameter", where)
        return current
    merged = msgspec.structs.replace(
        current or live.ResponsesConfig(),
        **{f: getattr(given, f) for f in given.__struct_fields__ if getattr(given, f) is not None},
    )
    if not merged.model:
        raise LiveError("Responses delegation needs a backend 'model'", "missing_required_parameter", f"{where}.model")
    if merged.max_output_tokens is not None and merged.max_output_tokens < 16:
        raise LiveError("max_output_tokens must be at least 16", "invalid_value", f"{where}.max_output_tokens")
    tools = merged.tools or []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise LiveError(
                f"Tool type '{kind}' is not supported: the backend runs function tools only",
                "unsupported_value",
                f"{where}.tools[{i}].type",
            )
    try:
        checked = check_tools(tools, max_tools, max_chars, f"{where}.tools")
        choice = merged.tool_choice
        if isinstance(choice, dict) and choice.get("type") not in ("function",):
            raise SessionError(f"tool_choice '{choice.get('type')}' is not supported", "unsupported_value", f"{where}.tool_choice")
        check_tool_choice(choice, checked, f"{where}.tool_choice")
    except SessionError as e:
        raise LiveError(str(e), e.code, e.param) from None
    return merged
