"""A realtime session bound to a speech-to-speech model that takes a prompt (PersonaPlex), fed events:
its instructions become the persona and its voice the voice prompt of the stream's opening; a later
change re-opens the stream; an unknown voice or a persona past the prompt budget is refused; Moshi
still refuses both. Every server event is checked against the SDK's models."""

from __future__ import annotations

from typing import Any

import numpy as np

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.s2s import S2sFrame, S2sOpen, S2sSilence, S2sSpec, VoiceCodes
from realtime_gw.sessions.events import Close, Limits, OpenS2s, S2sOpened, S2sRefused
from realtime_gw.sessions.given_config import apply_given
from realtime_gw.sessions.realtime import RealtimeSession
from realtime_gw.sessions.s2s import ReplyRule, S2sBinding
from tests.sessions.realtime_helpers import client, errors, events, of, types

CAPS = ("audio_in", "audio_out", "text_out", "voice_prompt", "persona")
SPEC = S2sSpec(
    model="personaplex", text_padding_ids=(3, 0), context_frames=64, capabilities=CAPS,
    voices=("NATF2", "NATM1"), default_voice="NATF2", max_prompt_frames=40,
)  # fmt: skip
MOSHI = S2sSpec(model="moshi", text_padding_ids=(3, 0), context_frames=64)
LOUD = (np.sin(np.arange(1920) / 5.0) * 8000).astype("<i2").tobytes()


def new(spec: S2sSpec = SPEC, seed: int | None = 7) -> RealtimeSession:
    limits = Limits(voices=frozenset({"default", "marin"}), model=spec.model)
    return RealtimeSession("sess_pp", limits, 0.0, s2s=S2sBinding(spec, ReplyRule(), seed))


def opened(s: RealtimeSession) -> list[Any]:
    [open_] = s.start(0.0)
    assert isinstance(open_, OpenS2s) and not open_.reopen
    return s.handle(S2sOpened(), 0.0)


def update(s: RealtimeSession, **session: Any) -> list[Any]:
    return client(s, {"type": "session.update", "event_id": "evt_u", "session": session})


def test_a_config_before_start_is_the_opening_prompt() -> None:
    """A client secret's or a call's session part: applied before the stream opens, so the first
    opening carries the persona and voice, and session.created echoes them."""
    s = new()
    assert errors(update(s, instructions=" You are Ada, a ship's cook. ", audio={"output": {"voice": {"id": "NATM1"}}})) == []
    assert s.start(0.0) == [OpenS2s(S2sOpen(seed=7, voice="NATM1", persona="You are Ada, a ship's cook."), "personaplex")]
    created = events(s.handle(S2sOpened(), 0.0))[0]
    assert isinstance(created, rt.SessionCreatedEvent)
    assert created.session.instructions == " You are Ada, a ship's cook. "
    assert created.session.audio["output"]["voice"] == "NATM1"  # type: ignore[union-attr]
    assert created.session.capabilities is not None
    assert created.session.capabilities["voices"] == ["NATF2", "NATM1"]
    assert created.session.capabilities["default_voice"] == "NATF2"
    assert created.session.capabilities["max_prompt_frames"] == 40


def test_the_sdk_flow_reopens_the_stream_with_the_new_prompt() -> None:
    """connect -> session.created -> session.update(instructions, voice): the stream re-opens with
    them, and session.updated, echoing them, comes once it has (no second session.created)."""
    s = new()
    assert types(opened(s)) == ["session.created"]
    out = update(s, instructions="You are a pirate.", audio={"output": {"voice": "NATM1"}})
    assert errors(out) == [] and types(out) == []
    assert of(out, OpenS2s) == [OpenS2s(S2sOpen(seed=7, voice="NATM1", persona="You are a pirate."), "personaplex", reopen=True)]
    reopened = s.handle(S2sOpened(), 0.1)
    assert types(reopened) == ["session.updated"]
    updated = events(reopened)[0]
    assert isinstance(updated, rt.SessionUpdatedEvent)
    assert updated.session.instructions == "You are a pirate." and updated.session.audio["output"]["voice"] == "NATM1"  # type: ignore[union-attr]
    # the same prompt again is no change: the stream stays, the echo is at once
    same = update(s, instructions="You are a pirate.", audio={"output": {"voice": "NATM1"}})
    assert of(same, OpenS2s) == [] and types(same) == ["session.updated"]
    # other settings never re-open it
    assert of(update(s, audio={"input": {"turn_detection": None}}), OpenS2s) == []
    # "default" is the stage's default voice: the opening names none
    back = of(update(s, audio={"output": {"voice": "default"}}), OpenS2s)
    assert back == [OpenS2s(S2sOpen(seed=7, voice=None, persona="You are a pirate."), "personaplex", reopen=True)]


def test_a_reopen_cancels_the_old_conversations_reply_and_lifts_its_hold() -> None:
    s = new()
    opened(s)
    said = s.handle(S2sFrame(index=0, pcm=LOUD, text=" Hi", text_token=7, padding=False), 0.1)
    assert "response.created" in types(said)
    held = client(s, {"type": "response.cancel"})
    assert of(held, S2sSilence) == [S2sSilence(True)]
    said = s.handle(S2sFrame(index=1, pcm=LOUD, text=" there", text_token=7, padding=False), 0.2)
    out = update(s, instructions="Speak like a poet.")
    assert of(out, OpenS2s)[0].reopen
    again = s.handle(S2sOpened(), 0.3)
    assert of(again, S2sSilence) == []  # the new conversation was never silenced
    assert s.responses.held is False
    # the new conversation speaks: a reply opens at once
    said = s.handle(S2sFrame(index=0, pcm=LOUD, text=" Roses", text_token=7, padding=False), 0.4)
    assert "response.created" in types(said)


def test_a_reopen_with_a_live_reply_cancels_it() -> None:
    s = new()
    opened(s)
    s.handle(S2sFrame(index=0, pcm=LOUD, text=" Hello", text_token=7, padding=False), 0.1)
    assert s.response is not None
    update(s, instructions="Be brief.")
    out = s.handle(S2sOpened(), 0.2)
    [done] = [e for e in events(out) if isinstance(e, rt.ResponseDoneEvent)]
    assert done.response.status == "cancelled" and s.response is None
    assert of(out, S2sSilence) == []  # the new conversation is not forced silent


def test_changes_during_a_reopen_go_next_the_newest_wins() -> None:
    s = new()
    opened(s)
    first = of(update(s, instructions="One."), OpenS2s)
    assert [o.request.persona for o in first] == ["One."]
    assert of(update(s, instructions="Two."), OpenS2s) == []  # one re-open at a time
    assert of(update(s, instructions="Three."), OpenS2s) == []
    first_open = s.handle(S2sOpened(), 0.1)
    assert [e.session.instructions for e in events(first_open)] == ["One."]  # type: ignore[union-attr]
    assert [(o.request.persona, o.reopen) for o in of(first_open, OpenS2s)] == [("Three.", True)]
    last = events(s.handle(S2sOpened(), 0.2))
    assert [e.session.instructions for e in last] == ["Two.", "Three."]  # type: ignore[union-attr]  # each its own


def test_an_unknown_voice_is_refused_naming_the_voices() -> None:
    s = new()
    opened(s)
    out = update(s, audio={"output": {"voice": "marin"}})
    [e] = errors(out)
    assert e.error.param == "session.audio.output.voice"
    assert "NATF2" in e.error.message and "NATM1" in e.error.message
    assert of(out, OpenS2s) == [] and s.settings.voice == "default"


def test_a_persona_past_the_budget_in_words_is_refused_before_anything_changes() -> None:
    s = new()
    opened(s)
    out = update(s, instructions=" ".join(["word"] * 41), audio={"output": {"voice": "NATM1"}})
    [e] = errors(out)
    assert e.error.code == "string_above_max_length" and e.error.param == "session.instructions"
    assert "40 frames" in e.error.message and "41 words" in e.error.message
    assert of(out, OpenS2s) == [] and s.settings.instructions == "" and s.settings.voice == "default"


def test_a_prompt_the_stage_finds_too_long_keeps_the_old_one() -> None:
    """The stage counts tokens (and the voice's frames): its refusal of a re-open leaves the old stream
    on; the error names the budget, and session.updated shows the prompt still applied."""
    s = new()
    opened(s)
    update(s, instructions="Short.")
    s.handle(S2sOpened(), 0.1)
    update(s, instructions="A persona with many long tokens.", audio={"output": {"voice": "NATM1"}})
    out = s.handle(S2sRefused("the voice prompt and persona take 52 frames of 80 ms; this model's context holds 40", prompt=True), 0.2)
    [e] = errors(out)
    assert e.error.code == "invalid_value" and e.error.param == "session.instructions" and "52 frames" in e.error.message
    [updated] = [ev for ev in events(out) if isinstance(ev, rt.SessionUpdatedEvent)]
    assert updated.session.instructions == "Short." and updated.session.audio["output"]["voice"] == "default"  # type: ignore[union-attr]
    assert not s.closed and of(out, Close) == []
    # the next change re-opens from the prompt still applied
    assert [o.request.persona for o in of(update(s, instructions="Other."), OpenS2s)] == ["Other."]


def test_a_first_opening_with_a_prompt_that_does_not_fit_ends_the_session() -> None:
    s = new()
    update(s, instructions="Too long for the model's tokens.")
    s.start(0.0)
    out = s.handle(S2sRefused("the voice prompt and persona take 52 frames", prompt=True), 0.0)
    [e] = errors(out)
    assert e.error.param == "session.instructions"
    assert of(out, Close) == [Close(1008, "speech-to-speech prompt refused")] and s.closed


def test_a_full_stage_at_reopen_ends_the_session() -> None:
    s = new()
    opened(s)
    update(s, instructions="New.")
    out = s.handle(S2sRefused("no free slot"), 0.1)
    assert errors(out)[0].error.code == "server_busy" and s.closed


def test_moshi_still_refuses_instructions_and_voices() -> None:
    s = new(MOSHI)
    opened(s)
    [e] = errors(update(s, instructions="You are a pirate."))
    assert e.error.param == "session.instructions" and "persona" not in e.error.message
    [e] = errors(update(s, audio={"output": {"voice": "NATM1"}}))
    assert e.error.param == "session.audio.output.voice"
    created = new(MOSHI)
    created.start(0.0)
    caps = events(created.handle(S2sOpened(), 0.0))[0].session.capabilities  # type: ignore[union-attr]
    assert "voices" not in caps


OWN = "voice_" + "b" * 24
OWN_CODES = VoiceCodes(((1, 2, 3),) * 4, 64)


def with_library(library: dict[str, VoiceCodes | str]) -> RealtimeSession:
    """A session whose key's own voices are ``library``, read live (as the gateway's library is)."""
    limits = Limits(voices=frozenset({"default", "marin"}), model="personaplex")
    return RealtimeSession("sess_own", limits, 0.0, s2s=S2sBinding(SPEC, ReplyRule(), 7, lambda: library))


def test_a_voice_deleted_while_its_conversation_goes_on_opens_no_new_one() -> None:
    """The conversation open with the voice keeps its prompt; an update that would re-open with it (a
    new persona) is refused as an unknown voice, before anything changes; other updates go on."""
    library: dict[str, VoiceCodes | str] = {OWN: OWN_CODES}
    s = with_library(library)
    assert errors(update(s, audio={"output": {"voice": {"id": OWN}}})) == []
    [open_] = s.start(0.0)
    assert isinstance(open_, OpenS2s) and open_.request.custom_voice == OWN_CODES
    s.handle(S2sOpened(), 0.0)
    del library[OWN]  # DELETE /v1/audio/voices/{id}
    calm = update(s, audio={"input": {"turn_detection": None}})
    assert errors(calm) == [] and of(calm, OpenS2s) == [] and types(calm) == ["session.updated"]
    out = update(s, instructions="You are Ann.")
    [e] = errors(out)
    assert e.error.param == "session.audio.output.voice" and f"Unknown voice '{OWN}'" in e.error.message
    assert of(out, OpenS2s) == [] and s.settings.instructions == "" and s.settings.voice == OWN
    [named] = errors(update(s, audio={"output": {"voice": {"id": OWN}}}))  # naming it again: the same
    assert f"Unknown voice '{OWN}'" in named.error.message
    # another voice with the new persona re-opens as ever
    moved = of(update(s, instructions="You are Ann.", audio={"output": {"voice": "NATM1"}}), OpenS2s)
    assert [(o.request.voice, o.request.persona) for o in moved] == [("NATM1", "You are Ann.")]


def test_an_own_voice_the_stage_cannot_take_is_listed_but_refused_saying_why() -> None:
    s = with_library({OWN: "its stored codes do not fit this model's codec"})
    opened(s)
    out = update(s, audio={"output": {"voice": {"id": OWN}}})
    [e] = errors(out)
    assert e.error.param == "session.audio.output.voice" and "do not fit this model's codec" in e.error.message
    assert of(out, OpenS2s) == []


def test_a_given_config_naming_a_deleted_voice_keeps_the_rest_and_says_why() -> None:
    """A client secret minted with the key's voice, used after the voice was deleted: the session opens
    with the secret's persona and the default voice, and an error right after session.created says why."""
    s = with_library({})
    apply_given(s, rt.SessionParams(instructions="You are Ann.", audio=rt.AudioConfig(
        output=rt.AudioOutputConfig(voice=rt.VoiceId(id=OWN)))), 0.0)  # fmt: skip
    [open_] = s.start(0.0)
    assert isinstance(open_, OpenS2s) and open_.request == S2sOpen(seed=7, voice=None, persona="You are Ann.")
    raw = s.handle(S2sOpened(), 0.0)
    out = events(raw)
    assert types(raw) == ["session.created", "error"]
    assert out[0].session.instructions == "You are Ann." and out[0].session.audio["output"]["voice"] == "default"  # type: ignore[union-attr]
    assert out[1].error.param == "session.audio.output.voice" and f"Unknown voice '{OWN}'" in out[1].error.message  # type: ignore[union-attr]
    assert out[1].event_id > out[0].event_id  # numbered as it is sent


def test_a_given_config_refused_otherwise_is_dropped_with_its_error() -> None:
    s = with_library({})
    apply_given(s, rt.SessionParams(instructions=" ".join(["word"] * 41)), 0.0)
    s.start(0.0)
    raw = s.handle(S2sOpened(), 0.0)
    assert types(raw) == ["session.created", "error"] and events(raw)[0].session.instructions == ""  # type: ignore[union-attr]
