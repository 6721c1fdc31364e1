"""A realtime session bound to a speech-to-speech model, fed events: its stream opens first, input
becomes 80 ms frames (the stage keeps the clock: nothing is fed while the client is quiet), the model's steps open and close
responses, a cancel or barge-in holds the model silent until the user's turn ends, and what the model
cannot take is refused naming its capabilities. Every server event is checked against the SDK's models."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.s2s import S2sAudio, S2sFrame, S2sOpen, S2sSilence, S2sSpec
from realtime_gw.sessions.events import (
    AudioDelivered,
    AwaitDelivery,
    Close,
    Limits,
    OpenS2s,
    PurgeAudio,
    S2sFailed,
    S2sOpened,
    S2sRefused,
    StartResponse,
    StartVad,
    Tick,
    Transcribe,
    TranscriptionDone,
)
from realtime_gw.sessions.realtime import RealtimeSession
from realtime_gw.sessions.s2s import ReplyRule, S2sBinding
from tests.sessions.realtime_helpers import SILENCE, client, errors, events, of, speech, types, vad

SPEC = S2sSpec(model="moshi", text_padding_ids=(3, 0), context_frames=8)
STEP = 1920 * 2  # bytes of one 80 ms step at 24 kHz
RULE = ReplyRule(end_ms=240.0, silence_dbfs=-45.0)
LOUD = (np.sin(np.arange(1920) / 5.0) * 8000).astype("<i2").tobytes()


class Model:
    """Numbers the model's steps as the stage does."""

    def __init__(self) -> None:
        self.index = 0

    def step(self, text: str = "", loud: bool = True) -> S2sFrame:
        self.index += 1
        pcm = LOUD if loud else bytes(STEP)
        return S2sFrame(index=self.index - 1, pcm=pcm, text=text, text_token=7 if text else 3, padding=not text)


def bound(manual: bool = False, spec: S2sSpec = SPEC, **update: Any) -> tuple[RealtimeSession, list[Any]]:
    """An opened session bound to ``spec``; the effects of its opening."""
    s = RealtimeSession("sess_s2s", Limits(voices=frozenset({"default", "marin"}), model="moshi"), 0.0, s2s=S2sBinding(spec, RULE))
    assert s.start(0.0) == [OpenS2s(request=S2sOpen(), model=spec.model)]
    opened = s.handle(S2sOpened(), 0.0)
    if manual:
        update = {"audio": {"input": {"turn_detection": None}}, **update}
    if update:
        assert errors(client(s, {"type": "session.update", "session": update})) == []
    return s, opened


def talk(s: RealtimeSession, model: Model, *pieces: str, quiet_tail: int = 0) -> list[Any]:
    """The model says ``pieces`` (one a step), then ``quiet_tail`` padding steps of silence."""
    out: list[Any] = []
    for p in pieces:
        out += s.handle(model.step(p), 1.0)
    for _ in range(quiet_tail):
        out += s.handle(model.step(loud=False), 1.0)
    return out


def audio_of(effects: list[Any]) -> list[bytes]:
    return [ev.delta for ev in events(effects) if isinstance(ev, rt.ResponseAudioDeltaEvent)]


def transcript_of(effects: list[Any]) -> list[str]:
    return [ev.delta for ev in events(effects) if isinstance(ev, rt.ResponseAudioTranscriptDeltaEvent)]


def test_the_stream_opens_before_the_session_is_created() -> None:
    s, opened = bound()
    assert types(opened) == ["session.created"]
    assert of(opened, StartVad)
    created = events(opened)[0]
    assert isinstance(created, rt.SessionCreatedEvent)
    assert created.session.model == "moshi"
    assert created.session.capabilities == {
        "speech_to_speech": True,
        "model_capabilities": ["audio_in", "audio_out", "text_out"],
        "chunk_period_ms": 80,
        "context_frames": 8,
    }


def test_a_full_stage_refuses_the_session_at_once() -> None:
    s = RealtimeSession("sess_s2s", Limits(model="moshi"), 0.0, s2s=S2sBinding(SPEC))
    s.start(0.0)
    out = s.handle(S2sRefused("no free slot (2 of 2 taken)"), 0.0)
    [error] = errors(out)
    assert error.error.code == "server_busy" and "moshi" in error.error.message
    assert of(out, Close) == [Close(1013, "speech-to-speech stage full")]
    assert s.closed


def test_a_model_fault_ends_the_session_with_an_error() -> None:
    s, _ = bound()
    out = s.handle(S2sFailed("worker died"), 1.0)
    assert errors(out)[0].error.code == "server_error"
    assert of(out, Close)[0].code == 1011


def test_input_becomes_80_ms_steps_at_the_model_rate() -> None:
    s, _ = bound(manual=True)
    pcm = (np.arange(2400) % 100).astype("<i2").tobytes()  # 100 ms at 24 kHz
    first = of(client(s, {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}), S2sAudio)
    assert [len(a.pcm) for a in first] == [STEP]
    assert first[0].pcm == pcm[:STEP]  # at the model's own rate: untouched
    rest = of(client(s, {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm * 3).decode()}), S2sAudio)
    assert len(rest) == 4  # 400 ms in all: five steps, nothing lost at the chunk edges


def test_other_input_rates_are_resampled_to_the_model_rate() -> None:
    s, _ = bound(manual=True, audio={"input": {"format": {"type": "audio/pcmu"}}})
    second = base64.b64encode(b"\xff" * 8000).decode()  # 1 s of G.711 at 8 kHz
    steps = of(client(s, {"type": "input_audio_buffer.append", "audio": second}), S2sAudio)
    assert len(steps) in (11, 12) and {len(a.pcm) for a in steps} == {STEP}  # the filter holds its delay back


def test_the_session_feeds_only_the_clients_audio_the_stage_keeps_the_clock() -> None:
    s, _ = bound(manual=True)
    assert of(s.handle(Tick(), 5.0), S2sAudio) == []  # a quiet client: the stage hears silence at its ticks


def test_a_response_opens_when_the_text_leaves_padding_and_closes_after_padding_and_silence() -> None:
    s, _ = bound()
    m = Model()
    assert talk(s, m, "", "", "") == []  # padding, even loud: not a reply
    out = talk(s, m, " Hel", "lo", "", " world", "")
    assert types(out)[:5] == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
    ]
    assert transcript_of(out) == ["Hel", "lo", " world"]
    assert [len(a) for a in audio_of(out)] == [STEP] * 5
    seqs = [ev.seq for ev in events(out) if isinstance(ev, rt.ResponseAudioDeltaEvent)]
    assert seqs == [0, 1, 2, 3, 4]
    # padding but loud goes on; two quiet padding steps are not yet the end; the third is
    assert not of(talk(s, m, "", quiet_tail=2), AwaitDelivery)
    end = talk(s, m, quiet_tail=1)
    [await_] = of(end, AwaitDelivery)
    assert "response.done" not in types(end)  # live until its audio is out
    done = s.handle(AudioDelivered(await_.response_id, await_.epoch), 2.0)
    [finished] = [ev for ev in events(done) if isinstance(ev, rt.ResponseDoneEvent)]
    assert finished.response.status == "completed"
    assert finished.response.output[0].content[0].transcript == "Hello world"
    assert not of(out + end + done, StartResponse)  # no worker is asked: the model's stream runs


def test_a_quiet_stretch_with_words_does_not_end_the_reply() -> None:
    s, _ = bound()
    m = Model()
    talk(s, m, " one")
    out = []
    for word in (" two", " three", " four", " five"):
        out += s.handle(m.step(word, loud=False), 1.0)
    assert not of(out, AwaitDelivery) and s.response is not None


def test_truncation_keeps_the_words_whose_step_was_heard() -> None:
    s, _ = bound()
    m = Model()
    out = talk(s, m, " Hel", "lo", " big", " world", "", quiet_tail=3)
    item_id = s.response.item_id if s.response else events(out)[1].item.id  # type: ignore[attr-defined]
    [await_] = of(out, AwaitDelivery)
    s.handle(AudioDelivered(await_.response_id, await_.epoch), 2.0)
    heard = {}
    for end_ms in (80, 160, 240, 320, 10_000):
        client(s, {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": end_ms})
        retrieved = client(s, {"type": "conversation.item.retrieve", "item_id": item_id})
        heard[end_ms] = events(retrieved)[0].item.content[0].transcript  # type: ignore[attr-defined]
    # "Hello" is steps 0-1 (0..160 ms), "big" step 2, "world" step 3: each kept once its steps were heard
    assert heard == {80: "", 160: "Hello", 240: "Hello big", 320: "Hello big world", 10_000: "Hello big world"}


def test_cancel_holds_the_model_silent_until_the_users_turn_ends() -> None:
    s, _ = bound(manual=True)
    m = Model()
    talk(s, m, " Hi", " there")
    out = client(s, {"type": "response.cancel"})
    assert of(out, S2sSilence) == [S2sSilence(True)]
    assert of(out, PurgeAudio)
    [done] = [ev for ev in events(out) if isinstance(ev, rt.ResponseDoneEvent)]
    assert done.response.status == "cancelled"
    assert talk(s, m, " still", " going") == []  # steps made before the hold took effect: not sent
    assert client(s, {"type": "response.cancel"}) == []  # nothing live: the race every client runs
    client(s, {"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(STEP * 2)).decode()})
    committed = client(s, {"type": "input_audio_buffer.commit"})
    assert of(committed, S2sSilence) == [S2sSilence(False)]
    assert of(committed, Transcribe)  # the user's transcript comes from the ASR stage
    assert types(talk(s, m, " Yes"))[0] == "response.created"


def test_barge_in_cancels_the_reply_and_the_model_may_answer_when_the_user_stops() -> None:
    s, _ = bound()
    m = Model()
    talk(s, m, " Let", " me", " tell", " you")
    started = vad(s, 0.0, speech(320), now=1.0)
    assert "input_audio_buffer.speech_started" in types(started)
    [done] = [ev for ev in events(started) if isinstance(ev, rt.ResponseDoneEvent)]
    assert done.response.status_details.reason == "turn_detected"  # type: ignore[union-attr]
    assert of(started, S2sSilence) == [S2sSilence(True)]
    stopped = vad(s, 320.0, SILENCE, now=2.0)
    assert "input_audio_buffer.committed" in types(stopped)
    assert of(stopped, S2sSilence) == [S2sSilence(False)]
    assert of(stopped, Transcribe) and not of(stopped, StartResponse)  # the model answers, not the cascade


def test_a_users_turn_asks_no_cascaded_response_the_model_answers_on_its_own() -> None:
    """Server VAD ends the user's turn (create_response on): no response is created for it, before or after
    its transcript arrives; the model's next words open the one response, and a turn that ends while the
    model speaks leaves none behind either."""
    s, _ = bound()
    m = Model()
    vad(s, 0.0, speech(320), now=1.0)
    stopped = vad(s, 320.0, SILENCE, now=2.0)
    [ask] = of(stopped, Transcribe)
    assert not [t for t in types(stopped) if t.startswith("response.")]
    heard = s.handle(TranscriptionDone(ask.item_id, "hello there"), 2.1)
    assert not of(heard, StartResponse) and not [t for t in types(heard) if t.startswith("response.")]
    said = talk(s, m, " Hi", " you", quiet_tail=3)
    assert types(said).count("response.created") == 1 and not errors(said)
    [await_] = of(said, AwaitDelivery)
    out = vad(s, 3000.0, speech(320), now=3.0) + vad(s, 3320.0, SILENCE, now=4.0)
    out += s.handle(AudioDelivered(await_.response_id, await_.epoch), 4.1)
    out += s.handle(TranscriptionDone(of(out, Transcribe)[0].item_id, "and you"), 4.2)
    assert "response.created" not in types(out) and not of(out, StartResponse) and not errors(out)
    assert types(talk(s, m, " Fine"))[0] == "response.created"  # again only when the model speaks


def test_the_next_reply_waits_for_the_last_ones_audio_to_leave() -> None:
    s, _ = bound()
    m = Model()
    [await_] = of(talk(s, m, " First", quiet_tail=3), AwaitDelivery)
    assert talk(s, m, "", " Second", " part") == []  # the model went on while the audio was leaving
    out = s.handle(AudioDelivered(await_.response_id, await_.epoch), 2.0)
    assert types(out).count("response.done") == 1 and types(out).count("response.created") == 1
    assert transcript_of(out) == ["Second", " part"]
    assert transcript_of(talk(s, m, " now")) == [" now"]  # in order, once caught up


def test_what_the_model_cannot_take_is_refused_naming_its_capabilities() -> None:
    s, _ = bound()
    refused = {
        "instructions": {"type": "session.update", "session": {"instructions": "Be a pirate."}},
        "tools": {"type": "session.update", "session": {"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}},
        "text-only": {"type": "session.update", "session": {"output_modalities": ["text"]}},
        "voice": {"type": "session.update", "session": {"audio": {"output": {"voice": "marin"}}}},
        "item": {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}},
        "response": {"type": "response.create"},
    }
    for name, event in refused.items():
        [error] = errors(client(s, event))
        assert "audio_in, audio_out, text_out" in error.error.message, name
        assert "moshi" in error.error.message
    assert s.settings.instructions == "" and s.settings.tools == [] and len(s.conversation) == 0
    ok = client(s, {"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": "default"}}}})
    assert types(ok) == ["session.updated"]


def test_a_call_longer_than_the_context_keeps_going() -> None:
    s, _ = bound()
    m = Model()
    said: list[str] = []
    for turn in range(6):  # 6 replies of 5 steps each: far past the 8-step context
        out = talk(s, m, f" w{turn}", quiet_tail=3)
        said += transcript_of(out)
        [await_] = of(out, AwaitDelivery)
        s.handle(AudioDelivered(await_.response_id, await_.epoch), 2.0 + turn)
    assert said == [f"w{t}" for t in range(6)] and m.index >= 3 * SPEC.context_frames


def test_output_at_another_model_rate_and_output_format() -> None:
    spec = S2sSpec(model="moshi", native_rate=16000)
    s, _ = bound(spec=spec, audio={"output": {"format": {"type": "audio/pcmu"}}})
    frame = S2sFrame(index=0, pcm=LOUD[: 1280 * 2], text=" hi", text_token=7, padding=False)
    out = s.handle(frame, 1.0)
    out += s.handle(S2sFrame(index=1, pcm=LOUD[: 1280 * 2], text="", text_token=3, padding=True), 1.0)
    assert sum(len(a) for a in audio_of(out)) > 0
    deltas = [ev for ev in events(out) if isinstance(ev, rt.ResponseAudioDeltaEvent)]
    assert all(ev.sample_rate_hz == 8000 for ev in deltas)


def test_a_word_said_across_padding_is_one_word() -> None:
    s, _ = bound()
    m = Model()
    out = talk(s, m, " Hel", "", "lo", " you", quiet_tail=3)
    [await_] = of(out, AwaitDelivery)
    done = s.handle(AudioDelivered(await_.response_id, await_.epoch), 2.0)
    item_id = [ev for ev in events(done) if isinstance(ev, rt.ResponseDoneEvent)][0].response.output[0].id
    client(s, {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 240})
    [retrieved] = events(client(s, {"type": "conversation.item.retrieve", "item_id": item_id}))
    assert retrieved.item.content[0].transcript == "Hello"  # type: ignore[attr-defined]
