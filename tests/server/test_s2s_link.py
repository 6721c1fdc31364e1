"""Which realtime sessions are bound to the speech-to-speech stage, by model name; the echo model."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from realtime_gw.config import GatewayConfig
from realtime_gw.models.contract import BackendInfo
from realtime_gw.protocols import realtime as rt
from realtime_gw.records.s2s import S2sAudio, S2sFrame, S2sSilence, S2sSpec
from realtime_gw.server.s2s_link import (
    ECHO_DEFAULTS,
    ECHO_MODEL,
    ECHO_SPEC,
    EchoStream,
    binding,
    unserved_model,
)
from realtime_gw.sessions.events import AwaitDelivery, Limits, S2sOpened
from realtime_gw.sessions.realtime import RealtimeSession
from tests.sessions.realtime_helpers import client, errors, events, of, types


class Described:
    """A stage worker as the transport sees it: its description."""

    def __init__(self, spec: S2sSpec) -> None:
        self.info = BackendInfo(name="s2s-moshi", slots=2, s2s=spec)

    def describe(self) -> BackendInfo:
        return self.info


def test_sessions_bind_by_the_stages_model_or_family_name() -> None:
    config = GatewayConfig(s2s="moshi", s2s_reply_end_ms=320, s2s_silence_dbfs=-50.0)
    stage = Described(S2sSpec(model="moshi"))
    bound = binding(stage, config, "moshi", seed=7)  # type: ignore[arg-type]
    assert bound is not None and bound.spec.model == "moshi" and bound.seed == 7
    assert (bound.rule.end_ms, bound.rule.silence_dbfs) == (320, -50.0)
    named = Described(S2sSpec(model="moshiko"))
    assert binding(named, config, "moshiko") is not None and binding(named, config, "moshi") is not None  # type: ignore[arg-type]
    for other in ("gpt-realtime", None, "realtime-gw"):
        assert binding(stage, config, other) is None  # type: ignore[arg-type]
        assert unserved_model(stage, config, other) is None  # type: ignore[arg-type]


def test_a_speech_to_speech_model_without_its_stage_is_refused() -> None:
    why = unserved_model(None, GatewayConfig(), "moshi")
    assert why is not None and "--s2s moshi" in why
    assert binding(None, GatewayConfig(), "moshi") is None


TONE = (np.sin(np.arange(24000 * 3 // 10) * 2 * np.pi * 440 / 24000) * 8000).astype("<i2").tobytes()  # 300 ms


async def echoed(stream: EchoStream, effects: list[Any]) -> list[S2sFrame]:
    """What the echo stream says back to the steps among ``effects``."""
    for e in effects:
        if isinstance(e, (S2sAudio, S2sSilence)):
            stream.push(e)
    stream.cancel()
    return [frame async for frame in stream]


async def test_every_gateway_serves_the_echo_model_without_a_stage() -> None:
    echo = binding(None, GatewayConfig(), ECHO_MODEL)
    assert echo is not None and echo.spec is ECHO_SPEC and unserved_model(None, GatewayConfig(), ECHO_MODEL) is None
    stream = EchoStream(echo.rule.silence_dbfs)
    step = TONE[:960]  # 20 ms at 24 kHz
    frames = await echoed(stream, [S2sAudio(step), S2sAudio(bytes(960)), S2sSilence(True), S2sAudio(step)])
    assert [(f.index, f.pcm == step, f.padding) for f in frames] == [(0, True, False), (1, False, True), (2, False, True)]
    assert frames[2].pcm == bytes(960)  # forced silent (a barge-in's hold): it says silence


async def test_an_echo_session_replies_with_exactly_what_the_user_said() -> None:
    """The user's audio, through the session's input path, the echo and its normal output path: a
    response opens on the first loud step, carries the same samples, and ends after the quiet."""
    echo = binding(None, GatewayConfig(), ECHO_MODEL)
    assert echo is not None
    s = RealtimeSession("sess_echo", Limits(voices=frozenset({"default"}), model=ECHO_MODEL), 0.0, s2s=echo)
    s.start(0.0)
    s.handle(S2sOpened(), 0.0)
    assert not errors(s.handle(rt.SessionUpdateEvent(session=ECHO_DEFAULTS), 0.0))  # as open_session does
    quiet = bytes(24 * 2 * 800)  # 800 ms: past s2s_reply_end_ms
    appended = client(s, {"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(960) + TONE + quiet).decode()})
    out: list[Any] = []
    for frame in await echoed(EchoStream(echo.rule.silence_dbfs), appended):
        out += s.handle(frame, 1.0)
    said = b"".join(ev.delta for ev in events(out) if isinstance(ev, rt.ResponseAudioDeltaEvent))
    assert types(out)[0] == "response.created" and said.startswith(TONE)  # sample for sample
    assert len(of(out, AwaitDelivery)) == 1  # and it ended: response.done once its audio has left
