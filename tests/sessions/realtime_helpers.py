"""Shared helpers for the realtime session tests: client events in, server events out, each server
event checked against the openai SDK's GA models."""

from __future__ import annotations

import json
from typing import Any

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import VadProbs
from realtime_gw.sessions.events import Limits, Send, StartResponse, VadResult
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


FRAME = b"\x01\x00" * 1920  # 80 ms of 24 kHz PCM16


def decode(raw: str) -> Any:
    ev = rt.decode_client_event(raw)
    assert not isinstance(ev, rt.ErrorEvent), ev
    return ev


def sent(effects: list[Any]) -> list[rt.ServerEvent]:
    return [e.event for e in effects if isinstance(e, Send)]


def kinds(effects: list[Any]) -> list[str]:
    return [type(ev).__struct_config__.tag for ev in sent(effects)]  # type: ignore[attr-defined]


def of(effects: list[Any], cls: type) -> list[Any]:
    return [e for e in effects if isinstance(e, cls)]


def done_of(effects: list[Any]) -> rt.ResponseDoneEvent:
    """The one response.done among ``effects``."""
    (done,) = [ev for ev in sent(effects) if isinstance(ev, rt.ResponseDoneEvent)]
    return done


def new_session(manual: bool = True) -> RealtimeSession:
    s = RealtimeSession("sess_test", Limits(max_input_buffer_bytes=48000 * 10, voices=frozenset({"default"})))
    s.start(0.0)
    if manual:
        s.handle(
            decode('{"type":"session.update","session":{"audio":{"input":{"turn_detection":null}}}}'), 0.0
        )
    return s


def user_text(s: RealtimeSession, text: str) -> list[Any]:
    return s.handle(
        decode(
            '{"type":"conversation.item.create","item":{"type":"message","role":"user",'
            f'"content":[{{"type":"input_text","text":"{text}"}}]}}}}'
        ),
        0.0,
    )


def start_response(s: RealtimeSession) -> StartResponse:
    effects = s.handle(decode('{"type":"response.create"}'), 0.0)
    (start,) = of(effects, StartResponse)
    return start


WINDOW = 32.0  # ms of audio per VAD probability


def vad(s: RealtimeSession, start_ms: float, probs: list[float], now: float = 0.0) -> list[Any]:
    """VAD results for the session's current stream: one probability per ``WINDOW`` from ``start_ms``."""
    return s.handle(VadResult(VadProbs(start_ms, WINDOW, probs), s.vad_stream), now)


def speech(ms: float) -> list[float]:
    return [0.9] * int(ms / WINDOW)


SILENCE = [0.0] * 20  # 640 ms, longer than the default 500 ms silence duration
