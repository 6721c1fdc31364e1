"""Custom voices through the ``openai`` SDK against live gateways over the tiny Qwen3-TTS checkpoints
(greedy): a consent recording, then a voice cloned from a sample on a Base checkpoint, which speaks exactly
as the same recording registered at start-up (``--tts-voice-clone``) over HTTP, the speech stream and
``/v1/realtime``; list/get/delete; each API key sees its own only; the voices survive a restart
(``--voices-dir``); kinds a checkpoint cannot make are refused. (Designed voices: in
``test_tts_qwen3_kinds_live``, on its VoiceDesign gateway.)"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import websockets
from openai import OpenAI
from openai.types.audio import Voice, VoiceConsent, VoiceDeleted

from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.server.qwen3_fixtures import CLONE_WAV, greedy_copy
from tests.server.realtime_sdk_client import audio_of, connect, text_turn

TEXT = "Hi there."
WARM = "A warm, low voice, speaking slowly."
OTHER_KEY = "other-key"


class Base:
    """A Base-checkpoint gateway that can be restarted on the same voices directory."""

    def __init__(self, tmp: Path) -> None:
        self.ckpt = greedy_copy("qwen3_tts_tiny_base", tmp)
        self.voices_dir = tmp / "voices"
        self.server = self.start()

    def start(self) -> LiveServer:
        return start_server(
            "--policy", "none", "--api-key", "test-key", "--api-keys", OTHER_KEY, "--tts", "qwen3",
            "--tts-path", str(self.ckpt), "--tts-voice-clone", f"anna={CLONE_WAV}",
            "--voices-dir", str(self.voices_dir), "--no-cpu-backend-spare", name="qwen3-voices",
        )  # fmt: skip

    def restart(self) -> None:
        stop_server(self.server)
        self.server = self.start()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Base]:
    b = Base(tmp_path_factory.mktemp("base"))
    yield b
    stop_server(b.server)


def client(server: LiveServer, key: str = "test-key") -> OpenAI:
    return OpenAI(base_url=server.http + "/v1", api_key=key, max_retries=0, timeout=120)


def speak(server: LiveServer, voice: str | dict[str, str], key: str = "test-key", **extra: str) -> bytes:
    resp = client(server, key).audio.speech.create(
        model="gpt-4o-mini-tts", voice=voice, input=TEXT, response_format="pcm", **extra  # type: ignore[arg-type]
    )
    pcm = resp.read()
    assert pcm and len(pcm) % 2 == 0
    return pcm


def make_clone(server: LiveServer, key: str = "test-key", name: str = "Anna") -> Voice:
    c = client(server, key)
    raw = c.audio.voice_consents.with_raw_response.create(
        recording=CLONE_WAV.open("rb"), name="anna consent", language="en-US"
    )
    consent = VoiceConsent.model_validate(raw.http_response.json())  # every field, not a lenient parse
    assert consent.id.startswith("cons_") and consent.language == "en-US"
    made = c.audio.voices.with_raw_response.create(audio_sample=CLONE_WAV.open("rb"), consent=consent.id, name=name)
    voice = Voice.model_validate(made.http_response.json())
    assert voice.id.startswith("voice_") and voice.type == "audio_sample" and voice.name == name
    return voice


def listed(server: LiveServer, key: str = "test-key") -> list[str]:
    page = client(server, key).get("/audio/voices", cast_to=object)
    assert page["object"] == "list" and page["has_more"] is False  # type: ignore[index]
    return [Voice.model_validate(v).id for v in page["data"]]  # type: ignore[index]


async def test_a_cloned_voice_speaks_as_the_start_up_clone(base: Base) -> None:
    """The same recording as ``--tts-voice-clone anna=...``: the same audio on every speech path."""
    server = base.server
    voice = make_clone(server)
    anna = speak(server, "anna")
    assert speak(server, {"id": voice.id}) == anna
    async with websockets.connect(server.ws + "/v1/audio/speech/stream",
                                  additional_headers={"Authorization": "Bearer test-key"}) as ws:  # fmt: skip
        await ws.send(json.dumps({"type": "session.config", "voice": {"id": voice.id}}))
        await ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        await ws.send(json.dumps({"type": "input.done"}))
        frames = []
        while isinstance(msg := await ws.recv(), bytes) or json.loads(msg)["type"] != "audio.done":
            if isinstance(msg, bytes):
                frames.append(msg)
            else:
                assert json.loads(msg)["type"] == "audio.start", msg
    assert b"".join(frames) == anna
    said = []
    for v in ("anna", {"id": voice.id}):
        async with connect(server, audio={"input": {"turn_detection": None}, "output": {"voice": v}}) as conn:
            events = await text_turn(conn, "Hi.")
        assert events[-1].response.status == "completed"
        said.append(audio_of(events))
    assert said[0] and said[0] == said[1]


def test_voices_are_listed_fetched_deleted_and_scoped_by_key(base: Base) -> None:
    server = base.server
    voice = make_clone(server, name="Scoped")
    assert voice.id in listed(server)
    assert client(server).get(f"/audio/voices/{voice.id}", cast_to=Voice) == voice
    # another key neither sees, fetches, speaks nor deletes it
    assert voice.id not in listed(server, OTHER_KEY)
    with pytest.raises(openai.NotFoundError):
        client(server, OTHER_KEY).get(f"/audio/voices/{voice.id}", cast_to=Voice)
    with pytest.raises(openai.BadRequestError, match="Unknown voice"):
        speak(server, {"id": voice.id}, OTHER_KEY)
    with pytest.raises(openai.NotFoundError):
        client(server, OTHER_KEY).audio.voices.delete(voice.id)
    # nor may it clone with this key's consent
    consent = client(server).audio.voice_consents.list().data[-1]
    with pytest.raises(openai.BadRequestError, match="consent"):
        client(server, OTHER_KEY).audio.voices.create(audio_sample=CLONE_WAV.open("rb"), consent=consent.id, name="x")
    deleted = client(server).audio.voices.delete(voice.id)
    assert isinstance(deleted, VoiceDeleted) and deleted.deleted and deleted.id == voice.id
    assert voice.id not in listed(server)
    with pytest.raises(openai.BadRequestError, match="Unknown voice"):
        speak(server, {"id": voice.id})
    with pytest.raises(openai.NotFoundError):
        client(server).audio.voices.delete(voice.id)


def test_bad_requests_are_refused(base: Base) -> None:
    c = client(base.server)
    consent = c.audio.voice_consents.create(recording=CLONE_WAV.open("rb"), name="n", language="en-US")
    with pytest.raises(openai.BadRequestError, match="cannot design voices") as e:
        c.audio.voices.create(name="d", prompt=WARM, type="prompt")
    assert e.value.body["code"] == "unsupported_voice_type"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="consent"):
        c.audio.voices.create(audio_sample=CLONE_WAV.open("rb"), consent="cons_" + "0" * 24, name="x")
    with pytest.raises(openai.BadRequestError, match="not an audio file"):
        c.audio.voices.create(audio_sample=("a.wav", b"RIFF not really"), consent=consent.id, name="x")
    with pytest.raises(openai.BadRequestError, match="s of audio"):
        c.audio.voices.create(audio_sample=("a.wav", _silence_wav(0.1)), consent=consent.id, name="x")
    with pytest.raises(openai.BadRequestError, match="language"):
        c.audio.voice_consents.create(recording=CLONE_WAV.open("rb"), name="n", language="not a tag!")
    as_json = httpx.post(base.server.http + "/v1/audio/voices", json={"name": "d", "prompt": WARM, "type": "prompt"},
                         headers={"Authorization": "Bearer test-key"})  # fmt: skip
    assert as_json.status_code == 400 and as_json.json()["error"]["param"] == "type"
    with pytest.raises(openai.AuthenticationError):
        client(base.server, "wrong-key").audio.voices.delete("voice_" + "0" * 24)


def test_voices_and_consents_survive_a_restart(base: Base) -> None:
    voice = make_clone(base.server, name="Kept")
    before = speak(base.server, {"id": voice.id})
    consents = client(base.server).audio.voice_consents.list().data
    files = list((base.voices_dir / "voices").iterdir()) + list((base.voices_dir / "consents").iterdir())
    assert files and all(stat.S_IMODE(os.stat(f).st_mode) == 0o600 for f in files)
    base.restart()
    assert voice.id in listed(base.server)
    assert client(base.server).audio.voice_consents.list().data == consents
    assert speak(base.server, {"id": voice.id}) == before == speak(base.server, "anna")


def _silence_wav(seconds: float) -> bytes:
    import io

    import numpy as np
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, np.full(int(24000 * seconds), 0.1, dtype=np.float32), 24000, format="WAV")
    return buf.getvalue()
