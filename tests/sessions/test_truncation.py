"""Long calls: ``session.truncation`` decides what the model reads (oldest items out, in chunks,
never a call without its output); the client's view keeps the items; memory stays bounded."""

from __future__ import annotations

from realtime_gw.records.voice import ChatMessage
from realtime_gw.sessions.context import estimate_tokens
from realtime_gw.sessions.events import Limits, ResponseFinished, ResponseTextDelta, StartResponse
from realtime_gw.sessions.realtime import RealtimeSession
from tests.sessions.realtime_helpers import client, errors, events, respond, say, session


def turn(s: RealtimeSession, n: int) -> list[ChatMessage]:
    return turn_start(s, n).messages


def turn_start(s: RealtimeSession, n: int) -> StartResponse:
    say(s, f"Turn {n}: the parcel goes to house number {n * 7}.")
    start, _ = respond(s)
    s.handle(ResponseTextDelta(start.response_id, start.epoch, f"You said turn {n}."), 0)
    assert errors(s.handle(ResponseFinished(start.response_id, start.epoch), 0)) == []
    return start


def test_auto_keeps_the_context_under_budget_with_a_stable_prefix_for_600_turns() -> None:
    s = session(
        Limits(max_items=64, max_retained_items=256, context_tokens=600),
        output_modalities=["text"],
        instructions="Be brief.",
    )
    sizes, firsts = [], []
    for n in range(600):
        start = turn_start(s, n)
        messages = start.messages
        assert start.max_output_tokens is not None
        sizes.append(sum(estimate_tokens(m) for m in messages) + start.max_output_tokens)
        firsts.append(messages[1].content)
        assert messages[0] == ChatMessage("system", "Be brief."), "instructions are never truncated"
        assert messages[-1].content.startswith(f"Turn {n}:")
    assert max(sizes) <= 600, "prompt and the reply it may write fit the window"
    assert min(sizes[100:]) > 400, "and use most of it"
    assert min(len(m) for m in [turn(s, 600)]) > 10
    cuts = sum(1 for a, b in zip(firsts, firsts[1:], strict=False) if a != b)
    assert cuts < 600 // 2, f"the prefix changes in chunks, not every turn ({cuts} cuts)"
    assert len(s.conversation) <= 256, "memory bounded: the oldest items are forgotten"


def test_retention_ratio_and_disabled() -> None:
    ratio = {"type": "retention_ratio", "retention_ratio": 0.5}
    s = session(Limits(context_tokens=800), output_modalities=["text"], truncation=ratio)
    lengths = [len(turn(s, n)) for n in range(60)]
    assert max(lengths) < 40 and min(lengths[30:]) < max(lengths) // 2 + 4, "a cut keeps about half"
    (ev,) = events(client(s, {"type": "session.update", "session": {"truncation": "disabled"}}))
    assert ev.session.truncation == "disabled"  # type: ignore[attr-defined]
    assert len(turn(s, 60)) > 40, "disabled: everything is sent"
    full = session(Limits(max_items=4), output_modalities=["text"], truncation="disabled")
    turn(full, 0), turn(full, 1)
    (err,) = errors(say(full, "one more"))
    assert err.error.code == "conversation_full"


def test_a_call_and_its_output_leave_the_context_together() -> None:
    s = session(Limits(context_tokens=400), output_modalities=["text"])
    for n in range(3):
        fc = {"type": "function_call", "call_id": f"c{n}", "name": "lookup", "arguments": "{}"}
        out = {"type": "function_call_output", "call_id": f"c{n}", "output": "x" * 50}
        client(s, {"type": "conversation.item.create", "item": fc})
        client(s, {"type": "conversation.item.create", "item": out})
    for n in range(30):
        messages = turn(s, n)
        calls = {c.call_id for m in messages for c in m.tool_calls}
        results = {m.tool_call_id for m in messages if m.role == "tool"}
        assert calls == results
