"""A GPT-Live session whose ``session.start`` names a speech-to-speech model that takes a prompt
(PersonaPlex), fed events: the start's instructions and voice are the stream's opening prompt (no
``settings_ignored`` for them); a stock voice that the model lacks is named ignored; any other voice is
refused naming the model's voices. Every GPT-Live event is validated by the SDK's models."""

from __future__ import annotations

from typing import Any

from realtime_gw.records.s2s import S2sOpen, VoiceCodes
from realtime_gw.sessions.events import Limits, OpenS2s, S2sOpened
from realtime_gw.sessions.live import LiveSession
from realtime_gw.sessions.live_s2s import DuplexModels
from realtime_gw.sessions.s2s import ReplyRule, S2sBinding
from tests.sessions.test_live_s2s import LIVEKIT_DEFAULTS, client, sent
from tests.sessions.test_s2s_prompt import SPEC

MODELS = DuplexModels(S2sBinding(SPEC, ReplyRule(), 3), frozenset({"personaplex"}), frozenset({"moshi"}))


def start(**config: Any) -> tuple[LiveSession, list[Any]]:
    s = LiveSession("sess_live_pp", Limits(voices=frozenset({"default", "marin"})), 0.0, 600.0, 1.8e9, MODELS)
    return s, client(s, {"type": "session.start", "event_id": "go", "session": {"model": "personaplex", **config}}, 0.0)


def test_the_starts_instructions_and_voice_are_the_opening_prompt() -> None:
    s, starting = start(instructions="You are Ada, a ship's cook.", audio={"output": {"voice": "NATM1"}})
    assert [e for e in starting if isinstance(e, OpenS2s)] == [
        OpenS2s(S2sOpen(seed=3, voice="NATM1", persona="You are Ada, a ship's cook."), "personaplex")
    ]  # one opening, with the prompt: no re-open
    started, mapped = sent(s.handle(S2sOpened(), 0.0))  # nothing ignored: no settings_ignored
    assert started.type == "session.started" and mapped.code == "model_mapped"
    assert started.session.instructions == "You are Ada, a ship's cook."
    assert started.session.audio.output.voice == "NATM1"
    assert s.inner.settings.instructions == "You are Ada, a ship's cook."


def test_clients_defaults_apply_the_persona_and_name_the_stock_voice_ignored() -> None:
    s, starting = start(**LIVEKIT_DEFAULTS)
    [opening] = [e for e in starting if isinstance(e, OpenS2s)]
    assert opening.request == S2sOpen(seed=3, voice=None, persona="You are a helpful assistant.")
    _, _, ignored = sent(s.handle(S2sOpened(), 0.0))
    assert ignored.code == "settings_ignored"
    assert "audio.output.voice" in ignored.message and "instructions" not in ignored.message


def test_a_start_naming_no_voice_echoes_the_models_default() -> None:
    s, _ = start()
    started = sent(s.handle(S2sOpened(), 0.0))[0]
    assert started.session.audio.output.voice == "NATF2"


def test_an_unknown_voice_is_refused_naming_the_models_voices() -> None:
    s, out = start(audio={"output": {"voice": "NOBODY"}})
    [error] = sent(out)
    assert error.type == "error" and "NATF2" in error.error.message and "NOBODY" in error.error.message
    assert [e for e in out if isinstance(e, OpenS2s)] == []  # nothing opened


def test_a_persona_past_the_budget_is_refused_at_start() -> None:
    s, out = start(instructions=" ".join(["word"] * 41))
    [error] = sent(out)
    assert error.type == "error" and "40 frames" in error.error.message
    assert [e for e in out if isinstance(e, OpenS2s)] == []


def test_a_voice_the_key_made_for_the_model_is_its_voice_prompt() -> None:
    """A voice of ``/v1/audio/voices`` made for the model (``S2sBinding.own_voices``), by its id: the
    opening carries its codes (the stage keeps no custom voice)."""
    codes = VoiceCodes(((1, 2, 3),) * 4, 64)
    library = {"voice_" + "a" * 24: codes}
    own = DuplexModels(S2sBinding(SPEC, ReplyRule(), 3, lambda: library), frozenset({"personaplex"}))
    s = LiveSession("sess_live_own", Limits(voices=frozenset({"default"})), 0.0, 600.0, 1.8e9, own)
    named = {"type": "session.start", "session": {"model": "personaplex", "audio": {"output": {"voice": {"id": "voice_" + "a" * 24}}}}}
    out = client(s, named, 0.0)
    assert [(e.request.voice, e.request.custom_voice) for e in out if isinstance(e, OpenS2s)] == [("voice_" + "a" * 24, codes)]
    library.clear()  # the key deleted it (the binding reads the library live): a later start is refused
    gone = LiveSession("sess_live_gone", Limits(voices=frozenset({"default"})), 0.0, 600.0, 1.8e9, own)
    refused_start = client(gone, named, 0.0)
    assert [e for e in refused_start if isinstance(e, OpenS2s)] == []
    assert "Unknown voice 'voice_" in sent(refused_start)[0].error.message
    stock = [e.request for e in start(audio={"output": {"voice": "NATF2"}})[1] if isinstance(e, OpenS2s)]
    assert [(r.voice, r.custom_voice) for r in stock] == [("NATF2", None)]  # a stage's own voice: by name
    _, refused = start(audio={"output": {"voice": {"id": "voice_" + "a" * 24}}})  # another key's binding
    assert [e for e in refused if isinstance(e, OpenS2s)] == []
