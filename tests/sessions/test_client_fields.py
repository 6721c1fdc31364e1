"""What real clients send is accepted or clearly refused: explicit nulls, voice objects, images,
response.input with item references, oversized text; and the numbers the session reports."""

from __future__ import annotations

from realtime_gw.protocols import realtime as rt
from realtime_gw.sessions.events import (
    Limits,
    ResponseFinished,
    ResponseTextDelta,
    Transcribe,
    TranscriptionDone,
)
from tests.sessions.realtime_helpers import client, errors, events, respond, say, session

PNG = "data:image/png;base64,iVBORw0KGgo="


def test_explicit_nulls_mean_defaults_in_session_update_and_response_create() -> None:
    s = session(
        instructions="Be brief.", max_output_tokens=100, audio={"output": {"voice": "marin", "speed": 1.2}}
    )
    nulls = {
        "type": "realtime",
        "instructions": None,
        "max_output_tokens": None,
        "tools": None,
        "tool_choice": None,
        "truncation": None,
        "tracing": None,
        "prompt": None,
        "include": None,
        "output_modalities": None,
        "audio": {
            "input": {"format": None, "transcription": None, "noise_reduction": None, "turn_detection": None},
            "output": {"format": None, "voice": None, "speed": None},
        },
    }
    (updated,) = events(client(s, {"type": "session.update", "session": nulls}))
    assert isinstance(updated, rt.SessionUpdatedEvent)
    out = updated.session
    assert (out.instructions, out.max_output_tokens, out.tools, out.tool_choice, out.truncation) == (
        "",
        "inf",
        [],
        "auto",
        "auto",
    )
    assert out.audio["output"]["voice"] == "default" and out.audio["output"]["speed"] == 1.0
    vad = {"type": "server_vad", "threshold": None, "silence_duration_ms": None, "idle_timeout_ms": None}
    (updated,) = events(
        client(s, {"type": "session.update", "session": {"audio": {"input": {"turn_detection": vad}}}})
    )
    assert updated.session.audio["input"]["turn_detection"]["threshold"] == 0.5  # type: ignore[attr-defined]
    say(s, "hi")
    response = {"conversation": None, "instructions": None, "max_output_tokens": None, "tools": None, "tool_choice": None,
                "output_modalities": None, "metadata": None, "input": None, "audio": {"output": {"voice": None}}}  # fmt: skip
    start, created = respond(s, **response)
    assert errors(created) == [] and start.messages[-1].content == "hi"


def test_voice_as_an_object() -> None:
    s = session()
    (updated,) = events(
        client(s, {"type": "session.update", "session": {"audio": {"output": {"voice": {"id": "marin"}}}}})
    )
    assert updated.session.audio["output"]["voice"] == "marin"  # type: ignore[attr-defined]
    (err,) = errors(
        client(s, {"type": "session.update", "session": {"audio": {"output": {"voice": {"id": "voice_x"}}}}})
    )
    assert err.error.param == "session.audio.output.voice" and "available" in err.error.message


def test_input_image_is_kept_and_forwarded() -> None:
    s = session(output_modalities=["text"])
    item = {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": PNG, "detail": "low"}]}  # fmt: skip
    added, _ = events(client(s, {"type": "conversation.item.create", "item": item}))
    assert isinstance(added, rt.ConversationItemAdded) and added.item.content[1].image_url == PNG
    start, _ = respond(s)
    assert start.messages[-1].images == [PNG] and start.messages[-1].content == "What is this?"
    (err,) = errors(
        client(
            s,
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_image"}]},
            },
        )
    )
    assert err.error.param == "item.content[0].image_url"


def test_response_input_replaces_the_context_with_item_references() -> None:
    s = session(output_modalities=["text"])
    first = events(say(s, "first"))[0].item.id  # type: ignore[attr-defined]
    say(s, "second")
    given = [
        {"type": "item_reference", "id": first},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "extra"}]},
    ]
    for conversation in ("auto", "none"):
        start, _ = respond(s, conversation=conversation, input=given)
        assert [m.content for m in start.messages] == ["first", "extra"]
        client(s, {"type": "response.cancel"})
    (err,) = errors(
        client(
            s,
            {
                "type": "response.create",
                "response": {"input": [{"type": "item_reference", "id": "item_nope"}]},
            },
        )
    )
    assert err.error.param == "response.input[0].id"


def test_usage_numbers_and_transcription_seconds() -> None:
    s = session(
        output_modalities=["text"], audio={"input": {"turn_detection": None, "transcription": {"model": "x"}}}
    )
    client(
        s, {"type": "input_audio_buffer.append", "audio": "AAAA" * 12000}
    )  # 36000 bytes = 0.75 s at 24 kHz
    (asr,) = [e for e in client(s, {"type": "input_audio_buffer.commit"}) if isinstance(e, Transcribe)]
    done = events(s.handle(TranscriptionDone(asr.item_id, "hello"), 0))
    completed = next(
        ev for ev in done if isinstance(ev, rt.ConversationItemInputAudioTranscriptionCompletedEvent)
    )
    assert completed.usage.seconds == 0.75
    start, _ = respond(s)
    s.handle(ResponseTextDelta(start.response_id, start.epoch, "Hello to you."), 0)
    out = events(s.handle(ResponseFinished(start.response_id, start.epoch), 0))
    done_ev = next(ev for ev in out if isinstance(ev, rt.ResponseDoneEvent))
    usage = done_ev.response.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens == 4, (
        "estimated without backend usage"
    )
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    limits = out[-1]
    assert isinstance(limits, rt.RateLimitsUpdatedEvent) and limits.rate_limits[0].limit == 8192


def test_oversized_instructions_and_item_text_are_refused_before_any_echo() -> None:
    s = session(Limits(max_instructions_chars=100, max_item_text_chars=50, voices=frozenset({"default"})))
    (err,) = events(client(s, {"type": "session.update", "session": {"instructions": "x" * 101}}))
    assert isinstance(err, rt.ErrorEvent) and err.error.code == "string_above_max_length"
    assert err.error.param == "session.instructions" and len(rt.encode_server_event(err)) < 400
    assert s.settings.instructions == ""
    (err,) = errors(say(s, "y" * 51))
    assert err.error.code == "string_above_max_length" and err.error.param == "item.content[0].text"
    (err,) = errors(client(s, {"type": "response.create", "response": {"instructions": "z" * 101}}))
    assert err.error.param == "response.instructions" and s.response is None
    out = {"type": "function_call_output", "call_id": "c", "output": "o" * 51}
    (err,) = errors(client(s, {"type": "conversation.item.create", "item": out}))
    assert err.error.param == "item.output"
    prompt = {"audio": {"input": {"transcription": {"model": "x", "prompt": "p" * 101}}}}
    (err,) = errors(client(s, {"type": "session.update", "session": prompt}))
    assert err.error.param == "session.audio.input.transcription.prompt" and s.settings.transcription is None
    (err,) = errors(client(s, {"type": "response.create", "response": {"metadata": {"k": "v" * 513}}}))
    assert err.error.param == "response.metadata"
