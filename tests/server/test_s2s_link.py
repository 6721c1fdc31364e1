"""Which realtime sessions are bound to the speech-to-speech stage, by model name."""

from __future__ import annotations

from realtime_gw.config import GatewayConfig
from realtime_gw.models.contract import BackendInfo
from realtime_gw.records.s2s import S2sSpec
from realtime_gw.server.s2s_link import binding, unserved_model


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
