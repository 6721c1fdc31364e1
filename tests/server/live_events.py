"""Validate GPT-Live server events strictly against the openai SDK's ``openai.types.live.ServerEvent``:
the discriminated union must accept the event, and no model at any depth may hold a field the SDK does
not define (its models allow extras; a strict check forbids them). The Responses event a
``response.event`` wraps is validated the same way against ``openai.types.responses.ResponseStreamEvent``."""

from __future__ import annotations

import json
import typing
from typing import Any

from openai import BaseModel
from openai.types.live import ServerEvent
from openai.types.responses import ResponseStreamEvent

# type -> the SDK's model for it (the union's discriminator is the SDK's own, not pydantic's), so a
# mismatch names the exact field instead of every member of the union
SDK_EVENTS: dict[str, Any] = {
    m.model_fields["type"].annotation.__args__[0]: m for m in typing.get_args(typing.get_args(ServerEvent)[0])
}


RESPONSES_EVENTS: dict[str, Any] = {
    m.model_fields["type"].annotation.__args__[0]: m for m in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


def _no_extras(value: Any, path: str) -> None:
    if isinstance(value, BaseModel):
        extra = value.model_extra or {}
        assert not extra, f"{path}: fields the SDK does not define: {sorted(extra)}"
        for name in type(value).model_fields:
            _no_extras(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _no_extras(v, f"{path}[{i}]")


def validate_live(raw: str | bytes) -> Any:
    """The SDK's model of one server event, or an AssertionError/ValidationError naming what is wrong."""
    kind = json.loads(raw)["type"]
    assert kind in SDK_EVENTS, f"{kind} is no server event of openai.types.live"
    event = SDK_EVENTS[kind].model_validate_json(raw)
    _no_extras(event, event.type)
    if kind == "response.event":
        validate_responses_event(event.event)
    return event


def validate_responses_event(inner: dict[str, Any]) -> Any:
    """The SDK's model of one Responses stream event, strictly (as ``validate_live``)."""
    kind = inner.get("type")
    assert kind in RESPONSES_EVENTS, f"{kind} is no event of openai.types.responses"
    event = RESPONSES_EVENTS[kind].model_validate(inner)
    _no_extras(event, f"response.event:{kind}")
    return event
