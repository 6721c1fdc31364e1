"""``/v1/audio/voices`` and ``voice_consents`` in process, over the tone TTS (which makes no custom voices):
the per-key bounds, the refusal of a kind the model cannot make, malformed bodies; a speech-to-speech
model's voices listed by either of its names, and the check of stored voice prompts at start."""

from __future__ import annotations

import io
from pathlib import Path

import anyio
import numpy as np
import pytest
import soundfile
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from realtime_gw.config import GatewayConfig
from realtime_gw.models.contract import BackendInfo
from realtime_gw.protocols.voices import VoiceObject
from realtime_gw.records.s2s import S2sSpec
from realtime_gw.server import voices
from realtime_gw.server.voice_library import StoredVoice, VoiceLibrary, owner_of
from tests.server import fakes

AUTH = {"Authorization": "Bearer k"}


def _client(max_per_key: int = 2) -> TestClient:
    gw = fakes.gateway(keys=["k"])
    gw.voices = VoiceLibrary(max_per_key=max_per_key)
    app = Starlette(routes=[
        Route("/v1/audio/voices", voices.voices_endpoint, methods=["GET", "POST"]),
        Route("/v1/audio/voice_consents", voices.consents_endpoint, methods=["GET", "POST"]),
        Route("/v1/audio/voice_consents/{consent_id}", voices.consent_endpoint, methods=["GET", "POST", "DELETE"]),
    ])  # fmt: skip
    app.state.gateway = gw
    return TestClient(app)


def _wav() -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, np.full(24000, 0.1, np.float32), 24000, format="WAV")
    return buf.getvalue()


def _consent(c: TestClient) -> object:
    return c.post("/v1/audio/voice_consents", headers=AUTH, files={"recording": ("c.wav", _wav())},
                  data={"name": "c", "language": "en-US"})  # fmt: skip


def test_consents_are_bounded_per_key_and_renamed() -> None:
    c = _client(max_per_key=2)
    first = _consent(c).json()  # type: ignore[attr-defined]
    assert _consent(c).status_code == 200  # type: ignore[attr-defined]
    over = _consent(c)
    assert over.status_code == 400 and over.json()["error"]["code"] == "consent_limit_reached"  # type: ignore[attr-defined]
    renamed = c.post(f"/v1/audio/voice_consents/{first['id']}", headers=AUTH, json={"name": "new"})
    assert renamed.json()["name"] == "new"
    assert c.delete(f"/v1/audio/voice_consents/{first['id']}", headers=AUTH).json()["deleted"] is True
    assert c.get(f"/v1/audio/voice_consents/{first['id']}", headers=AUTH).status_code == 404


def test_a_model_without_custom_voices_refuses_both_kinds() -> None:
    c = _client()
    consent = _consent(c).json()  # type: ignore[attr-defined]
    sample = c.post("/v1/audio/voices", headers=AUTH, files={"audio_sample": ("s.wav", _wav())},
                    data={"name": "v", "consent": consent["id"]})  # fmt: skip
    assert sample.status_code == 400 and "cannot clone voices" in sample.json()["error"]["message"]
    prompt = c.post("/v1/audio/voices", headers=AUTH, data={"name": "v", "prompt": "warm", "type": "prompt"})
    assert prompt.status_code == 400 and prompt.json()["error"]["code"] == "unsupported_voice_type"


def test_a_speech_to_speech_model_this_gateway_does_not_serve_is_refused() -> None:
    """``model`` names the model a voice is for: a speech-to-speech one must be served (and take a
    voice: ``gateway-echo`` takes none); another name (OpenAI's ``auto``) is the TTS stage's."""
    c = _client()
    consent = _consent(c).json()  # type: ignore[attr-defined]
    for model, said in (("personaplex", "does not serve"), ("gateway-echo", "takes no voice prompt"), ("auto", "cannot clone voices")):
        r = c.post("/v1/audio/voices", headers=AUTH, files={"audio_sample": ("s.wav", _wav())},
                   data={"name": "v", "consent": consent["id"], "model": model})  # fmt: skip
        assert r.status_code == 400 and said in r.json()["error"]["message"], r.json()
        assert r.json()["error"]["param"] == ("type" if model == "auto" else "model")


def test_bad_bodies() -> None:
    c = _client()
    assert c.get("/v1/audio/voices", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert c.get("/v1/audio/voices?limit=0", headers=AUTH).status_code == 400
    bad = c.post("/v1/audio/voices", headers={**AUTH, "content-type": "application/json"}, content=b"[1]")
    assert bad.status_code == 400
    huge = c.post("/v1/audio/voice_consents", headers=AUTH, files={"recording": ("c.wav", b"0" * (11 << 20))},
                  data={"name": "c", "language": "en"})  # fmt: skip
    assert huge.status_code == 413
    missing = c.post("/v1/audio/voice_consents", headers=AUTH, data={"name": "c", "language": "en"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "recording"


class _DescribedStage:
    """A speech-to-speech stage as ``binding`` reads it (its description only): served as ``personaplex``
    under another model name."""

    def describe(self) -> BackendInfo:
        caps = ("audio_in", "audio_out", "text_out", "voice_prompt", "persona")
        return BackendInfo(name="s2s-personaplex", s2s=S2sSpec(model="personaplex-7b-v1", capabilities=caps))


def test_a_models_voices_are_listed_by_the_name_it_is_served_as_too() -> None:
    c = _client()
    gw = c.app.state.gateway  # type: ignore[attr-defined]
    gw.config = GatewayConfig(tts="tone", policy="none", s2s="personaplex")
    gw.workers.s2s = _DescribedStage()
    made = VoiceObject(id="voice_" + "6" * 24, created_at=1, name="p", type="audio_sample", model="personaplex-7b-v1")
    gw.voices.voices[made.id] = StoredVoice(made, owner_of("k"))
    for name in ("personaplex", "personaplex-7b-v1"):
        listed = c.get("/v1/audio/voices", headers=AUTH, params={"model": name}).json()["data"]
        assert [v["id"] for v in listed] == [made.id], name
    assert c.get("/v1/audio/voices", headers=AUTH, params={"model": ""}).json()["data"] == []


def test_a_stored_voice_prompt_that_does_not_fit_the_stage_is_found_at_start() -> None:
    spec = S2sSpec(model="personaplex", voice_card=64, voice_codebooks=2)
    obj = VoiceObject(id="voice_" + "7" * 24, created_at=1, name="p", type="audio_sample", model="personaplex")

    def fault(codes: tuple[tuple[int, ...], ...], card: int = 64) -> str | None:
        return voices.prompt_fault(StoredVoice(obj, "o", codes=codes, card=card), spec)

    assert fault(((0, 63),) * 3) is None
    assert "made by another codec (card 2048" in (fault(((0, 63),) * 3, 2048) or "")
    for bad in (((0, 64),), ((-1, 0),), ((0, 1, 2),), ((0, 1), ()), ()):
        assert "stored codes do not fit this model's codec (2 codebooks of card 64" in (fault(bad) or ""), bad


def test_a_consent_deleted_while_its_rename_was_read_stays_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rename reads its form after the lookup: a DELETE landing meanwhile is not undone (before, the
    rename wrote the consent back, without its recording)."""
    c = _client()
    gw = c.app.state.gateway  # type: ignore[attr-defined]
    consent = _consent(c).json()  # type: ignore[attr-defined]
    read_form = voices._form

    async def form_after_a_delete(request: object) -> object:
        await gw.voices.drop_consent(consent["id"])
        return await read_form(request)  # type: ignore[arg-type]

    monkeypatch.setattr(voices, "_form", form_after_a_delete)
    renamed = c.post(f"/v1/audio/voice_consents/{consent['id']}", headers=AUTH, json={"name": "new"})
    assert renamed.status_code == 404
    assert gw.voices.consent(owner_of("k"), consent["id"]) is None


def test_a_consent_is_written_and_removed_with_its_recording(tmp_path: Path) -> None:
    lib = VoiceLibrary.open(str(tmp_path), 5)
    c = _client()
    gw = c.app.state.gateway  # type: ignore[attr-defined]
    gw.voices = lib
    consent = _consent(c).json()  # type: ignore[attr-defined]
    files = sorted(p.name for p in (tmp_path / "consents").iterdir())
    assert files == [f"{consent['id']}.audio", f"{consent['id']}.json"]
    anyio.run(lib.drop_consent, consent["id"])
    assert list((tmp_path / "consents").iterdir()) == []
