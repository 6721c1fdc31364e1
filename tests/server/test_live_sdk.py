"""GPT-Live end to end: the official ``openai`` SDK's ``client.live.connect()`` against a live gateway
(Piper, pocketsphinx, Silero) whose responder is the scripted chat server; every server event is
validated strictly against ``openai.types.live``."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from realtime_gw.sessions.live_delegation import ACKNOWLEDGE, SPEAK_RESULT
from realtime_gw.testing.audio import synthesize, transcribe, wer
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.chat_server import ChatServer, Reply, ToolCallReply, running_chat_server, say_back
from tests.server.live_sdk_client import (
    RATE,
    Heard,
    listen,
    live_session,
    recv,
    silence,
    spoke_then_quiet,
    stream_audio,
)

COMMENTARY = "Tell the user this now, briefly and in your own words: "


def voice_front(body: dict[str, Any]) -> Reply:
    """The responder: speaks a commentary or a delegation's result, delegates when asked to look
    something up, else says back what it heard."""
    last = body["messages"][-1]
    content = last["content"] if isinstance(last["content"], str) else json.dumps(last["content"])
    if last["role"] == "tool":
        return Reply(content)
    offered = {t["function"]["name"] for t in body.get("tools", [])}
    if "get_weather" in offered and last["role"] == "user":  # the backend model, asked to look it up
        return Reply("", [ToolCallReply("get_weather", json.dumps({"city": "Paris"}))])
    if last["role"] == "system" and content == ACKNOWLEDGE:
        return Reply("One moment please.")
    if last["role"] == "system" and content == SPEAK_RESULT:
        return Reply(next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool"))
    if last["role"] == "system" and content.startswith(COMMENTARY):
        task = content[len(COMMENTARY) :]
        if task.startswith("Look up"):
            return Reply("", [ToolCallReply("delegate", json.dumps({"task": task}), "call_lookup")])
        return Reply(task)
    return say_back(body)


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[ChatServer, LiveServer]]:
    with running_chat_server(voice_front) as chat:
        server = start_server(
            "--policy", "none", "--api-key", "test-key", "--responder", "openai", "--responder-url", chat.url,
            "--tts-deterministic", "--no-cpu-backend-spare", name="live",
        )  # fmt: skip
        yield chat, server
        stop_server(server)


async def test_spoken_turn_is_transcribed_and_answered_aloud(gateway: tuple[ChatServer, LiveServer]) -> None:
    _, server = gateway
    text = "Please open the door for me."
    async with live_session(server, instructions="Be brief.") as conn:
        resource = conn.started.session
        assert resource.audio.format.type == "audio/pcm" and resource.audio.format.rate == RATE
        assert resource.delegation.type == "client" and resource.model == "gpt-live-1"
        sender = asyncio.create_task(stream_audio(conn, silence(400) + synthesize(text, RATE) + silence(1500)))
        heard = await listen(conn, Heard(), spoke_then_quiet(), timeout=60)
        await sender
    assert wer(text, heard.input_text) <= 0.25, heard.input_text
    spoken = heard.of("session.input_transcript.delta")
    assert all(200 <= d.start_ms < d.end_ms for d in spoken)
    assert heard.output_text.startswith("You said:")
    assert wer(heard.output_text, transcribe(heard.speech(), RATE)) <= 0.4
    # one continuous stream on the session clock: each frame starts where the previous one ended
    frames = heard.audio
    assert frames[0][0] == 0
    assert all(b[0] == a[1] for a, b in zip(frames, frames[1:], strict=False))
    assert sum(1 for _, _, pcm in frames if not any(pcm)) > 10  # the silence before the reply is in it


async def test_client_delegation_answered_by_commentary_is_spoken(gateway: tuple[ChatServer, LiveServer]) -> None:
    _, server = gateway
    async with live_session(server) as conn:
        await conn.session.commentary.append(content="Look up the weather in Paris.", delegation_id=None, event_id="ask")
        heard = await listen(conn, Heard(), lambda h: bool(h.of("session.delegation.created")))
        assert heard.of("session.commentary.appended")[0].client_event_id == "ask"
        (created,) = heard.of("session.delegation.created")
        assert (created.delegation.id, created.delegation.target) == ("call_lookup", "client")
        answer = "The weather in Paris is warm and sunny."
        await conn.session.commentary.append(content=answer, delegation_id=created.delegation.id, event_id="result")
        heard = await listen(conn, Heard(), spoke_then_quiet())
    assert heard.of("session.commentary.appended")[0].client_event_id == "result"
    # the voice acknowledged the silent delegation on its own, then spoke the result
    assert heard.output_text.strip() == "One moment please. " + answer
    assert wer(heard.output_text, transcribe(heard.speech(), RATE)) <= 0.4


async def test_mute_thinking_and_refusals_keep_the_session(gateway: tuple[ChatServer, LiveServer]) -> None:
    chat, server = gateway
    async with live_session(server) as conn:
        await conn.session.input_audio.mute(event_id="m")
        heard = await listen(conn, Heard(), lambda h: bool(h.of("session.input_audio.muted")))
        assert heard.of("session.input_audio.muted")[0].client_event_id == "m"
        asked = len(chat.requests)
        await stream_audio(conn, silence(200) + synthesize("Hello there, can you hear me?", RATE) + silence(900))
        await conn.session.thinking.append(content="The user's name is Ada.", delegation_id=None, event_id="t")
        await conn.session.input_audio.unmute(event_id="u")
        heard = await listen(conn, Heard(), lambda h: bool(h.of("session.input_audio.unmuted")))
        assert heard.of("session.thinking.appended")[0].client_event_id == "t"
        assert heard.input_text == "" and heard.output_text == ""  # muted speech unheard; thinking silent
        assert not any(any(pcm) for _, _, pcm in heard.audio)
        assert len(chat.requests) == asked  # nothing asked the voice to speak
        refusals = [
            ({"type": "session.start", "session": {"model": "gpt-live-1"}}, "session_already_started"),
            ({"type": "decision.create"}, "unsupported_event"),
            ({"type": "session.thinking.append", "content": "word " * 600}, "invalid_value"),
            ({"type": "session.commentary.append", "content": "x", "delegation_id": "nope"}, "invalid_value"),
            ({"type": "session.input_audio.mute", "loudly": True}, "unknown_parameter"),
            ({"type": "response.create"}, "invalid_value"),  # needs Responses delegation
            ({"type": "session.output_audio.fixture.play", "audio": "AAAA"}, "invalid_value"),
        ]
        for i, (event, code) in enumerate(refusals):
            await conn.send({**event, "event_id": f"bad{i}"})
            heard = await listen(conn, Heard(), lambda h: bool(h.of("error")))
            (error,) = heard.of("error")
            assert (error.error.code, error.error.client_event_id) == (code, f"bad{i}"), error
        await conn.session.close(event_id="bye")
        heard = await listen(conn, Heard(), lambda h: bool(h.of("session.closed")))
    (closed,) = heard.of("session.closed")
    assert (closed.reason, closed.client_event_id) == ("close_requested", "bye")
    assert closed.session.id == conn.started.session.id and closed.usage.seconds >= 0


async def test_fixture_plays_into_the_output_stream(gateway: tuple[ChatServer, LiveServer]) -> None:
    _, server = gateway
    text = "My phone is on the table."
    clip = synthesize(text, RATE)
    async with live_session(server) as conn:
        await conn.session.output_audio.fixture.play(audio=base64.b64encode(clip).decode(), event_id="clip")
        heard = await listen(conn, Heard(), lambda h: bool(h.of("session.output_audio.fixture.played")))
    assert heard.of("session.output_audio.fixture.playing")[0].client_event_id == "clip"
    assert heard.of("session.output_audio.fixture.played")[0].client_event_id == "clip"
    assert wer(text, transcribe(heard.speech(), RATE)) <= 0.25
    played_at = heard.events.index(heard.of("session.output_audio.fixture.played")[0])
    last_sound = max(i for i, e in enumerate(heard.events) if e.type == "session.output_audio.delta" and any(base64.b64decode(e.delta)))
    assert played_at > last_sound


async def test_events_before_start_are_refused(gateway: tuple[ChatServer, LiveServer]) -> None:
    from openai import AsyncOpenAI

    _, server = gateway
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key")
    async with client.live.connect() as conn:
        await conn.session.input_audio.mute(event_id="early")
        error = await recv(conn)
        assert (error.type, error.error.code, error.error.client_event_id) == ("error", "session_not_started", "early")
        await conn.session.start(session={"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcmu", "rate": 8000}}})
        started = await recv(conn)
        assert started.type == "session.started" and started.session.audio.format.type == "audio/pcmu"
        info = await recv(conn)  # what the model names run on, validated as the SDK's InfoEvent
        assert info.type == "info" and info.code == "model_mapped" and "gpt-live-1" in info.message
        frame = await recv(conn)
        assert frame.type == "session.output_audio.delta" and frame.start_ms == 0


async def test_responses_delegation_function_round_trip_is_spoken(gateway: tuple[ChatServer, LiveServer]) -> None:
    chat, server = gateway
    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    delegation = {"type": "responses", "responses": {"model": "gpt-5.4-mini", "tools": [weather]}}
    async with live_session(server, delegation=delegation) as conn:
        assert conn.started.session.delegation.type == "responses"
        await conn.session.commentary.append(content="Look up the weather in Paris.", delegation_id=None)
        heard = await listen(conn, Heard(), lambda h: any(e.type == "response.event" and e.event["type"] == "response.completed" for e in h.events))
        (created,) = heard.of("session.delegation.created")
        assert created.delegation.target == "responses" and created.delegation.response_id
        calls = [e.event["item"] for e in heard.of("response.event") if e.event["type"] == "response.output_item.done"]
        assert [c["name"] for c in calls] == ["get_weather"]
        assert all(e.delegation_id == created.delegation.id for e in heard.of("response.event"))
        await conn.response.create(event_id="early")  # before the output: a partial batch, refused
        heard = await listen(conn, heard, lambda h: bool(h.of("error")))
        assert heard.of("error")[0].error.client_event_id == "early"
        output = {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "Sunny and warm in Paris."}
        await conn.response.item.create(item=output)  # type: ignore[arg-type]
        await conn.response.create(event_id="go")
        heard = await listen(conn, Heard(), spoke_then_quiet(), timeout=60)
    kinds = [e.event["type"] for e in heard.of("response.event")]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "Sunny and warm in Paris." in heard.output_text
    assert wer(heard.output_text, transcribe(heard.speech(), RATE)) <= 0.4
    assert [m["role"] for m in chat.requests[-2]["messages"]][-1] == "tool"  # the backend continued
