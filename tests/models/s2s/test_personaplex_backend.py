"""The PersonaPlex stage's backend on the tiny shape (random init): voices from a directory (encoded once,
kept as codes), a conversation opened with its voice and persona prefilled, one that opens while others
talk changes nothing for them, refusals, and the loudness the voice samples are brought to."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import soundfile

from realtime_gw.models.s2s.personaplex import PersonaPlexBackend
from realtime_gw.models.s2s.prompt import SILENCE_FRAMES
from realtime_gw.models.s2s.voice_records import VOICE_FRAMES_PER_STEP
from realtime_gw.models.s2s.voices import CODES_SUFFIX, normalized_sample
from realtime_gw.protocols import loudness
from realtime_gw.protocols.loudness import integrated_loudness, normalized
from realtime_gw.protocols.voices import prompt_sample
from realtime_gw.records.s2s import S2sFrame, S2sOpen, VoiceCodes
from realtime_gw.records.voice import VoiceAdded, VoiceRegistration
from tests.models.s2s.conversations import FRAME, noise_frames, talk

PERSONA = "You enjoy having a good conversation."


def _sample(path: Path, seconds: float, seed: int, rate: int = 16000) -> None:
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    voice = 0.05 * np.sin(2 * np.pi * (150 + 40 * np.sin(3 * t)) * t) + 0.01 * rng.standard_normal(len(t))
    soundfile.write(str(path), voice.astype(np.float32), rate)


@pytest.fixture(scope="module")
def voices(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("voices")
    _sample(root / "ada.wav", 0.5, 1)
    _sample(root / "bo.flac", 0.3, 2, rate=24000)
    return root


@pytest.fixture(scope="module")
def backend(voices: Path) -> PersonaPlexBackend:
    return PersonaPlexBackend("tiny", slots=3, seed=7, voices_dir=str(voices), voice="ada")


def _talk(backend: PersonaPlexBackend, plan: dict[str, tuple[S2sOpen, int, int]], steps: int) -> dict[str, list[S2sFrame]]:
    """``conversations.talk``, each conversation's audio noise seeded by its name's length."""
    return talk(backend, plan, steps, {name: noise_frames(len(name), steps) for name in plan})


def test_the_voices_are_listed_and_their_codes_kept_beside_the_samples(backend: PersonaPlexBackend, voices: Path) -> None:
    spec = backend.describe().s2s
    assert spec is not None and spec.model == "personaplex"
    assert spec.voices == ("ada", "bo") and spec.default_voice == "ada"
    assert {"voice_prompt", "persona"} <= set(spec.capabilities)
    assert backend.voices.prompt("ada").shape == (7, 8)  # 0.5 s: 6.25 frames of 80 ms, the last padded
    assert (voices / ("bo" + CODES_SUFFIX)).exists()
    assert (voices / ("ada" + CODES_SUFFIX)).stat().st_mode & 0o777 == 0o600  # as private as the sample


def test_a_restart_reads_the_codes_and_a_changed_sample_is_encoded_again(
    backend: PersonaPlexBackend, voices: Path, tmp_path: Path
) -> None:
    from realtime_gw.models.s2s.voices import VoicePrompts

    def refuse(pcm: np.ndarray) -> np.ndarray:
        raise AssertionError("encoded again")

    kept = VoicePrompts.open(voices, refuse, backend.checkpoint.shape)  # the stage's codes, read back
    assert set(kept.names()) == {"ada", "bo"}
    root = tmp_path / "v"
    root.mkdir()
    _sample(root / "cy.wav", 0.2, 3)
    calls: list[int] = []

    def encode(pcm: np.ndarray) -> np.ndarray:
        calls.append(len(pcm))
        return np.zeros((len(pcm) // FRAME + 1, 8), np.int64)

    shape = backend.checkpoint.shape
    VoicePrompts.open(root, encode, shape)
    VoicePrompts.open(root, encode, shape)
    assert len(calls) == 1
    _sample(root / "cy.wav", 0.4, 3)  # another sample under the same name
    VoicePrompts.open(root, encode, shape)
    other = replace(shape, card=shape.card * 2)
    VoicePrompts.open(root, encode, other)  # another codec
    assert len(calls) == 3
    (root / "cy.wav").unlink()  # the codes alone are the voice
    assert VoicePrompts.open(root, refuse, other).prompt("cy").shape == (6, 8)


def test_a_conversation_opens_where_its_prompt_ends_and_a_seed_replays_it(backend: PersonaPlexBackend) -> None:
    request = S2sOpen(seed=3, voice="bo", persona=PERSONA)
    frames, _ = backend.prompt(request)
    voice = len(backend.voices.prompt("bo"))
    persona = len(backend.checkpoint.text.encode(f"<system> {PERSONA} <system>", backend.checkpoint.shape.text_card))
    assert len(frames) == voice + 2 * SILENCE_FRAMES + persona
    state = backend.open(request)
    try:
        assert backend.engine.frames[state.slot] == len(frames) - 1
        assert int(backend.engine.lm.pos[state.slot]) == len(frames) - 1
    finally:
        backend.release(state)
    once = _talk(backend, {"a": (request, 0, 7)}, 8)["a"]
    again = _talk(backend, {"a": (request, 0, 7)}, 8)["a"]
    other = _talk(backend, {"a": (S2sOpen(seed=3, voice="bo", persona="You are a pirate."), 0, 7)}, 8)["a"]
    assert once[0].padding and once[0].text_token == 3  # the prompt's last frame: padding and silence
    assert [f.text_token for f in once] == [f.text_token for f in again]
    assert [f.pcm for f in once] == [f.pcm for f in again]
    assert [f.text_token for f in once] != [f.text_token for f in other]


def test_a_prompted_opening_between_steps_changes_nothing_for_the_others(backend: PersonaPlexBackend) -> None:
    a = S2sOpen(seed=11, persona=PERSONA)
    alone = _talk(backend, {"a": (a, 0, 11)}, 12)["a"]
    crowded = _talk(backend, {
        "b": (S2sOpen(seed=12, voice="bo"), 0, 4), "a": (a, 2, 13),
        "c": (S2sOpen(seed=13, persona="You are a pirate."), 5, 13),
    }, 14)  # fmt: skip
    assert [f.text_token for f in crowded["a"]] == [f.text_token for f in alone]
    # the voice: the same codes decoded; a batched conv may round a float differently (1 LSB)
    got, want = (np.frombuffer(b"".join(f.pcm for f in fs), "<i2").astype(int) for fs in (crowded["a"], alone))
    assert np.abs(got - want).max() <= 2 and np.abs(want).max() > 1000


def test_an_unknown_voice_or_a_prompt_past_the_context_is_refused(backend: PersonaPlexBackend) -> None:
    free = backend.engine.free_slots
    with pytest.raises(ValueError, match="unknown voice 'nobody'; this model's voices: ada, bo"):
        backend.open(S2sOpen(voice="nobody"))
    with pytest.raises(ValueError, match="context holds 97"):
        backend.open(S2sOpen(persona="word " * 200))
    assert backend.engine.free_slots == free  # nothing held


def test_the_stages_check_at_submit_names_what_does_not_fit(backend: PersonaPlexBackend) -> None:
    """``StagePlan.admit``: the transport asks before it submits (a refusal, not a fault of the stream)."""
    free = backend.engine.free_slots
    assert backend.check(S2sOpen(voice="bo", persona="You are Bo.")) is None
    assert "this model's voices: ada, bo" in (backend.check(S2sOpen(voice="nobody")) or "")
    assert "context holds 97" in (backend.check(S2sOpen(persona="Extraordinary " * 10)) or "")
    assert backend.check(object()) is None  # not a conversation's opening: ``open`` refuses it
    assert backend.engine.free_slots == free


def test_voice_samples_are_brought_to_minus_24_lufs(tmp_path: Path) -> None:
    rate = 48000
    t = np.arange(rate * 3) / rate
    sine = np.sin(2 * np.pi * 997 * t)
    assert integrated_loudness(sine, rate) == pytest.approx(-3.01, abs=0.05)  # BS.1770's calibration tone
    soundfile.write(str(tmp_path / "v.wav"), (0.01 * sine).astype(np.float32), rate)
    assert integrated_loudness(normalized_sample(tmp_path / "v.wav"), 24000) == pytest.approx(-24.0, abs=0.1)


def test_a_prefill_makes_the_frames_of_its_iteration_late_by_its_time(backend: PersonaPlexBackend) -> None:
    """The prefill runs at open, on the worker's thread, in the iteration whose step follows: the
    conversations already live wait for it, so their frames are late by it (here the iteration's frame
    was due a whole frame ago: its audio was due as it began)."""
    import time

    from realtime_gw.models.contract import Iteration, run_iteration

    audio = noise_frames(1, 2)
    live = backend.open(S2sOpen(seed=1))
    opened = None
    try:
        began = time.monotonic()
        it = Iteration(open=[(S2sOpen(seed=2, persona=PERSONA), [audio[1]])], work=[(live, [audio[0]])],
                       max_batch=2, due=began - 0.08)  # fmt: skip
        out = run_iteration(backend, it)
        opened = out.opened[0].state
        prefill_ms = backend.prompt_ms
        assert out.opened[0].joined and prefill_ms > 0
        assert all(r.outputs[0].late_ms >= prefill_ms for r in out.results), [r.outputs for r in out.results]
        assert out.results[0].outputs[0].late_ms <= (time.monotonic() - began) * 1000
    finally:
        for st in (live, opened):
            if st is not None:
                backend.release(st)


def _registered(
    backend: PersonaPlexBackend, record: VoiceRegistration, live: Any = None, said: list[S2sFrame] | None = None
) -> tuple[list[Any], int]:
    """Step ``record`` on the stage (beside the ``live`` conversation, hearing noise seeded 1, what it
    says into ``said``) until it is answered: (its outputs, the steps it took)."""
    job = backend.open(record)
    audio = noise_frames(1, 100)
    try:
        for steps in range(1, 100):
            results = backend.step([(job, []), *([(live, [audio[steps - 1]])] if live else [])])
            assert all(r.error is None for r in results)
            if live is not None and said is not None:
                said += results[1].outputs
            if results[0].done:
                return results[0].outputs, steps
    finally:
        backend.release(job)
    raise AssertionError("the voice record was never answered")


def _voice_pcm(seconds: float = 1.5) -> np.ndarray:
    rng = np.random.default_rng(5)
    t = np.arange(int(24000 * seconds)) / 24000
    return (0.2 * np.sin(2 * np.pi * 170 * t) + 0.02 * rng.standard_normal(len(t))).astype(np.float32)


def test_a_voice_made_while_conversations_talk_is_encoded_as_the_directory_s(backend: PersonaPlexBackend) -> None:
    """A ``VoiceRegistration`` (``/v1/audio/voices`` with ``model: personaplex``; its sample normalized by
    the gateway): encoded a few frames a step in the voices' own encoder, it gets the codes a sample of
    the voice directory gets at start, and the conversation live meanwhile says what it says alone."""
    pcm = _voice_pcm()
    sample = prompt_sample(pcm)  # the gateway's part
    talk_alone = S2sOpen(seed=21, persona=PERSONA)
    alone = _talk(backend, {"a": (talk_alone, 0, 5)}, 6)["a"]
    live = backend.open(talk_alone)
    said: list[S2sFrame] = []
    try:
        outputs, steps = _registered(backend, VoiceRegistration("voice_ann", "audio_sample", sample=sample), live, said)
        said += [backend.step([(live, [noise_frames(1, 6)[i]])])[0].outputs[0] for i in range(steps, 6)]
    finally:
        backend.release(live)
    assert [f.text_token for f in said[:6]] == [f.text_token for f in alone]  # (a busy CPU: more steps)
    [added] = outputs
    assert isinstance(added, VoiceAdded) and added.voice_id == "voice_ann" and added.card == backend.checkpoint.shape.card
    frames = -(-len(pcm) // FRAME)
    assert -(-frames // VOICE_FRAMES_PER_STEP) <= steps <= frames and len(added.codes) == frames
    assert np.array_equal(np.array(added.codes), backend.engine.encode_voice(normalized(pcm)))  # slot 0's, at start


def test_the_stage_keeps_no_custom_voice_an_opening_carries_its_codes(voices: Path) -> None:
    """Made on one stage, a voice opens on another (a second replica, or the stage restarted) from the
    codes its opening carries; the maker itself keeps nothing, so a bare name is unknown to both."""
    maker, other = (PersonaPlexBackend("tiny", slots=2, seed=7, voices_dir=str(voices)) for _ in range(2))
    [added], _ = _registered(maker, VoiceRegistration("voice_ann", "audio_sample", sample=prompt_sample(_voice_pcm())))
    assert maker.spec.voices == other.spec.voices == ("ada", "bo") and maker.spec.voice_card == added.card
    for stage in (maker, other):
        assert "unknown voice" in (stage.check(S2sOpen(voice="voice_ann")) or "")
    request = S2sOpen(seed=3, voice="voice_ann", persona=PERSONA, custom_voice=VoiceCodes(added.codes, added.card))
    assert other.check(request) is None
    frames, _ = other.prompt(request)
    assert np.array_equal(frames, maker.prompt(request)[0])
    assert len(other.prompt(msgspec.structs.replace(request, persona=None))[0]) == len(added.codes) + 2 * SILENCE_FRAMES
    said = {name: _talk(stage, {"a": (request, 0, 3)}, 4)["a"] for name, stage in (("maker", maker), ("other", other))}
    assert [f.text_token for f in said["maker"]] == [f.text_token for f in said["other"]]


def test_a_custom_voice_of_another_codec_or_past_the_context_is_refused(backend: PersonaPlexBackend) -> None:
    shape = backend.checkpoint.shape
    codes = ((1,) * shape.own_q,) * 3
    foreign = backend.check(S2sOpen(voice="voice_x", custom_voice=VoiceCodes(codes, 2048)))
    assert "voice 'voice_x' was made by another codec (card 2048" in (foreign or "") and "make the voice again" in (foreign or "")
    narrow = backend.check(S2sOpen(voice="voice_x", custom_voice=VoiceCodes(((1, 2),) * 3, shape.card)))
    assert "another codec" in (narrow or "")
    long = VoiceCodes(((1,) * shape.own_q,) * (backend.spec.max_prompt_frames + 1), shape.card)
    assert "use a shorter persona or voice sample" in (backend.check(S2sOpen(voice="voice_x", custom_voice=long)) or "")
    bad = VoiceCodes(((shape.card,) * shape.own_q,) * 3, shape.card)
    assert backend.check(S2sOpen(voice="voice_x", custom_voice=bad)) is None  # counted at submit, read at open
    with pytest.raises(ValueError, match="outside the codec's card"):
        backend.open(S2sOpen(voice="voice_x", custom_voice=bad))


def test_a_voice_the_stage_cannot_make_is_refused_at_submit(backend: PersonaPlexBackend) -> None:
    long = np.full(24000 * 8, 0.1, np.float32).tobytes()  # 8 s: the tiny context holds 6.8 s of voice
    assert "at most 6.8 s" in (backend.check(VoiceRegistration("voice_x", "audio_sample", sample=long)) or "")
    assert "audio samples only" in (backend.check(VoiceRegistration("voice_x", "prompt", description="warm")) or "")
    assert "empty" in (backend.check(VoiceRegistration("voice_x", "audio_sample")) or "")


def test_opening_a_registration_measures_nothing(backend: PersonaPlexBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage's thread only frames the sample (the gateway measured its loudness): no K-weighting,
    whatever the sample, so the conversations' next step does not wait for it."""
    monkeypatch.setattr(loudness, "k_weighted", lambda *a: pytest.fail("loudness measured on the stage"))
    job = backend.open(VoiceRegistration("voice_x", "audio_sample", sample=bytes(4 * 24000)))
    try:
        assert job.pcm is not None and job.pcm.shape == (-(-24000 // FRAME), FRAME)
    finally:
        backend.release(job)


def test_a_persona_is_tokenized_once_per_opening(backend: PersonaPlexBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check at submit and the opening on the worker's thread read one tokenization."""
    text = backend.checkpoint.text
    calls: list[str] = []
    encode = text.encode
    monkeypatch.setattr(text, "encode", lambda s, card: calls.append(s) or encode(s, card))
    request = S2sOpen(seed=4, persona="You are Dee, a lighthouse keeper.")
    assert backend.check(request) is None
    backend.release(backend.open(request))
    assert calls == ["<system> You are Dee, a lighthouse keeper. <system>"]


def test_a_voice_whose_encoding_fails_fails_alone(backend: PersonaPlexBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error encoding a voice answers its registration with it; the conversation stepping beside it
    says its frame as ever, and the next voice is encoded from a reset encoder."""
    live = backend.open(S2sOpen(seed=21, persona=PERSONA))
    job = backend.open(VoiceRegistration("voice_bad", "audio_sample", sample=prompt_sample(_voice_pcm())))
    monkeypatch.setattr(backend.registrar, "_encode", lambda job: (_ for _ in ()).throw(RuntimeError("out of memory")))
    try:
        voice, talk = backend.step([(job, []), (live, [noise_frames(1, 1)[0]])])
    finally:
        backend.release(job)
    monkeypatch.undo()
    try:
        assert voice.done and voice.error is not None and "encoding the voice failed: out of memory" in voice.error
        assert talk.error is None and len(talk.outputs) == 1 and isinstance(talk.outputs[0], S2sFrame)
        [added], _ = _registered(backend, VoiceRegistration("voice_ok", "audio_sample", sample=prompt_sample(_voice_pcm())), live)
    finally:
        backend.release(live)
    assert np.array_equal(np.array(added.codes), backend.engine.encode_voice(normalized(_voice_pcm())))


def test_the_voices_encoder_is_built_with_the_stage_and_run_at_warm_up(
    backend: PersonaPlexBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoder = backend.registrar.encoder
    assert encoder is backend.engine._voice_encoder  # built with the stage, not at a live step
    ran: list[int] = []
    step = encoder.step
    monkeypatch.setattr(encoder, "step", lambda *a: ran.append(1) or step(*a))
    backend.warmup()
    assert ran == [1]
