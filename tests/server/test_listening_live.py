"""Live gateway (Piper speech in, pocketsphinx streaming, Silero, Smart Turn) through the openai SDK:
transcript deltas while the user speaks, and semantic VAD ending a finished sentence sooner than an
unfinished one after the same pause."""

from __future__ import annotations

import asyncio
import time

from realtime_gw.testing.audio import synthesize, wer
from realtime_gw.testing.gateway import LiveServer
from tests.server.realtime_sdk_client import RATE, collect_until, connect, silence, speak


async def test_transcript_deltas_arrive_while_the_user_speaks(voice_server: LiveServer) -> None:
    text = "I would like to book a table for two people tomorrow evening."
    speech = synthesize(text, RATE)
    assert 2.5 <= len(speech) / (RATE * 2) <= 4.0  # a ~3 s utterance
    audio_in = {"transcription": {"model": "pocketsphinx"}, "turn_detection": {"type": "server_vad"}}
    async with connect(voice_server, audio={"input": audio_in}) as conn:
        sender = asyncio.create_task(speak(conn, silence(300) + speech + silence(1200)))
        events = await collect_until(conn, lambda e: e.type.endswith("input_audio_transcription.completed"))
        await sender
    names = [e.type for e in events]
    started = next(e for e in events if e.type == "input_audio_buffer.speech_started")
    stopped_at = names.index("input_audio_buffer.speech_stopped")
    delta_at = [
        i for i, name in enumerate(names) if name == "conversation.item.input_audio_transcription.delta"
    ]
    assert delta_at and delta_at[0] < stopped_at, f"no transcript delta before speech_stopped: {names}"
    deltas = [events[i] for i in delta_at]
    committed = next(e for e in events if e.type == "input_audio_buffer.committed")
    completed = events[-1]
    assert {d.item_id for d in deltas} == {started.item_id}
    assert started.item_id == committed.item_id == completed.item_id
    # Deltas are words the recogniser had settled on; a later revision shows in the transcript only.
    assert wer(completed.transcript, "".join(d.delta for d in deltas)) <= 0.25
    assert wer(text, completed.transcript) <= 0.25, completed.transcript


async def _end_of_turn_delay(server: LiveServer, text: str) -> float:
    """Seconds from the end of the sentence's audio to ``speech_stopped``, under semantic VAD
    (medium: at most 4 s), with 5 s of silence after the sentence."""
    audio_in = {"turn_detection": {"type": "semantic_vad", "eagerness": "medium"}}
    speech = synthesize(text, RATE)
    async with connect(server, audio={"input": audio_in}) as conn:
        spoken = asyncio.get_running_loop().create_future()

        async def talk() -> None:
            spoken.set_result(await speak(conn, silence(300) + speech))
            await speak(conn, silence(5000))

        sender = asyncio.create_task(talk())
        await collect_until(conn, lambda e: e.type == "input_audio_buffer.speech_stopped", timeout=30)
        stopped = time.monotonic()
        sender.cancel()
        return stopped - await spoken


async def test_semantic_vad_ends_a_finished_sentence_sooner(voice_server: LiveServer) -> None:
    finished, unfinished = await asyncio.gather(
        _end_of_turn_delay(voice_server, "What is the weather like in Paris today?"),
        _end_of_turn_delay(voice_server, "I was wondering whether the"),
    )
    # The finished sentence ends at its first pause (200 ms of silence plus the model's answer); the
    # unfinished one waits for the user to go on, until medium's 4 s.
    assert finished < 1.5 and unfinished > 3.0 and unfinished - finished > 2.0, (finished, unfinished)
