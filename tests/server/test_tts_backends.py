"""/v1/realtime and /v1/audio/speech behave the same with every TTS backend: Piper (embedded), the
codec LM (`--tts codec`, tiny config, random weights: its audio is noise, so no transcription here) and
Qwen3-TTS (`--tts qwen3`, the tiny checkpoint in the published layout from tests/fixtures, greedy)."""

from __future__ import annotations

import base64
import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import soundfile

from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.server.realtime_sdk_client import FRAME_BYTES, collect_until, connect, is_done, text_turn

# Its gateways are reached through ``request.getfixturevalue``, which collection cannot see.
pytestmark = pytest.mark.live

TEXT = "Please open the door for me. Thank you."


@pytest.fixture(scope="module")
def codec_server() -> Iterator[LiveServer]:
    server = start_server(
        "--policy", "none", "--api-key", "test-key", "--tts", "codec", "--tts-config", "tiny",
        "--no-cpu-backend-spare", name="codec",
    )  # fmt: skip
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def qwen3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    ckpt = tmp_path_factory.mktemp("qwen3") / "ckpt"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_tts_tiny", ckpt)
    gen = json.loads((ckpt / "generation_config.json").read_text())
    # greedy: the same text gives the same codes, so every response format has the same length
    (ckpt / "generation_config.json").write_text(
        json.dumps({**gen, "do_sample": False, "subtalker_dosample": False})
    )
    server = start_server(
        "--policy", "none", "--api-key", "test-key", "--tts", "qwen3", "--tts-path", str(ckpt),
        "--tts-voice", "ryan", "--no-cpu-backend-spare", name="qwen3",
    )  # fmt: skip
    yield server
    stop_server(server)


@pytest.fixture(params=["piper", "codec", "qwen3"])
def backend_server(request: pytest.FixtureRequest) -> LiveServer:
    return request.getfixturevalue({"piper": "voice_server"}.get(request.param, f"{request.param}_server"))


async def test_text_turn_streams_80ms_frames_and_transcript(backend_server: LiveServer) -> None:
    async with connect(backend_server, audio={"input": {"turn_detection": None}}) as conn:
        events = await text_turn(conn, TEXT)
    assert events[-1].response.status == "completed"
    deltas = [e for e in events if e.type == "response.output_audio.delta"]
    sizes = [len(base64.b64decode(d.delta)) for d in deltas]
    assert len(deltas) >= 10
    assert all(s == FRAME_BYTES for s in sizes[:-1]) and 0 < sizes[-1] <= FRAME_BYTES
    assert [d.model_extra["seq"] for d in deltas] == list(range(len(deltas)))
    transcript = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    assert " ".join(transcript.split()) == TEXT


async def test_cancel_mid_stream(backend_server: LiveServer) -> None:
    async with connect(backend_server, audio={"input": {"turn_detection": None}}) as conn:
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": TEXT * 4}]}
        )
        await conn.response.create()
        await collect_until(conn, lambda e: e.type == "response.output_audio.delta")
        await conn.response.cancel()
        rest = await collect_until(conn, is_done)
        assert rest[-1].response.status == "cancelled"
        after = await text_turn(conn, "Thank you.")
    assert after[-1].response.status == "completed"
    assert all(getattr(e, "response_id", None) != rest[-1].response.id for e in after)


def test_speech_formats(backend_server: LiveServer) -> None:
    def post(**body: str) -> httpx.Response:
        resp = httpx.post(
            backend_server.http + "/v1/audio/speech",
            json={"input": TEXT, **body},
            headers={"Authorization": "Bearer test-key"},
            timeout=120,
        )
        assert resp.status_code == 200, resp.text
        return resp

    raw = post(response_format="pcm").content
    sse_lines = [
        json.loads(x[5:])
        for x in post(response_format="pcm", stream_format="sse").text.splitlines()
        if x.startswith("data:")
    ]
    sse = b"".join(base64.b64decode(e["audio"]) for e in sse_lines if e["type"] == "speech.audio.delta")
    wav, rate = soundfile.read(io.BytesIO(post(response_format="wav").content), dtype="int16")
    assert rate == 24000 and sse_lines[-1]["type"] == "speech.audio.done"
    lengths = [len(raw), len(sse), wav.size * 2]
    # both backends sample (Piper its prosody noise, the codec LM its tokens): the words, and so the
    # length, stay nearly the same; the tone backend shows byte equality in test_speech.py
    assert max(lengths) <= 1.2 * min(lengths), lengths
