"""What every framework test does to the gateway, and what it checks: the scripted model behind the
chat server, real speech for server-VAD barge-ins, and the end-of-run checks on the tapped events."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from realtime_gw.sessions.live_delegation import ACKNOWLEDGE, DELEGATE_TOOL, SPEAK_RESULT
from realtime_gw.testing.audio import normalize, synthesize
from tests.chat_server import ChatServer, Reply, ToolCallReply
from tests.frameworks.tap import RealtimeTap
from tests.server.sdk_events import SDK_EVENTS

STORY = (
    "Once upon a time a lighthouse keeper counted the ships that passed his island. "
    "Every evening he lit the lamp, wrote the names in a book and listened to the sea. "
    "One winter night a small boat without a name came close to the rocks, and he rowed out to meet it. "
    "Inside he found a cat, a map of the stars and a letter addressed to him."
)
"""About 20 s of tone audio: an interruption lands mid-answer."""

BARGE_IN = "Please open the door for me."
RATE = 24000


def forecast(city: str) -> str:
    return f"sunny and 21 degrees in {city}"


def latest_text(body: dict[str, Any]) -> str:
    """The newest user text of a chat request ("" before the user said anything)."""
    for message in reversed(body["messages"]):
        if message["role"] == "user" and message.get("content"):
            content = message["content"]
            if isinstance(content, list):
                return " ".join(p["text"] for p in content if p.get("type") == "text")
            return content
    return ""


GREETING = "Hello! How can I help?"


def weather_agent(body: dict[str, Any]) -> Reply:
    """The model behind every framework test: calls ``get_weather`` when asked about the weather and
    the tool is offered, speaks the tool's result when it comes back, tells a story when asked, greets
    when nobody spoke yet, and otherwise repeats what it heard. As a GPT-Live voice front it hands
    the weather to the backend (its ``delegate`` tool), says "one moment" when asked to acknowledge,
    and speaks a delegation's result when asked to."""
    last = body["messages"][-1]
    if last["role"] == "system" and last["content"] == ACKNOWLEDGE:
        return Reply("One moment please.")
    if last["role"] == "system" and last["content"] == SPEAK_RESULT:
        return Reply(next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool"))
    if last["role"] == "tool":
        return Reply(f"The weather service says {json.loads(last['content'])['forecast']}.")
    text = latest_text(body)
    if not text:
        return Reply(GREETING)
    offered = {t["function"]["name"] for t in body.get("tools", [])}
    if "weather" in text.lower() and DELEGATE_TOOL in offered:
        return Reply(tool_calls=[ToolCallReply(DELEGATE_TOOL, json.dumps({"task": text}))])
    if "weather" in text.lower() and "get_weather" in offered:
        return Reply(tool_calls=[ToolCallReply("get_weather", json.dumps({"city": "Paris"}))])
    if "story" in text.lower():
        return Reply(STORY)
    return Reply(f"You said {text}")


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "tool"]


@functools.lru_cache(maxsize=16)
def speech(text: str) -> bytes:
    """Piper's speech for ``text`` (the same sentences come back in every framework's run)."""
    return synthesize(text, RATE)


async def speak(
    send: Callable[[bytes], Awaitable[None]],
    text: str,
    heard: Callable[[], bool],
    pace: float = 0.25,
    max_silence_s: float = 10.0,
) -> None:
    """Real speech (Piper) through the framework's own audio input, in 100 ms chunks at ``pace`` x
    real time, then silence as a live microphone keeps sending until ``heard()`` (the turn ended:
    semantic VAD may wait seconds for it)."""
    pcm = await asyncio.to_thread(speech, text)
    chunk = RATE * 2 // 10
    silence = b"\x00" * chunk
    for start in range(0, len(pcm), chunk):
        await send(pcm[start : start + chunk])
        await asyncio.sleep(0.1 * pace)
    for _ in range(int(max_silence_s * 10)):
        if heard():
            return
        await send(silence)
        await asyncio.sleep(0.1 * pace)


async def speak_turn(driver: Driver, tap: RealtimeTap, text: str) -> None:
    """``text`` spoken until the gateway commits it as a user turn."""
    start = len(tap.server_events)
    await driver.send_audio(b"\x00" * (RATE * 2 * 3 // 10))  # a moment of room tone first
    await speak(driver.send_audio, text, lambda: "input_audio_buffer.committed" in tap.types()[start:])


def transcript_of(tap: RealtimeTap, response_id: str) -> str:
    return "".join(
        e.get("delta", "")
        for e in tap.events()
        if e["type"] in ("response.output_audio_transcript.delta", "response.output_text.delta")
        and e.get("response_id") == response_id
    )


def check_clean_run(tap: RealtimeTap, still_open: bool = True) -> None:
    """No error event from the gateway, every event is a valid GA event, one connection (still open
    when the framework has not been closed yet)."""
    assert tap.errors() == [], tap.errors()
    tap.validate_all()
    extensions = set(tap.types()) - set(SDK_EVENTS)
    assert not extensions, f"extension events the client never enabled: {extensions}"
    assert tap.connections == 1, "the framework never had to reconnect"
    if still_open:
        assert tap.open_connections == 1, "the framework's connection is alive"


class Driver(Protocol):
    """How a test works one framework: each method goes through that framework's own API."""

    async def say(self, text: str) -> None:
        """A user turn that gets a response: typed where the framework has typed turns, else spoken."""

    async def interrupt(self) -> None:
        """What the framework does when the application interrupts the assistant."""

    async def send_audio(self, pcm: bytes) -> None:
        """24 kHz PCM16 microphone audio."""


async def tool_turn(driver: Driver, tap: RealtimeTap, chat: ChatServer) -> None:
    """The model calls get_weather, the framework runs it and sends the output back; the model's
    next request carries it and the spoken answer uses it."""
    start = len(tap.server_events)
    await driver.say("What is the weather like in Paris?")
    call = await tap.wait_for("response.function_call_arguments.done", start)
    assert json.loads(tap.event(call)["arguments"]) == {"city": "Paris"}
    done = await tap.wait_for("response.done", call)
    assert tap.event(done)["response"]["status"] == "completed"
    assert [o["type"] for o in tap.event(done)["response"]["output"]] == ["function_call"]
    answer = await tap.wait_for("response.done", done + 1, status="completed")
    assert (
        transcript_of(tap, tap.event(answer)["response"]["id"])
        == f"The weather service says {forecast('Paris')}."
    )
    request = next(r for r in reversed(chat.requests) if tool_results(r))
    (result,) = tool_results(request)
    assert json.loads(result["content"]) == {"forecast": forecast("Paris")}
    (asked,) = [m for m in request["messages"] if m.get("tool_calls")]
    assert asked["tool_calls"][0]["id"] == result["tool_call_id"], "the output answers the call"


async def interrupted_turn(driver: Driver, tap: RealtimeTap) -> None:
    """The application interrupts mid-answer: the reply stops (cancelled), nothing errors."""
    start = len(tap.server_events)
    await driver.say("Tell me a story.")
    first_audio = await tap.wait_for("response.output_audio.delta", start)
    story_id = tap.event(first_audio)["response_id"]
    await asyncio.sleep(0.5)
    await driver.interrupt()
    done = await tap.wait_for("response.done", first_audio, timeout=10)
    assert tap.event(done)["response"]["status"] == "cancelled"
    assert len(transcript_of(tap, story_id)) < len(STORY)


async def plain_turn(driver: Driver, tap: RealtimeTap, chat: ChatServer) -> None:
    start = len(tap.server_events)
    await driver.say("Thank you.")
    done = await tap.wait_for("response.done", start)
    assert tap.event(done)["response"]["status"] == "completed"
    said = latest_text(chat.requests[-1])
    assert normalize(said) == "thank you"
    assert transcript_of(tap, tap.event(done)["response"]["id"]) == f"You said {said}"


async def barge_in_turn(driver: Driver, tap: RealtimeTap, chat: ChatServer) -> None:
    """Speech over the assistant's answer: server VAD cuts it, then the reply to what was said."""
    start = len(tap.server_events)
    await driver.say("Tell me another story.")
    first_audio = await tap.wait_for("response.output_audio.delta", start)
    await speak_turn(driver, tap, BARGE_IN)
    started = await tap.wait_for("input_audio_buffer.speech_started", first_audio)
    interrupted = await tap.wait_for("response.done", first_audio)
    status = tap.event(interrupted)["response"]["status"]
    assert interrupted > started and status == "cancelled", (
        f"the answer ({status}) to {latest_text(chat.requests[-1])!r} ended before the speech over it"
    )
    heard = await tap.wait_for(
        "conversation.item.input_audio_transcription.completed",
        started,
        item_id=tap.event(started)["item_id"],
    )
    reply = await tap.wait_for("response.done", interrupted + 1, status="completed")
    said = tap.event(heard)["transcript"]
    assert said.strip(), "the barge-in speech was heard"
    replied = transcript_of(tap, tap.event(reply)["response"]["id"])
    assert replied == f"You said {said}", (replied, said)
    assert latest_text(chat.requests[-1]) == said, (chat.requests[-1]["messages"][-2:], said)


async def run_scenario(driver: Driver, tap: RealtimeTap, chat: ChatServer) -> None:
    await tool_turn(driver, tap, chat)
    await interrupted_turn(driver, tap)
    await plain_turn(driver, tap, chat)
    await barge_in_turn(driver, tap, chat)
