"""Streaming TTS over HTTP (raw and SSE) and over the incremental-text WebSocket."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile
import websockets

from realtime_gw.testing.audio import transcribe, wer
from realtime_gw.testing.gateway import LiveServer

AUTH = {"Authorization": "Bearer test-key"}
TEXT = "Please open the door for me. I would like a cup of coffee."


def speech(server: LiveServer, **body: Any) -> httpx.Response:
    return httpx.post(server.http + "/v1/audio/speech", json={"input": TEXT, **body}, headers=AUTH, timeout=60)


def sse_audio(resp: httpx.Response) -> tuple[bytes, list[dict[str, Any]]]:
    events = [json.loads(line[5:]) for line in resp.text.splitlines() if line.startswith("data:")]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    return audio, events


def test_tone_backend_every_format_carries_identical_audio(tone_server: LiveServer) -> None:
    pcm = speech(tone_server, response_format="pcm").content
    assert len(pcm) > 0 and len(pcm) % 2 == 0
    sse, events = sse_audio(speech(tone_server, response_format="pcm", stream_format="sse"))
    assert events[-1]["type"] == "speech.audio.done"
    wav, rate = soundfile.read(io.BytesIO(speech(tone_server, response_format="wav").content), dtype="int16")
    flac, _ = soundfile.read(io.BytesIO(speech(tone_server, response_format="flac").content), dtype="int16")
    assert rate == 24000
    assert sse == pcm
    assert wav.tobytes() == pcm
    assert flac.tobytes() == pcm


def test_piper_raw_sse_and_wav_all_speak_the_text(voice_server: LiveServer) -> None:
    raw = speech(voice_server, response_format="pcm")
    assert raw.headers["content-type"].startswith("audio/pcm")
    sse, _ = sse_audio(speech(voice_server, response_format="pcm", stream_format="sse"))
    wav_resp = speech(voice_server, response_format="wav")
    wav, rate = soundfile.read(io.BytesIO(wav_resp.content), dtype="int16")
    assert rate == 24000
    for audio in (raw.content, sse, wav.tobytes()):
        assert wer(TEXT, transcribe(audio, 24000)) <= 0.25
    # Piper samples its prosody noise, so lengths differ a little between requests, not the words.
    lengths = [len(raw.content), len(sse), wav.size * 2]
    assert max(lengths) < 1.2 * min(lengths)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"voice": "nobody"}, "voice"),
        ({"response_format": "mp3"}, "response_format"),
        ({"stream_format": "video"}, "stream_format"),
        ({"speed": 9.0}, "speed"),
        ({"instructions": "x" * 4097}, "instructions"),  # piper ignores instructions, but not their bound
    ],
)
def test_bad_speech_requests_get_openai_errors(voice_server: LiveServer, body: dict[str, Any], param: str) -> None:
    resp = speech(voice_server, **body)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_speech_auth_and_malformed_body(voice_server: LiveServer) -> None:
    resp = httpx.post(voice_server.http + "/v1/audio/speech", json={"input": "hi"}, timeout=10)
    assert resp.status_code == 401
    resp = httpx.post(voice_server.http + "/v1/audio/speech", content=b"{nope", headers=AUTH, timeout=10)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"
    resp = httpx.post(voice_server.http + "/v1/audio/speech", json={"voice": "alloy"}, headers=AUTH, timeout=10)
    assert resp.status_code == 400 and "input" in resp.json()["error"]["message"]


async def _utterance(ws: Any) -> tuple[dict[str, Any], list[bytes], dict[str, Any]]:
    start = json.loads(await ws.recv())
    assert start["type"] == "audio.start", start
    frames: list[bytes] = []
    while True:
        msg = await asyncio.wait_for(ws.recv(), 60)
        if isinstance(msg, bytes):
            frames.append(msg)
            continue
        done = json.loads(msg)
        assert done["type"] == "audio.done", done
        return start, frames, done


async def test_ws_utterance_grows_while_spoken(voice_server: LiveServer) -> None:
    url = voice_server.ws + "/v1/audio/speech/stream"
    async with websockets.connect(url, additional_headers=AUTH) as ws:
        await ws.send(json.dumps({"type": "session.config", "voice": "alloy"}))
        await ws.send(json.dumps({"type": "input.text", "text": "Please open the door for me. "}))
        start = json.loads(await ws.recv())
        assert start["type"] == "audio.start" and start["sample_rate"] == 24000
        first = await asyncio.wait_for(ws.recv(), 30)
        assert isinstance(first, bytes)  # the first sentence is being spoken...
        # ...while the rest of the text is still arriving, mid-sentence.
        await ws.send(json.dumps({"type": "input.text", "text": "I would like a cup"}))
        await ws.send(json.dumps({"type": "input.text", "text": " of coffee."}))
        await ws.send(json.dumps({"type": "input.done"}))
        frames = [first]
        while True:
            msg = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(msg, bytes):
                frames.append(msg)
                continue
            done = json.loads(msg)
            break
    assert done["type"] == "audio.done" and done["frames"] == len(frames)
    assert done["text"] == TEXT
    assert all(len(f) == 3840 for f in frames[:-1])
    heard = transcribe(b"".join(frames), 24000)
    assert wer(TEXT, heard) <= 0.25, heard
    # no gap: the audio has no stretch of digital silence longer than a sentence pause
    pcm = np.frombuffer(b"".join(frames), dtype="<i2")
    silent = np.abs(pcm) < 50
    longest, run = 0, 0
    for s in silent[:: 24]:  # 1 ms steps
        run = run + 1 if s else 0
        longest = max(longest, run)
    assert longest < 1200, f"{longest} ms of silence inside the utterance"


async def test_ws_bad_input_then_a_good_utterance(voice_server: LiveServer) -> None:
    url = voice_server.ws + "/v1/audio/speech/stream"
    async with websockets.connect(url, additional_headers=AUTH) as ws:
        for bad, code in [
            ({"type": "input.text", "text": ""}, "invalid_value"),
            ({"type": "session.config", "voice": "nobody"}, "invalid_value"),
            ({"type": "input.done"}, "no_utterance"),
            ({"type": "explode"}, "invalid_event"),
        ]:
            await ws.send(json.dumps(bad))
            err = json.loads(await ws.recv())
            assert err["type"] == "error" and err["code"] == code, (bad, err)
        await ws.send("{nope")
        assert json.loads(await ws.recv())["code"] == "invalid_json"
        await ws.send(json.dumps({"type": "input.text", "text": "Thank you very much."}))
        await ws.send(json.dumps({"type": "input.done"}))
        _, frames, done = await _utterance(ws)
        assert done["utterance"] == 1 and frames
        # a second utterance on the same socket
        await ws.send(json.dumps({"type": "input.text", "text": "My phone is on the table."}))
        await ws.send(json.dumps({"type": "input.done"}))
        start, frames, done = await _utterance(ws)
        assert start["utterance"] == done["utterance"] == 2
    assert wer("My phone is on the table.", transcribe(b"".join(frames), 24000)) <= 0.25


async def test_ws_speech_refuses_wrong_key(voice_server: LiveServer) -> None:
    with pytest.raises(websockets.InvalidStatus):
        async with websockets.connect(voice_server.ws + "/v1/audio/speech/stream"):
            pass
