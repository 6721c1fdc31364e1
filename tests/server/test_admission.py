"""``Admission``: one path for every socket (origin, key, server-wide and per-kind limits, per-key slots
and rate, counting and release), and the speech stream now counting against ``max_sessions``."""

from __future__ import annotations

import json

import pytest
import websockets

from realtime_gw.config import GatewayConfig
from realtime_gw.server.admission import Admission
from realtime_gw.testing.gateway import LiveServer
from tests.server import fakes


def test_origin_then_key() -> None:
    gw = fakes.gateway(GatewayConfig(allowed_origins=["https://ok.example"]), keys=["k"])
    refusal = Admission(gw, "realtime").check({"origin": "https://evil.example", "authorization": "Bearer k"})
    assert refusal is not None and (refusal.code, refusal.status) == ("origin_not_allowed", 403)
    refusal = Admission(gw, "speech").check({"origin": "https://ok.example", "authorization": "Bearer nope"})
    assert refusal is not None and (refusal.code, refusal.status) == ("invalid_api_key", 401)
    admission = Admission(gw, "openpi")
    assert admission.check({"authorization": "Api-Key k"}) is None and admission.key == "k"


def test_max_sessions_counts_every_kind_and_leave_gives_back() -> None:
    gw = fakes.gateway(GatewayConfig(max_sessions=2))
    held = []
    for kind in ("speech", "live"):
        admission = Admission(gw, kind)
        assert admission.check({}) is None and admission.enter() is None
        held.append(admission)
    assert gw.sessions == {"realtime": 0, "live": 1, "openpi": 0, "speech": 1}
    for kind in ("speech", "realtime", "live", "openpi"):
        admission = Admission(gw, kind)
        assert admission.check({}) is None
        refusal = admission.enter()
        assert refusal is not None and refusal.code == "session_limit_reached" and refusal.status == 503
        assert "server session limit reached (2)" in refusal.message
    assert gw.access.sessions[""] == 2  # refusals took no key slot
    with held[0]:
        pass  # leaving the block gives the session back
    held[0].leave()  # idempotent
    assert gw.sessions["speech"] == 0 and gw.access.sessions[""] == 1
    again = Admission(gw, "openpi")
    assert again.check({}) is None and again.enter() is None
    for admission in (again, held[1]):  # the sessions gauge is process-wide: give everything back
        admission.leave()


def test_openpi_cap_and_key_limits() -> None:
    config = GatewayConfig(openpi_max_sessions=1, max_sessions_per_key=2, session_starts_per_key_per_min=3)
    gw = fakes.gateway(config, keys=["a", "b"])
    entered: list[Admission] = []

    def enter(kind: str, key: str) -> Admission | str:
        admission = Admission(gw, kind)  # type: ignore[arg-type]
        assert admission.check({"authorization": f"Bearer {key}"}) is None
        refusal = admission.enter()
        if refusal is None:
            entered.append(admission)
        return admission if refusal is None else f"{refusal.status} {refusal.code}: {refusal.message}"

    first = enter("openpi", "a")
    assert isinstance(first, Admission)
    assert enter("openpi", "b") == "503 session_limit_reached: OpenPI session limit reached (1); retry later"
    assert isinstance(enter("realtime", "a"), Admission)
    assert enter("speech", "a").startswith("503 session_limit_reached: session limit for this API key")  # type: ignore[union-attr]
    first.leave()
    assert isinstance(enter("speech", "a"), Admission)  # third start of the minute
    second = enter("speech", "a")
    assert isinstance(second, str)  # key slots full again (2 held)
    assert gw.sessions == {"realtime": 1, "live": 0, "openpi": 0, "speech": 1}
    for admission in entered:  # the sessions gauge is process-wide: give everything back
        admission.leave()


def test_rate_refusal_is_429() -> None:
    gw = fakes.gateway(GatewayConfig(session_starts_per_key_per_min=1))
    one = Admission(gw, "speech")
    assert one.check({}) is None and one.enter() is None
    one.leave()
    two = Admission(gw, "openpi")
    assert two.check({}) is None
    refusal = two.enter()
    assert refusal is not None and (refusal.code, refusal.status) == ("rate_limit_exceeded", 429)


async def test_speech_stream_counts_against_max_sessions(tone_server: LiveServer) -> None:
    """Regression: the speech stream used to take no server session, so it could exceed max_sessions."""
    stream_url = tone_server.ws + "/v1/audio/speech/stream"
    async with websockets.connect(stream_url) as a, websockets.connect(stream_url) as b:
        for ws in (a, b):  # both live: they answer
            await ws.send(json.dumps({"type": "input.done"}))
            assert json.loads(await ws.recv())["code"] == "no_utterance"
        assert tone_server.metric("realtime_gw_sessions", 'kind="speech"') == 2
        for url in (stream_url, tone_server.ws + "/v1/realtime"):  # max_sessions=2 covers every socket
            async with websockets.connect(url) as c:
                err = json.loads(await c.recv())
                assert err["type"] == "error", err
                code = err["code"] if "code" in err else err["error"]["code"]
                assert code == "session_limit_reached"
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await c.recv()
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
