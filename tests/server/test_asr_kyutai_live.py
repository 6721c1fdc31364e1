"""``--asr kyutai`` end to end (tiny config, random init: the words are noise, the event flow is real):
a manual turn streams to the GPU-style slot stage while it is appended and its transcription completes
under the committed item's id; a second session after the first one left gets a slot again."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from realtime_gw.testing.audio import synthesize
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.server.realtime_sdk_client import collect_until, connect

RATE = 24000


@pytest.fixture(scope="module")
def kyutai_server() -> Iterator[LiveServer]:
    server = start_server(
        "--policy", "none", "--tts", "tone", "--api-key", "test-key",
        "--asr", "kyutai", "--asr-config", "tiny", "--asr-max-batch", "2", "--asr-flush-s", "0.3",
        "--no-cpu-backend-spare", name="kyutai",
    )  # fmt: skip
    yield server
    stop_server(server)


async def test_a_manual_turn_is_transcribed_by_the_streaming_stage(kyutai_server: LiveServer) -> None:
    speech = synthesize("Please turn on the lights.", RATE)
    audio_in = {"transcription": {"model": "kyutai"}, "turn_detection": None}
    for _ in range(3):  # more turns than slots: each stream gives its slot back
        async with connect(kyutai_server, audio={"input": audio_in}, output_modalities=["text"]) as conn:
            step = RATE * 2 // 10
            for i in range(0, len(speech), step):
                await conn.input_audio_buffer.append(audio=base64.b64encode(speech[i : i + step]).decode())
            await conn.input_audio_buffer.commit()
            events = await collect_until(
                conn, lambda e: e.type.startswith("conversation.item.input_audio_transcription.") and
                not e.type.endswith(".delta"), timeout=60,
            )  # fmt: skip
        names = [e.type for e in events]
        assert "error" not in names, names
        done = events[-1]
        assert done.type == "conversation.item.input_audio_transcription.completed", done
        committed = next(e for e in events if e.type == "input_audio_buffer.committed")
        assert done.item_id == committed.item_id
        assert isinstance(done.transcript, str)


def test_a_file_is_transcribed_by_the_streaming_stage(kyutai_server: LiveServer) -> None:
    """``POST /v1/audio/transcriptions`` on Kyutai: the SDK's json and verbose_json shapes (segment
    times; the stage gives no word times, so asking for them is a 400 naming the field)."""
    import openai
    from openai.types.audio import TranscriptionVerbose

    from realtime_gw.testing.audio_files import encode

    client = openai.OpenAI(base_url=kyutai_server.http + "/v1", api_key="test-key", max_retries=0)
    wav = ("turn.wav", encode(synthesize("Please turn on the lights.", RATE), RATE, "wav"))
    verbose = client.audio.transcriptions.create(
        file=wav, model="gpt-4o-transcribe", response_format="verbose_json", timestamp_granularities=["segment"]
    )
    assert isinstance(verbose, TranscriptionVerbose) and verbose.segments and verbose.words is None
    assert verbose.segments[0].start == 0 and abs(verbose.segments[-1].end - verbose.duration) < 0.01
    with pytest.raises(openai.BadRequestError) as refused:
        client.audio.transcriptions.create(
            file=wav, model="whisper-1", response_format="verbose_json", timestamp_granularities=["word"]
        )
    assert refused.value.body["param"] == "timestamp_granularities"  # type: ignore[index]
