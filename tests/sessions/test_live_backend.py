"""Responses delegation, fed events (no server): the backend's runs as ``response.event`` envelopes, each
wrapped Responses event validated strictly against ``openai.types.responses``; function calls answered
by ``response.item.create`` and continued by one ``response.create``; the outcome spoken by the voice."""

from __future__ import annotations

from typing import Any

from realtime_gw.records.voice import ChatUsage, ToolCallDelta
from realtime_gw.sessions.events import (
    Limits,
    ResponseFinished,
    ResponseTextDelta,
    ResponseToolCall,
    ResponseUsage,
    StartResponse,
    StartVad,
)
from realtime_gw.sessions.live import LiveSession
from realtime_gw.sessions.live_backend import BACKEND_INSTRUCTIONS, FAILED
from realtime_gw.sessions.live_delegation import DELEGATE_TOOL, SPEAK_RESULT
from tests.sessions.test_live_session import client, sent

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
RESPONSES = {"type": "responses", "responses": {"model": "gpt-5.4-mini", "tools": [WEATHER], "instructions": "Be exact."}}


def responses_session(**config: Any) -> LiveSession:
    s = LiveSession("sess_live0001", Limits(voices=frozenset({"default", "marin"})), 0.0, 600.0, 1_800_000_000.0)
    start = {"type": "session.start", "event_id": "go", "session": {"model": "gpt-live-1", "delegation": RESPONSES, **config}}
    (started,) = [e for e in sent(client(s, start)) if e.type == "session.started"]
    assert started.session.delegation.type == "responses"
    assert started.session.delegation.responses.model == s.backend.config.model  # type: ignore[union-attr]
    return s


def starts(effects: list[Any]) -> list[StartResponse]:
    return [e for e in effects if isinstance(e, StartResponse)]


def inner(events: list[Any]) -> list[str]:
    return [e.event["type"] for e in events if e.type == "response.event"]


def delegate(s: LiveSession) -> tuple[list[Any], StartResponse]:
    """The voice hands "weather in Paris" over; returns the effects (the backend's first run, the
    voice's acknowledgement) and the backend's run."""
    (voice,) = starts(client(s, {"type": "session.commentary.append", "content": "Ask about the weather."}))
    call = ToolCallDelta(index=0, call_id="call_42", name=DELEGATE_TOOL, arguments='{"task": "weather in Paris"}')
    s.handle(ResponseToolCall(voice.response_id, voice.epoch, call), 2.0)
    effects = s.handle(ResponseFinished(voice.response_id, voice.epoch), 2.5)
    backend = [r for r in starts(effects) if not r.audio]
    assert len(backend) == 1, starts(effects)
    return effects, backend[0]


def test_a_backend_tool_call_is_answered_continued_and_spoken() -> None:
    s = responses_session()
    assert s.resource is not None and s.resource.delegation.responses.tools == [WEATHER]  # type: ignore[union-attr]
    effects, run = delegate(s)
    (ack,) = [r for r in starts(effects) if r.audio]  # the voice said nothing: "one moment" first
    events = sent(effects)
    (created,) = [e for e in events if e.type == "session.delegation.created"]
    assert (created.delegation.id, created.delegation.target) == ("call_42", "responses")
    assert created.delegation.response_id == run.response_id
    assert inner(events) == ["response.created"]
    assert all(e.delegation_id == "call_42" for e in events if e.type == "response.event")
    # the backend model: its own instructions and tools, the task as its input
    assert run.tools == [WEATHER] and not run.audio
    assert [(m.role, m.content) for m in run.messages] == [("system", "Be exact."), ("user", "weather in Paris")]
    call = ToolCallDelta(index=0, call_id="call_w1", name="get_weather", arguments='{"city": "Paris"}')
    s.handle(ResponseToolCall(run.response_id, run.epoch, call), 3.0)
    s.handle(ResponseUsage(run.response_id, run.epoch, ChatUsage(input_tokens=40, output_tokens=9)), 3.0)
    events = sent(s.handle(ResponseFinished(run.response_id, run.epoch), 3.1))
    assert inner(events) == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = [e.event for e in events if e.type == "response.event"]
    assert done[3]["item"]["call_id"] == "call_w1" and done[3]["item"]["status"] == "completed"
    assert done[-1]["response"]["usage"]["input_tokens"] == 40
    assert [d["sequence_number"] for d in done] == [1, 2, 3, 4, 5]
    # a response.create before every call has its output is refused; the session goes on
    (error,) = sent(client(s, {"type": "response.create", "event_id": "early"}))
    assert (error.error.code, error.error.client_event_id) == ("invalid_value", "early")
    assert "call_w1" in error.error.message
    output = {"type": "function_call_output", "call_id": "call_w1", "output": '{"forecast": "sunny"}'}
    assert sent(client(s, {"type": "response.item.create", "item": output})) == []
    (again,) = sent(client(s, {"type": "response.item.create", "item": output, "event_id": "twice"}))
    assert again.error.param == "item.call_id"
    effects = client(s, {"type": "response.create"}, now=4.0)
    (cont,) = starts(effects)
    assert [m.role for m in cont.messages] == ["system", "user", "assistant", "tool"]
    assert cont.messages[2].tool_calls[0].name == "get_weather"
    assert inner(sent(effects)) == ["response.created"]
    s.handle(ResponseTextDelta(cont.response_id, cont.epoch, "Sunny in Paris."), 4.5)
    effects = s.handle(ResponseFinished(cont.response_id, cont.epoch), 4.6)
    assert inner(sent(effects))[-1] == "response.completed"
    assert starts(effects) == []  # the voice is still saying "one moment": the outcome waits for it
    # then the voice speaks the outcome: the delegation call's output, then the ask to say it
    (voice,) = starts(s.handle(ResponseFinished(ack.response_id, ack.epoch), 5.0))
    assert voice.audio and voice.messages[-1].content == SPEAK_RESULT
    assert [m.content for m in voice.messages if m.role == "tool"] == ["Sunny in Paris."]
    assert s.backend is not None and not s.backend.tasks and not s.backend.runs


def test_a_failed_backend_run_is_said_and_reported() -> None:
    s = responses_session(delegation={"type": "responses", "responses": {"model": "m"}})
    _, run = delegate(s)
    assert run.messages[0].content == BACKEND_INSTRUCTIONS and run.tools == []
    effects = s.handle(ResponseFinished(run.response_id, run.epoch, error="backend unreachable"), 3.0)
    (failed,) = [e.event for e in sent(effects) if e.type == "response.event" and e.event["type"] == "response.failed"]
    assert failed["response"]["status"] == "failed" and failed["response"]["error"]["code"] == "server_error"
    # the voice says it could not be done, once it has said "one moment"
    assert [i.output for i in s.queued if i.type == "function_call_output"] == [FAILED]


def test_update_changes_the_backend_tools_and_keeps_the_rest() -> None:
    s = responses_session()
    other = {**WEATHER, "name": "get_time"}
    update = {"type": "session.update", "event_id": "u", "session": {"delegation": {"type": "responses", "responses": {"tools": [other]}}}}
    (updated,) = sent(client(s, update))
    assert updated.session.delegation.responses.model == "gpt-5.4-mini"
    assert [t.name for t in updated.session.delegation.responses.tools] == ["get_time"]
    _, run = delegate(s)
    assert [t["name"] for t in run.tools] == ["get_time"] and run.messages[0].content == "Be exact."
    (error,) = sent(client(s, {"type": "session.update", "session": {"delegation": {"type": "client"}}}))
    assert error.error.param == "session.delegation.type"


def test_refusals() -> None:
    s = LiveSession("sess_live0001", Limits(voices=frozenset({"default"})), 0.0, 600.0)
    hosted = {"type": "responses", "responses": {"model": "m", "tools": [{"type": "web_search"}]}}
    start = {"type": "session.start", "event_id": "s", "session": {"model": "gpt-live-1", "delegation": hosted}}
    (error,) = sent(client(s, start))
    assert (error.error.code, error.error.param) == ("unsupported_value", "session.delegation.responses.tools[0].type")
    no_model = {"type": "responses", "responses": {"tools": []}}
    (error,) = sent(client(s, {**start, "session": {"model": "gpt-live-1", "delegation": no_model}}))
    assert (error.error.code, error.error.param) == ("missing_required_parameter", "session.delegation.responses.model")
    unknown = {"type": "responses", "responses": {"model": "m", "temperature": 0.2}}
    (error,) = sent(client(s, {**start, "session": {"model": "gpt-live-1", "delegation": unknown}}))
    assert (error.error.code, error.error.param) == ("unknown_parameter", "session.delegation.responses.temperature")
    assert not s.started
    s = responses_session()
    (error,) = sent(client(s, {"type": "response.create", "event_id": "c"}))
    assert (error.error.code, error.error.client_event_id) == ("invalid_value", "c")
    (error,) = sent(client(s, {"type": "response.item.create", "item": {"type": "item_reference", "id": "x"}}))
    assert (error.error.code, error.error.param) == ("unsupported_value", "item.type")
    image = {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}
    (error,) = sent(client(s, {"type": "response.item.create", "item": image}))
    assert (error.error.code, error.error.param) == ("unsupported_value", "item.content")


def test_the_app_asks_the_backend_itself_and_the_voice_says_the_answer() -> None:
    s = responses_session()
    message = {"type": "message", "role": "user", "content": "What is on my calendar today?"}
    assert sent(client(s, {"type": "response.item.create", "item": message})) == []
    effects = client(s, {"type": "response.create", "event_id": "ask"}, now=2.0)
    (run,) = starts(effects)
    assert not run.audio and [(m.role, m.content) for m in run.messages][1:] == [("user", "What is on my calendar today?")]
    envelopes = [e for e in sent(effects) if e.type == "response.event"]
    assert [e.event["type"] for e in envelopes] == ["response.created"] and envelopes[0].delegation_id is None
    s.handle(ResponseTextDelta(run.response_id, run.epoch, "A dentist at noon."), 2.5)
    effects = s.handle(ResponseFinished(run.response_id, run.epoch), 2.6)
    (voice,) = starts(effects)
    assert voice.audio and voice.messages[-1].content.endswith("A dentist at noon.")
    (error,) = sent(client(s, {"type": "response.create", "event_id": "again"}))  # nothing new to answer
    assert error.error.client_event_id == "again"


def test_response_events_need_responses_delegation() -> None:
    s = LiveSession("sess_live0001", Limits(voices=frozenset({"default"})), 0.0, 600.0)
    client(s, {"type": "session.start", "session": {"model": "gpt-live-1"}})
    (error,) = sent(client(s, {"type": "response.create", "event_id": "r"}))
    assert (error.error.code, error.error.client_event_id) == ("invalid_value", "r")


def test_a_refused_start_leaves_nothing_started() -> None:
    s = LiveSession("sess_live0001", Limits(voices=frozenset({"default"})), 0.0, 600.0)
    bad = {"type": "session.start", "session": {"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcmu", "rate": 16000}}}}
    effects = client(s, bad)
    assert not s.started and not any(isinstance(e, StartVad) for e in effects)
    effects = client(s, {"type": "session.start", "session": {"model": "gpt-live-1"}})
    assert s.started and len([e for e in effects if isinstance(e, StartVad)]) == 1
    assert [e for e in s.close() if type(e).__name__ == "StopVad"]  # the one VAD stream the start ran


def test_the_backend_reads_the_spoken_conversation_for_reference() -> None:
    from realtime_gw.protocols import realtime as rt

    s = responses_session()
    item = rt.Item(type="message", role="user", content=[rt.ContentPart(type="input_text", text="I live in Paris.")])
    s.inner.handle(rt.ConversationItemCreateEvent(item=item), 1.0)
    _, run = delegate(s)
    assert [m.role for m in run.messages] == ["system", "system", "user"]
    assert run.messages[1].content.endswith("user: I live in Paris.") and run.messages[-1].content == "weather in Paris"
