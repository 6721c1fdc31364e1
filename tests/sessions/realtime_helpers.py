"""Shared helpers for the realtime session tests: client events in, server events out, each server
event checked against the openai SDK's GA models."""

from __future__ import annotations

import json
from typing import Any

from realtime_gw.protocols import realtime as rt
from realtime_gw.sessions.events import Limits, Send, StartResponse
from realtime_gw.sessions.realtime import RealtimeSession
from tests.server.sdk_events import validate

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def client(s: RealtimeSession, event: dict[str, Any], now: float = 0.0) -> list[Any]:
    ev = rt.decode_client_event(json.dumps(event))
    assert not isinstance(ev, rt.ErrorEvent), ev
    return s.handle(ev, now)


def events(effects: list[Any]) -> list[rt.ServerEvent]:
    """The server events among ``effects``, each validated against the SDK's GA model."""
    out = [e.event for e in effects if isinstance(e, Send)]
    for ev in out:
        validate(rt.encode_server_event(ev))
    return out


def types(effects: list[Any]) -> list[str]:
    return [type(ev).__struct_config__.tag for ev in events(effects)]  # type: ignore[attr-defined]


def errors(effects: list[Any]) -> list[rt.ErrorEvent]:
    return [ev for ev in events(effects) if isinstance(ev, rt.ErrorEvent)]


def session(limits: Limits | None = None, **settings: Any) -> RealtimeSession:
    """A session with manual turns (and any other ``session.update`` fields)."""
    s = RealtimeSession("sess_helper", limits or Limits(voices=frozenset({"default", "marin"})))
    s.start(0.0)
    update = {"audio": {"input": {"turn_detection": None}}, **settings}
    assert errors(client(s, {"type": "session.update", "session": update})) == []
    return s


def say(s: RealtimeSession, text: str) -> list[Any]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return client(s, {"type": "conversation.item.create", "item": item})


def respond(s: RealtimeSession, **response: Any) -> tuple[StartResponse, list[Any]]:
    effects = client(s, {"type": "response.create", **({"response": response} if response else {})})
    starts = [e for e in effects if isinstance(e, StartResponse)]
    assert len(starts) == 1, types(effects)
    return starts[0], effects
