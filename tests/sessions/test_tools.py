"""Function calling on the session: tools validated and echoed, the responder's tool-call fragments
turned into function_call items in the GA order, tool results sent back to the model in order."""

from __future__ import annotations

from typing import Any

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import ChatUsage, ToolCallDelta, TtsFrame
from realtime_gw.sessions.events import (
    AudioDelivered,
    ResponseAudio,
    ResponseFinished,
    ResponseTextDelta,
    ResponseToolCall,
    ResponseUsage,
)
from tests.sessions.realtime_helpers import (
    FRAME,
    WEATHER,
    client,
    errors,
    events,
    respond,
    say,
    session,
    types,
)


def test_tools_are_validated_echoed_and_sent_with_the_response() -> None:
    s = session(output_modalities=["text"])
    updated = events(
        client(s, {"type": "session.update", "session": {"tools": [WEATHER], "tool_choice": "required"}})
    )
    (ev,) = updated
    assert isinstance(ev, rt.SessionUpdatedEvent)
    assert ev.session.tools == [WEATHER] and ev.session.tool_choice == "required"
    say(s, "Weather in Paris?")
    start, _ = respond(s)
    assert start.tools == [WEATHER] and start.tool_choice == "required"
    # per-response overrides
    client(s, {"type": "response.cancel"})
    start, _ = respond(s, tools=[], tool_choice=None)
    assert start.tools == [] and start.tool_choice == "required"


def test_malformed_tools_get_a_clear_error_and_change_nothing() -> None:
    s = session()
    bad: list[tuple[Any, str]] = [
        ({"type": "function", "parameters": {"type": "object"}}, "session.tools[0].name"),
        ({"type": "function", "name": "f", "parameters": "x"}, "session.tools[0].parameters"),
        ({"type": "function", "name": "f", "parameters": {"type": "array"}}, "session.tools[0].parameters"),
        ({"type": "mcp", "name": "m"}, "session.tools[0].server_label"),
        ({"type": "web_search"}, "session.tools[0].type"),
    ]
    for tool, param in bad:
        (err,) = errors(client(s, {"type": "session.update", "session": {"tools": [tool]}}))
        assert err.error.param == param, err
    (err,) = errors(client(s, {"type": "session.update", "session": {"tools": [WEATHER, WEATHER]}}))
    assert "Duplicate tool name" in err.error.message and err.error.param == "session.tools[1].name"
    (err,) = errors(
        client(
            s, {"type": "session.update", "session": {"tool_choice": {"type": "function", "name": "nope"}}}
        )
    )
    assert err.error.param == "session.tool_choice"
    assert s.settings.tools == [] and s.settings.tool_choice == "auto"


def call(
    start: Any, index: int, arguments: str, call_id: str | None = None, name: str | None = None
) -> ResponseToolCall:
    return ResponseToolCall(start.response_id, start.epoch, ToolCallDelta(index, arguments, call_id, name))


def test_a_tool_only_response_is_function_call_items_in_the_ga_order() -> None:
    s = session(output_modalities=["text"], tools=[WEATHER])
    say(s, "Weather in Paris?")
    start, created = respond(s)
    assert types(created) == ["response.created"], "no message announced while tools may be called"
    assert s.handle(call(start, 0, '{"ci', "call_1", "get_weather"), 0) == []
    s.handle(call(start, 0, 'ty": "Paris"}'), 0)
    s.handle(
        ResponseUsage(
            start.response_id, start.epoch, ChatUsage(input_tokens=50, output_tokens=9, cached_tokens=32)
        ),
        0,
    )
    out = s.handle(ResponseFinished(start.response_id, start.epoch), 0)
    assert types(out) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
        "rate_limits.updated",
    ]
    evs = events(out)
    done_args = evs[4]
    assert isinstance(done_args, rt.ResponseFunctionCallArgumentsDoneEvent)
    assert (done_args.call_id, done_args.name, done_args.arguments) == (
        "call_1",
        "get_weather",
        '{"city": "Paris"}',
    )
    done = evs[7]
    assert isinstance(done, rt.ResponseDoneEvent)
    assert done.response.status == "completed"
    assert [(o.type, o.call_id) for o in done.response.output] == [("function_call", "call_1")]
    usage = done.response.usage
    assert usage is not None and (usage.input_tokens, usage.output_tokens) == (50, 9)
    assert usage.input_token_details.cached_tokens == 32
    # the client runs the tool and sends its output; the next response reads call and result in order
    output = {"type": "function_call_output", "call_id": "call_1", "output": '{"forecast": "sunny"}'}
    assert types(client(s, {"type": "conversation.item.create", "item": output})) == [
        "conversation.item.added",
        "conversation.item.done",
    ]
    start2, _ = respond(s)
    user, asked, result = start2.messages
    assert (user.role, user.content) == ("user", "Weather in Paris?")
    assert asked.role == "assistant" and [(c.call_id, c.name, c.arguments) for c in asked.tool_calls] == [
        ("call_1", "get_weather", '{"city": "Paris"}')
    ]
    assert (result.role, result.tool_call_id, result.content) == ("tool", "call_1", '{"forecast": "sunny"}')


def test_text_then_parallel_calls_message_first_and_one_assistant_message() -> None:
    s = session(output_modalities=["text"], tools=[WEATHER])
    say(s, "Paris and Rome?")
    start, _ = respond(s)
    text = s.handle(ResponseTextDelta(start.response_id, start.epoch, "Checking."), 0)
    assert types(text) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    s.handle(call(start, 0, '{"city": "Paris"}', "call_a", "get_weather"), 0)
    s.handle(call(start, 1, '{"city": "Rome"}', "call_b", "get_weather"), 0)
    out = s.handle(ResponseFinished(start.response_id, start.epoch), 0)
    added = [ev for ev in events(out) if isinstance(ev, rt.ResponseOutputItemAddedEvent)]
    assert [(a.output_index, a.item.type) for a in added] == [(1, "function_call"), (2, "function_call")]
    done = next(ev for ev in events(out) if isinstance(ev, rt.ResponseDoneEvent))
    assert [o.type for o in done.response.output] == ["message", "function_call", "function_call"]
    for call_id, result in (("call_b", "rainy"), ("call_a", "sunny")):  # outputs in any order
        item = {"type": "function_call_output", "call_id": call_id, "output": result}
        client(s, {"type": "conversation.item.create", "item": item})
    start2, _ = respond(s)
    roles = [(m.role, m.content, [c.call_id for c in m.tool_calls], m.tool_call_id) for m in start2.messages]
    assert roles == [
        ("user", "Paris and Rome?", [], None),
        ("assistant", "Checking.", ["call_a", "call_b"], None),
        ("tool", "sunny", [], "call_a"),
        ("tool", "rainy", [], "call_b"),
    ]


def test_spoken_answer_and_a_call_in_one_audio_response() -> None:
    s = session(tools=[WEATHER])
    say(s, "Weather?")
    start, _ = respond(s)
    s.handle(
        call(start, 0, "{}", "call_1", "get_weather"), 0
    )  # the call's fragments may come before the audio
    first = s.handle(ResponseAudio(start.response_id, start.epoch, TtsFrame(FRAME, text="Let me check.")), 0)
    assert types(first)[0] == "response.output_item.added"
    assert s.handle(ResponseFinished(start.response_id, start.epoch), 0)  # AwaitDelivery
    out = s.handle(AudioDelivered(start.response_id, start.epoch), 0)
    kinds = types(out)
    assert kinds.index("response.output_item.done") < kinds.index("response.function_call_arguments.done")
    assert kinds[-2:] == ["response.done", "rate_limits.updated"]
    done = next(ev for ev in events(out) if isinstance(ev, rt.ResponseDoneEvent))
    assert [o.type for o in done.response.output] == ["message", "function_call"]
    usage = done.response.usage
    assert usage is not None and usage.output_token_details.audio_tokens == 2, "80 ms of audio ~ 2 tokens"


def test_a_cancelled_response_hands_out_no_call() -> None:
    s = session(output_modalities=["text"], tools=[WEATHER])
    say(s, "Weather?")
    start, _ = respond(s)
    s.handle(call(start, 0, '{"city"', "call_1", "get_weather"), 0)
    out = client(s, {"type": "response.cancel"})
    assert "response.output_item.added" not in types(out)
    done = next(ev for ev in events(out) if isinstance(ev, rt.ResponseDoneEvent))
    assert done.response.status == "cancelled" and done.response.output == []


def test_client_function_call_items_and_unanswered_calls() -> None:
    s = session(output_modalities=["text"])
    fc = {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"}
    (added, _) = events(client(s, {"type": "conversation.item.create", "item": fc}))
    assert isinstance(added, rt.ConversationItemAdded) and added.item.type == "function_call"
    (err,) = errors(
        client(s, {"type": "conversation.item.create", "item": {"type": "function_call", "name": "x"}})
    )
    assert err.error.param == "item.call_id"
    say(s, "hello")
    start, _ = respond(s)
    assert [m.role for m in start.messages] == ["user"], "a call without its output is not sent"
