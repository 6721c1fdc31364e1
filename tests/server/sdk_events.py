"""Validate server events against the openai SDK's own pydantic models (and ours for extensions)."""

from __future__ import annotations

import json
import typing
from types import SimpleNamespace
from typing import Any

import msgspec
from openai.types.realtime import RealtimeServerEvent

from realtime_gw.protocols import realtime as rt

# type -> the SDK's model for it, so a mismatch names the exact field instead of the whole union
SDK_EVENTS: dict[str, Any] = {
    m.model_fields["type"].annotation.__args__[0]: m
    for m in typing.get_args(typing.get_args(RealtimeServerEvent)[0])
}
EXTENSION_EVENTS: dict[str, type[rt.ServerEvent]] = {
    "playback.acknowledged": rt.PlaybackAcknowledgedEvent,
    "overlap.decision": rt.OverlapDecisionEvent,
    "session.closed": rt.SessionClosedEvent,
}


def validate(raw: str | bytes) -> Any:
    """Parse a server event strictly: SDK model where the API defines one, our Struct for extensions."""
    kind = json.loads(raw)["type"]
    if kind in SDK_EVENTS:
        return SDK_EVENTS[kind].model_validate_json(raw)
    assert kind in EXTENSION_EVENTS, f"unknown server event {kind}"
    msgspec.json.decode(raw, type=EXTENSION_EVENTS[kind])  # strict schema check
    return SimpleNamespace(**json.loads(raw))
