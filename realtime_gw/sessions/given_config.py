"""A session config given before the session starts: a client secret's, or a WebRTC call's ``session`` part.
Pure.

It was validated when it was given (the secret minted, the call received) and is applied as a
``session.update`` before ``start``, silently: ``session.created`` shows it. What no longer holds when
the session opens is not dropped silently: a custom voice its API key has deleted since (or one whose
stored codes the speech-to-speech stage cannot take) is refused by an ``error`` sent right after
``session.created``, and the rest of the config still applies (the session speaks with the default
voice); anything else a config is refused for drops that config, with its ``error`` the same way.
"""

from __future__ import annotations

from msgspec import UNSET
from msgspec.structs import replace

from realtime_gw.protocols import realtime as rt
from realtime_gw.sessions.events import Effect, Send
from realtime_gw.sessions.realtime import RealtimeSession

VOICE_PARAM = "session.audio.output.voice"


def apply_given(session: RealtimeSession, config: rt.SessionParams, now: float) -> None:
    """Apply ``config`` to a session not started yet; what it is refused for waits in ``session.notices``."""
    refused = _refusal(session.handle(rt.SessionUpdateEvent(session=config), now))
    if refused is not None and refused.error.param == VOICE_PARAM and (rest := without_voice(config)) is not None:
        refused_rest = _refusal(session.handle(rt.SessionUpdateEvent(session=rest), now))
        session.notices.append(refused if refused_rest is None else refused_rest)
    elif refused is not None:
        session.notices.append(refused)


def without_voice(config: rt.SessionParams) -> rt.SessionParams | None:
    """``config`` less its output voice (None: it names none)."""
    audio = config.audio
    if not isinstance(audio, rt.AudioConfig) or not isinstance(audio.output, rt.AudioOutputConfig):
        return None
    if audio.output.voice is UNSET:
        return None
    return replace(config, audio=replace(audio, output=replace(audio.output, voice=UNSET)))


def _refusal(effects: list[Effect]) -> rt.ErrorEvent | None:
    return next((e.event for e in effects if isinstance(e, Send) and isinstance(e.event, rt.ErrorEvent)), None)
