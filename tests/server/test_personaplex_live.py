"""A live gateway with ``--s2s personaplex`` (tiny, random init) and a voice directory: ``/v1/models``
lists the model, its capabilities and its voices, and a ``/v1/realtime`` session of model
``personaplex`` through the official ``openai`` SDK opens on the stage (its default voice prefilled)
and hears the model speak, 80 ms a delta. A session's instructions are the model's persona: under one
seed, the same persona gives the same first reply and another persona another (a tiny random model
says something else as soon as its prompt differs); the SDK's usual flow (connect, then
``session.update`` with instructions and a voice) re-opens the stream with them, and an unknown voice
or a persona past the prompt budget is refused, the session going on. A voice made from a sample through
``/v1/audio/voices`` (``model: personaplex``) is that model's voice prompt, for its API key only; a
WebRTC call carries its persona in the call's ``session`` part to the model as the WebSocket does."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile
from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection
from openai.types.audio import Voice

from realtime_gw.protocols.voices import VoiceObject
from realtime_gw.server.voice_library import StoredVoice, VoiceLibrary, owner_of
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.server.realtime_sdk_client import recv
from tests.server.sdk_events import validate
from tests.server.webrtc.caller import Caller, call

STEP_BYTES = 1920 * 2
OTHER_KEY = "other-key"
KEPT_VOICE = "voice_" + "7" * 24
FOREIGN_VOICE = "voice_" + "8" * 24
BAD_VOICE = "voice_" + "9" * 24
MAX_VOICES = 5
"""``--max-voices-per-key``: the other key starts one voice short of it (``library``)."""


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``--voices-dir`` holding PersonaPlex voices a previous run made for ``test-key``: one of the tiny
    codec (card 64, 8 codebooks), one of another codec (the published Mimi's card 2048), and one whose
    codes are out of the tiny codec's range (a file changed by hand); and for the other key, TTS voices
    one short of its bound."""
    root = tmp_path_factory.mktemp("library")
    lib = VoiceLibrary.open(str(root), 10)
    kept = VoiceObject(id=KEPT_VOICE, created_at=1, name="Kept", type="audio_sample", model="personaplex")
    asyncio.run(lib.put_voice(StoredVoice(kept, owner_of("test-key"), None, (), ((5, 9, 13, 17, 21, 25, 29, 33),) * 6, 64)))
    foreign = VoiceObject(id=FOREIGN_VOICE, created_at=2, name="Foreign", type="audio_sample", model="personaplex")
    asyncio.run(lib.put_voice(StoredVoice(foreign, owner_of("test-key"), None, (), ((5, 9, 13, 17, 21, 25, 29, 33),) * 6, 2048)))
    bad = VoiceObject(id=BAD_VOICE, created_at=3, name="Bad", type="audio_sample", model="personaplex")
    asyncio.run(lib.put_voice(StoredVoice(bad, owner_of("test-key"), None, (), ((5, 9, 13, 17, 21, 25, 29, 64),) * 6, 64)))
    for i in range(MAX_VOICES - 1):
        tts = VoiceObject(id=f"voice_{i:024d}", created_at=4 + i, name="t", type="audio_sample")
        asyncio.run(lib.put_voice(StoredVoice(tts, owner_of(OTHER_KEY), None, (0.5,))))
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, library: Path) -> Iterator[LiveServer]:
    voices = tmp_path_factory.mktemp("voices")
    t = np.arange(12000) / 24000
    soundfile.write(str(voices / "ada.wav"), (0.1 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 24000)
    server = start_server(
        "--policy", "none", "--tts", "tone", "--api-key", "test-key", "--s2s", "personaplex",
        "--s2s-config", "tiny", "--s2s-slots", "2", "--s2s-voices-dir", str(voices), "--s2s-voice", "ada",
        "--api-keys", OTHER_KEY, "--voices-dir", str(library), "--max-voices-per-key", str(MAX_VOICES),
        "--no-cpu-backend-spare", name="personaplex",
    )  # fmt: skip
    yield server
    stop_server(server)


@pytest.fixture(autouse=True)
async def stage_free(server: LiveServer) -> None:
    """Each test starts on an empty stage (two slots: a closed session frees its slot a moment later)."""
    for _ in range(200):
        if server.metric("realtime_gw_worker_active_requests", 'worker="s2s-personaplex"') == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the sessions of the test before kept their slots on the stage")


async def test_the_model_and_its_voices_are_listed_and_a_session_hears_it_speak(server: LiveServer) -> None:
    models = httpx.get(server.http + "/v1/models", headers={"Authorization": "Bearer test-key"}).json()
    [model] = [m for m in models["data"] if m["id"] == "personaplex"]
    assert model["capabilities"] == ["audio_in", "audio_out", "text_out", "voice_prompt", "persona"]
    assert model["voices"] == ["ada"] and model["default_voice"] == "ada" and model["max_prompt_frames"] == 97
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key")
    async with client.realtime.connect(model="personaplex", extra_query={"seed": "3"}) as conn:
        created = await recv(conn)
        assert created.type == "session.created" and created.session.model == "personaplex"
        silence = base64.b64encode(bytes(STEP_BYTES)).decode()

        async def first_audio() -> bytes:
            while True:
                event = await recv(conn)
                assert event.type != "error", event
                if event.type == "response.output_audio.delta":
                    return base64.b64decode(event.delta)

        listen = asyncio.create_task(first_audio())
        for _ in range(150):  # up to 12 s of microphone at real time
            if listen.done():
                break
            await conn.input_audio_buffer.append(audio=silence)
            await asyncio.sleep(0.08)
        assert len(await asyncio.wait_for(listen, 1)) == STEP_BYTES


async def first_reply(conn: AsyncRealtimeConnection, deltas: int = 3) -> bytes:
    """The first ``deltas`` audio deltas of the first reply the model opens (no audio is sent: the
    stage hears silence at every step, so the model's input is the same in every session)."""
    out = b""
    for _ in range(deltas):
        while (event := await recv(conn)).type != "response.output_audio.delta":
            assert event.type != "error", event
        out += base64.b64decode(event.delta)
    return out


async def persona_reply(server: LiveServer, persona: str, voice: str | dict[str, str] = "ada") -> bytes:
    """The first reply of a session whose client secret gives ``persona`` and ``voice`` (the stream opens
    with them)."""
    minter = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key")
    secret = await minter.realtime.client_secrets.create(session={
        "type": "realtime", "model": "personaplex", "instructions": persona, "audio": {"output": {"voice": voice}},  # type: ignore[typeddict-item]
    })  # fmt: skip
    assert secret.session.instructions == persona  # type: ignore[union-attr]
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key=secret.value)
    async with client.realtime.connect(model="personaplex", extra_query={"seed": "5"}) as conn:
        created = await recv(conn)
        assert created.type == "session.created" and created.session.instructions == persona  # type: ignore[union-attr]
        return await asyncio.wait_for(first_reply(conn), 15)


async def test_the_persona_reaches_the_model(server: LiveServer) -> None:
    """By a client secret (the stream opens with it) and by the SDK's usual flow (connect, then
    ``session.update``: the stream re-opens with it, and ``session.updated`` comes once it has)."""
    ada = await persona_reply(server, "You are Ada.")
    bo = await persona_reply(server, "You are Bo, a pirate.")
    assert len(ada) == len(bo) == 3 * STEP_BYTES
    assert bo != ada  # another persona: another prompt prefilled, another reply
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key")
    async with client.realtime.connect(model="personaplex", extra_query={"seed": "5"}) as conn:
        created = await recv(conn)
        assert created.type == "session.created" and created.session.instructions == ""  # type: ignore[union-attr]
        await conn.session.update(session={"type": "realtime", "instructions": "You are Ada.", "audio": {"output": {"voice": "ada"}}})
        while (updated := await recv(conn)).type != "session.updated":  # the first stream may speak meanwhile
            assert updated.type != "error", updated
        assert updated.session.instructions == "You are Ada." and updated.session.audio.output.voice == "ada"  # type: ignore[union-attr]
        assert await asyncio.wait_for(first_reply(conn), 15) == ada  # the same prompt and seed: the same reply


async def test_a_bad_voice_or_persona_is_refused_and_the_session_goes_on(server: LiveServer) -> None:
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key")
    for session, named in (({"audio": {"output": {"voice": "marin"}}}, "ada"), ({"instructions": "Extraordinary " * 10}, "frames")):
        with pytest.raises(openai.BadRequestError, match=named):  # a client secret's config: refused when minted
            await client.realtime.client_secrets.create(session={"type": "realtime", "model": "personaplex", **session})  # type: ignore[arg-type]
    async with client.realtime.connect(model="personaplex") as conn:
        assert (await recv(conn)).type == "session.created"
        await conn.session.update(session={"type": "realtime", "instructions": "You are Bo."})
        while (updated := await recv(conn)).type != "session.updated":
            assert updated.type != "error", updated
        await conn.session.update(session={"type": "realtime", "audio": {"output": {"voice": "marin"}}})
        while (refused := await recv(conn)).type != "error":
            pass
        assert refused.error.param == "session.audio.output.voice" and "ada" in refused.error.message  # type: ignore[union-attr]
        # ten words fit the budget in words, not in this model's tokens (a byte each): the stage refuses it
        await conn.session.update(session={"type": "realtime", "instructions": " ".join(["Extraordinary"] * 10)})
        while (refused := await recv(conn)).type != "error":
            pass
        assert refused.error.param == "session.instructions" and "frames" in refused.error.message  # type: ignore[union-attr]
        while (kept := await recv(conn)).type != "session.updated":
            pass
        assert kept.session.instructions == "You are Bo."  # type: ignore[union-attr]
        assert len(await asyncio.wait_for(first_reply(conn, 1), 15)) == STEP_BYTES  # the model still speaks


async def test_a_reopen_on_a_full_stage_takes_its_own_slot(server: LiveServer) -> None:
    """Both of the stage's two slots held: a session's new persona re-opens in the slot its old
    stream frees, and a third session is still refused at once."""
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key")
    async with client.realtime.connect(model="personaplex") as first, client.realtime.connect(model="personaplex") as second:
        assert (await recv(first)).type == (await recv(second)).type == "session.created"
        await second.session.update(session={"type": "realtime", "instructions": "You are Cy."})
        while (updated := await recv(second)).type != "session.updated":
            assert updated.type != "error", updated.error.message  # type: ignore[union-attr]
        assert updated.session.instructions == "You are Cy."  # type: ignore[union-attr]
        async with client.realtime.connect(model="personaplex") as third:
            refused = await recv(third)
            assert refused.type == "error" and refused.error.code == "server_busy"  # type: ignore[union-attr]
        assert len(await asyncio.wait_for(first_reply(second, 1), 15)) == STEP_BYTES


def _sample_wav(seconds: float = 1.0) -> bytes:
    """A voice sample as a client uploads it: a WAV file at 16 kHz (the gateway resamples it)."""
    t = np.arange(int(16000 * seconds)) / 16000
    buf = io.BytesIO()
    soundfile.write(buf, (0.2 * np.sin(2 * np.pi * (140 + 30 * np.sin(5 * t)) * t)).astype(np.float32), 16000, format="WAV")
    return buf.getvalue()


async def test_a_voice_made_from_a_sample_is_the_models_voice_prompt_for_its_key_only(server: LiveServer, library: Path) -> None:
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key", max_retries=0)
    other = AsyncOpenAI(base_url=server.http + "/v1", api_key=OTHER_KEY, max_retries=0)
    consent = await client.audio.voice_consents.create(recording=("me.wav", _sample_wav()), name="me", language="en-US")
    made = await client.audio.voices.with_raw_response.create(
        audio_sample=("ann.wav", _sample_wav()), consent=consent.id, name="Ann", extra_body={"model": "personaplex"}
    )
    voice = Voice.model_validate(made.http_response.json())  # every field of the SDK's type, and ours
    assert voice.type == "audio_sample" and voice.name == "Ann" and made.http_response.json()["model"] == "personaplex"
    assert (library / "voices" / f"{voice.id}.json").stat().st_mode & 0o777 == 0o600  # its codes, for a restart
    for key, want in ((client, [KEPT_VOICE, FOREIGN_VOICE, BAD_VOICE, voice.id]), (other, [])):
        page = await key.get("/audio/voices", cast_to=object, options={"params": {"model": "personaplex"}})
        assert [v["id"] for v in page["data"]] == want  # type: ignore[index]
    assert (await client.get("/audio/voices", cast_to=object, options={"params": {"model": ""}}))["data"] == []  # type: ignore[index]
    # the voice is the model's: another voice prompt, another reply under the same seed and persona
    assert await persona_reply(server, "You are Ann.", {"id": voice.id}) != await persona_reply(server, "You are Ann.")
    with pytest.raises(openai.BadRequestError, match="voice"):  # another key cannot name it
        await other.realtime.client_secrets.create(session={"type": "realtime", "model": "personaplex", "audio": {"output": {"voice": {"id": voice.id}}}})  # type: ignore[typeddict-item]
    with pytest.raises(openai.BadRequestError, match="audio samples only"):
        await client.audio.voices.create(name="x", prompt="A warm voice.", type="prompt", model="personaplex")
    t = np.arange(16000 * 4) / 16000  # a 1 Hz sine at -43 dBFS RMS: nothing audible, the client's error
    rumble = io.BytesIO()
    soundfile.write(rumble, (10 ** (-43 / 20) * np.sqrt(2) * np.sin(2 * np.pi * t)).astype(np.float32), 16000, format="WAV")
    with pytest.raises(openai.BadRequestError, match="silent or too quiet") as refused:
        await client.audio.voices.create(audio_sample=("hum.wav", rumble.getvalue()), consent=consent.id, name="Hum", extra_body={"model": "personaplex"})
    assert refused.value.param == "audio_sample"
    with pytest.raises(openai.BadRequestError, match="at most 6.8 s"):  # the tiny model's context
        await client.audio.voices.create(audio_sample=("long.wav", _sample_wav(8)), consent=consent.id, name="Long", extra_body={"model": "personaplex"})
    await deleted_voice_in_use(server, client, voice.id)


async def deleted_voice_in_use(server: LiveServer, client: AsyncOpenAI, voice_id: str) -> None:
    """Deleting a voice: the session talking with it keeps its prompt, but a new persona (a re-open with
    it) is refused as an unknown voice, and a client secret minted with it before opens its session with
    the rest of its config and the default voice, an error saying why."""
    named = {"type": "realtime", "model": "personaplex", "instructions": "You are Ann.", "audio": {"output": {"voice": {"id": voice_id}}}}
    secret = await client.realtime.client_secrets.create(session=named)  # type: ignore[arg-type]
    async with client.realtime.connect(model="personaplex") as conn:
        assert (await recv(conn)).type == "session.created"
        await conn.session.update(session={"type": "realtime", "audio": {"output": {"voice": {"id": voice_id}}}})
        while (updated := await recv(conn)).type != "session.updated":
            assert updated.type != "error", updated
        assert (await client.audio.voices.delete(voice_id)).deleted
        await conn.session.update(session={"type": "realtime", "instructions": "You are Bo."})
        while (refused := await recv(conn)).type != "error":
            assert refused.type != "session.updated", refused
        assert refused.error.param == "session.audio.output.voice" and f"Unknown voice '{voice_id}'" in refused.error.message  # type: ignore[union-attr]
        assert len(await asyncio.wait_for(first_reply(conn, 1), 15)) == STEP_BYTES  # it goes on, with its voice
    with pytest.raises(openai.BadRequestError, match="voice"):
        await client.realtime.client_secrets.create(session=named)  # type: ignore[arg-type]
    async with AsyncOpenAI(base_url=server.http + "/v1", api_key=secret.value).realtime.connect(model="personaplex") as conn:
        created = await recv(conn)
        assert created.type == "session.created" and created.session.instructions == "You are Ann."  # type: ignore[union-attr]
        assert created.session.audio.output.voice == "default"  # type: ignore[union-attr]
        refused = await recv(conn)
        assert refused.type == "error" and f"Unknown voice '{voice_id}'" in refused.error.message  # type: ignore[union-attr]


async def test_the_stage_makes_one_voice_at_a_time_and_a_key_s_voices_being_made_count(server: LiveServer) -> None:
    """A registration holds a conversation slot until answered: while the stage makes one voice, another
    create is a 503 with Retry-After (the SDK retries it); a key's voices being made count against its
    bound, so concurrent creates cannot pass it."""
    other = AsyncOpenAI(base_url=server.http + "/v1", api_key=OTHER_KEY, max_retries=0)
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key", max_retries=0)
    mine = await other.audio.voice_consents.create(recording=("me.wav", _sample_wav()), name="me", language="en-US")
    theirs = await client.audio.voice_consents.create(recording=("me.wav", _sample_wav()), name="me", language="en-US")
    making = asyncio.create_task(other.audio.voices.create(
        audio_sample=("slow.wav", _sample_wav(5)), consent=mine.id, name="Slow", extra_body={"model": "personaplex"}))  # fmt: skip
    for _ in range(500):  # until its registration holds a slot on the stage
        if server.metric("realtime_gw_worker_active_requests", 'worker="s2s-personaplex"') == 1 or making.done():
            break
        await asyncio.sleep(0.01)
    assert not making.done(), "the voice was made before the test could see it being made"
    with pytest.raises(openai.BadRequestError, match="being made") as over:  # its last voice is being made
        await other.audio.voices.create(audio_sample=("a.wav", _sample_wav()), consent=mine.id, name="A", extra_body={"model": "personaplex"})
    assert over.value.code == "voice_limit_reached"
    with pytest.raises(openai.InternalServerError, match="busy making another voice") as busy:
        await client.audio.voices.create(audio_sample=("b.wav", _sample_wav()), consent=theirs.id, name="B", extra_body={"model": "personaplex"})
    assert busy.value.status_code == 503 and busy.value.response.headers["retry-after"] == "2"
    made = await asyncio.wait_for(making, 60)
    assert (await other.audio.voices.delete(made.id)).deleted


TRANSCRIPT_DELTAS = 4


async def call_reply(server: LiveServer, persona: str) -> list[str]:
    """The first text pieces of the model's first reply in a WebRTC call whose ``session`` part gives
    ``persona`` (the microphone is silent: the model hears the same in every call)."""
    caller = Caller(parse=validate)
    try:
        session = {"type": "realtime", "model": "personaplex", "instructions": persona}
        resp = await call(server, caller, multipart=True, session=session, seed=5)
        assert resp.status_code == 201, resp.text
        created = await caller.wait_for(lambda e: e.type == "session.created", 15)
        assert created.session.model == "personaplex" and created.session.instructions == persona
        first = (await caller.wait_for(lambda e: e.type == "response.created", 15)).response.id

        def pieces() -> list[str]:
            return [e.delta for _, e in caller.events
                    if e.type == "response.output_audio_transcript.delta" and e.response_id == first]  # fmt: skip

        await caller.wait_for(lambda e: len(pieces()) >= TRANSCRIPT_DELTAS, 15)
        await caller.wait_for(lambda e: e.type == "output_audio_buffer.started", 15)  # its voice is on the track
        return pieces()[:TRANSCRIPT_DELTAS]
    finally:
        await caller.close()


async def test_a_webrtc_call_carries_its_persona_to_the_model(server: LiveServer) -> None:
    """An aiortc call of model ``personaplex`` with its persona in the call's ``session`` part: the same
    persona and seed say what a WebSocket session says; another persona says something else."""
    ada, bo = await call_reply(server, "You are Ada."), await call_reply(server, "You are Bo, a pirate.")
    assert ada != bo
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key")
    async with client.realtime.connect(model="personaplex", extra_query={"seed": "5"}) as conn:
        assert (await recv(conn)).type == "session.created"
        await conn.session.update(session={"type": "realtime", "instructions": "You are Ada."})
        while (event := await recv(conn)).type != "session.updated":
            assert event.type != "error", event
        pieces: list[str] = []
        while len(pieces) < TRANSCRIPT_DELTAS:
            if (event := await recv(conn)).type == "response.output_audio_transcript.delta":
                pieces.append(event.delta)
    assert pieces == ada


async def test_a_voice_kept_from_a_previous_run_opens_with_its_codes(server: LiveServer) -> None:
    """Nothing is encoded or registered at start: a session of its key opens with it (the opening carries
    its codes; the stage's own check at submit counts them), another key's is refused, and a voice of
    another codec is refused saying so."""
    client = AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key", max_retries=0)
    kept = {"type": "realtime", "model": "personaplex", "audio": {"output": {"voice": {"id": KEPT_VOICE}}}}
    secret = await client.realtime.client_secrets.create(session=kept)  # type: ignore[arg-type]
    async with AsyncOpenAI(base_url=server.http + "/v1", api_key=secret.value).realtime.connect(model="personaplex") as conn:
        created = await recv(conn)
        assert created.type == "session.created" and created.session.audio.output.voice == KEPT_VOICE  # type: ignore[union-attr]
        assert len(await asyncio.wait_for(first_reply(conn, 1), 15)) == STEP_BYTES
    with pytest.raises(openai.BadRequestError, match="voice"):
        await AsyncOpenAI(base_url=server.http + "/v1", api_key=OTHER_KEY, max_retries=0).realtime.client_secrets.create(session=kept)  # type: ignore[arg-type]
    foreign = {"type": "realtime", "model": "personaplex", "audio": {"output": {"voice": {"id": FOREIGN_VOICE}}}}
    with pytest.raises(openai.BadRequestError, match="made by another codec .card 2048.*make the voice again"):
        await client.realtime.client_secrets.create(session=foreign)  # type: ignore[arg-type]
    bad = {"type": "realtime", "model": "personaplex", "audio": {"output": {"voice": {"id": BAD_VOICE}}}}
    with pytest.raises(openai.BadRequestError, match="stored codes do not fit this model's codec"):  # checked at start
        await client.realtime.client_secrets.create(session=bad)  # type: ignore[arg-type]
