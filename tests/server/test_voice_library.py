"""The voice library's files: owners kept as digests, 0600 files, read back as written, removals; its
dicts change on the event loop only (the files in a thread)."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
from pathlib import Path

from realtime_gw.protocols.voices import ConsentObject, VoiceObject
from realtime_gw.records.s2s import VoiceCodes
from realtime_gw.server.voice_library import StoredConsent, StoredVoice, VoiceLibrary, owner_of


def test_round_trip_and_scoping(tmp_path: Path) -> None:
    lib = VoiceLibrary.open(str(tmp_path / "v"), 10)
    a, b = owner_of("key-a"), owner_of("key-b")
    assert a != b and "key-a" not in a
    consent = ConsentObject(id="cons_" + "1" * 24, created_at=5, language="en", name="c")
    asyncio.run(lib.put_consent(StoredConsent(consent, a), b"RIFF..."))
    voice = VoiceObject(id="voice_" + "2" * 24, created_at=6, name="v", type="audio_sample")
    asyncio.run(lib.put_voice(StoredVoice(voice, a, consent.id, (0.25, -1.5), usable=True)))
    assert lib.usable_ids(a) == {voice.id} and lib.usable_ids(b) == frozenset()
    assert lib.voice(b, voice.id) is None and lib.consent(b, consent.id) is None
    files = list((tmp_path / "v").rglob("*"))
    assert all(stat.S_IMODE(os.stat(f).st_mode) == (0o700 if f.is_dir() else 0o600) for f in files)
    assert not any(b"key-a" in f.read_bytes() for f in files if f.is_file())
    again = VoiceLibrary.open(str(tmp_path / "v"), 10)
    got = again.voice(a, voice.id)
    assert got is not None and got.voice == voice and got.vector == (0.25, -1.5) and got.consent == consent.id
    assert not got.usable  # until the TTS stage registers it again
    assert again.consents_of(a)[0].consent == consent
    asyncio.run(again.drop_voice(voice.id))
    asyncio.run(again.drop_consent(consent.id))
    assert not list((tmp_path / "v").rglob("*.json")) and not list((tmp_path / "v").rglob("*.audio"))


def test_unreadable_files_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "voices").mkdir()
    (tmp_path / "voices" / "voice_x.json").write_text("{not json")
    assert VoiceLibrary.open(str(tmp_path), 10).voices == {}


def test_a_speech_to_speech_voice_keeps_its_codes_and_is_that_model_s_only(tmp_path: Path) -> None:
    lib = VoiceLibrary.open(str(tmp_path), 10)
    a = owner_of("key-a")
    tts = VoiceObject(id="voice_" + "3" * 24, created_at=7, name="t", type="audio_sample")
    s2s = VoiceObject(id="voice_" + "4" * 24, created_at=8, name="p", type="audio_sample", model="personaplex")
    asyncio.run(lib.put_voice(StoredVoice(tts, a, None, (0.5,), usable=True)))
    asyncio.run(lib.put_voice(StoredVoice(s2s, a, None, (), ((1, 2), (3, 4)), 2048, usable=True)))
    assert lib.usable_ids(a) == {tts.id} and lib.usable_ids(a, "personaplex") == {s2s.id}
    got = VoiceLibrary.open(str(tmp_path), 10).voice(a, s2s.id)
    assert got is not None and got.voice == s2s and got.codes == ((1, 2), (3, 4)) and got.card == 2048
    reopened = VoiceLibrary.open(str(tmp_path), 10)  # what an opening of the model carries, read back
    assert reopened.prompt_codes(a, "personaplex") == {s2s.id: VoiceCodes(((1, 2), (3, 4)), 2048)}
    assert reopened.prompt_codes(owner_of("key-b"), "personaplex") == {} and reopened.prompt_codes(a, "moshi") == {}
    assert stat.S_IMODE(os.stat(tmp_path / "voices" / f"{s2s.id}.json").st_mode) == 0o600
    reopened.voices[s2s.id].fault = "its stored codes do not fit"  # as ``restore_voices`` finds at start
    assert reopened.prompt_codes(a, "personaplex") == {s2s.id: "its stored codes do not fit"}


def test_the_dicts_change_on_the_loop_never_from_the_file_thread(tmp_path: Path) -> None:
    """Sessions and handlers read the library on the event loop: a voice is kept once its file is
    written, and gone before its file is unlinked, both on the loop (the file I/O in a worker thread)."""
    lib = VoiceLibrary.open(str(tmp_path), 10)
    v = StoredVoice(VoiceObject(id="voice_" + "5" * 24, created_at=9, name="v", type="audio_sample"), owner_of("k"))
    seen: list[tuple[str, bool]] = []
    write, unlink = lib._write, lib._unlink

    def watched(op: str, fn: object) -> object:
        def run(name: str, *data: bytes) -> None:
            assert threading.current_thread() is not threading.main_thread()
            seen.append((op, v.voice.id in lib.voices))
            fn(name, *data)  # type: ignore[operator]

        return run

    lib._write, lib._unlink = watched("write", write), watched("unlink", unlink)  # type: ignore[method-assign]

    async def scenario() -> None:
        await lib.put_voice(v)
        assert v.voice.id in lib.voices and lib.creations(owner_of("k")) == 1
        lib.making[owner_of("k")] += 1  # one being made counts too
        assert lib.creations(owner_of("k")) == 2
        await lib.drop_voice(v.voice.id)

    asyncio.run(scenario())
    assert seen == [("write", False), ("unlink", False)]
