"""The custom voice objects, list pages and upload checks (``protocols.voices``) against the SDK's types."""

from __future__ import annotations

import io

import msgspec
import numpy as np
import pytest
import soundfile
from openai.types.audio import Voice, VoiceConsent

from realtime_gw.protocols import loudness
from realtime_gw.protocols import voices as pv


def _wav(seconds: float, rate: int = 16000, channels: int = 1, fmt: str = "WAV") -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    x = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, np.stack([x] * channels, axis=1), rate, format=fmt)
    return buf.getvalue()


def test_objects_validate_as_the_sdk_types() -> None:
    v = pv.VoiceObject(id="voice_" + "a" * 24, created_at=1, name="n", type="prompt", prompt="warm")
    assert Voice.model_validate(msgspec.to_builtins(v)).prompt == "warm"
    c = pv.ConsentObject(id="cons_" + "b" * 24, created_at=1, language="en-US", name="n")
    assert VoiceConsent.model_validate(msgspec.to_builtins(c)).object == "audio.voice_consent"


def test_pages_follow_the_cursor() -> None:
    objs = [pv.ConsentObject(id=f"cons_{i:024x}", created_at=i, language="en", name="n") for i in range(5)]
    first = pv.page(objs, None, 2)
    assert [d["id"] for d in first["data"]] == [objs[0].id, objs[1].id] and first["has_more"]
    last = pv.page(objs, first["last_id"], 10)
    assert last["first_id"] == objs[2].id and last["last_id"] == objs[4].id and not last["has_more"]
    with pytest.raises(pv.VoiceInputError):
        pv.page(objs, None, 0)
    with pytest.raises(pv.VoiceInputError):
        pv.page(objs, "cons_nope", 5)


def test_recordings_decode_to_24k_mono_and_are_bounded() -> None:
    audio = pv.decode_recording(_wav(1.0, 16000, channels=2, fmt="FLAC"))
    assert audio.dtype == np.float32 and audio.shape == (24000,)
    assert len(pv.check_sample(audio)) == 24000 * 4
    with pytest.raises(pv.VoiceInputError, match="not an audio file"):
        pv.decode_recording(b"RIFF and then nothing")
    with pytest.raises(pv.VoiceInputError, match="s of audio"):
        pv.check_sample(pv.decode_recording(_wav(0.1)))
    with pytest.raises(pv.VoiceInputError, match="s of audio"):
        pv.check_sample(np.full(24000 * 61, 0.1, np.float32))
    with pytest.raises(pv.VoiceInputError, match="silent"):
        pv.check_sample(np.zeros(24000, np.float32))
    # judged by its header before decoding: a small compressed file cannot expand without bound
    with pytest.raises(pv.VoiceInputError, match="longer than 120 s"):
        pv.decode_recording(_wav(121.0, 8000, fmt="FLAC"))
    with pytest.raises(pv.VoiceInputError, match="longer than 120 s"):
        pv.decode_recording(_wav(70.0, 96000, channels=2, fmt="FLAC"))  # within 120 s, over the sample bound


def test_a_voice_prompt_sample_is_brought_to_minus_24_lufs_or_refused_as_inaudible() -> None:
    """What a speech-to-speech stage encodes (``prompt_sample``, in the gateway's thread); a sample with
    signal but nothing audible (a 1 Hz sine at -43 dBFS RMS: the K-weighting's high pass removes it) is
    the client's error, not the stage's."""
    t = np.arange(24000 * 4) / 24000
    voice = (0.05 * np.sin(2 * np.pi * 170 * t)).astype(np.float32)
    prompt = np.frombuffer(pv.prompt_sample(voice), "<f4")
    assert prompt.shape == voice.shape and loudness.integrated_loudness(prompt, 24000) == pytest.approx(-24.0, abs=0.1)
    rumble = (10 ** (-43 / 20) * np.sqrt(2) * np.sin(2 * np.pi * 1.0 * t)).astype(np.float32)
    assert 20 * np.log10(np.sqrt(np.mean(rumble.astype(np.float64) ** 2))) == pytest.approx(-43, abs=0.1)
    pv.check_sample(rumble)  # passes the generic checks
    with pytest.raises(pv.VoiceInputError, match="audio_sample: the voice sample is silent or too quiet") as e:
        pv.prompt_sample(rumble)
    assert e.value.param == "audio_sample"


def test_fields_are_checked() -> None:
    assert pv.check_language("en-US") == "en-US" and pv.check_language("zh-Hant-TW")
    for bad in (None, "", "english please", "e"):
        with pytest.raises(pv.VoiceInputError):
            pv.check_language(bad)
    with pytest.raises(pv.VoiceInputError):
        pv.check_prompt("   ")
    with pytest.raises(pv.VoiceInputError):
        pv.check_name("x" * 300)
