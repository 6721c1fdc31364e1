"""The custom voices and consent recordings of ``/v1/audio/voices`` and ``/v1/audio/voice_consents``.

Each belongs to the API key that made it (kept as a SHA-256 digest of the key, never the key) and is seen
by that key only. With ``voices_dir`` set they persist there, one JSON file per voice (``voices/ID.json``:
the voice object, its owner, its consent, and what its stage computed from the sample: the TTS stage's
x-vector, so a restart registers it again without the recording, or a speech-to-speech stage's voice prompt
codes (``VoiceObject.model``), which a conversation's opening carries to that stage) and per consent (``consents/ID.json`` and the
recording as uploaded, ``consents/ID.audio``), files 0600 in directories 0700, each written to a temporary
name and renamed into place. TTS voice samples are not kept; a speech-to-speech voice's codes are the
sample compressed by that model's codec (they decode back to the voice). Without ``voices_dir`` they live in
memory for the process's life (a voice sample is biometric data: the operator opts in to keeping it on disk).

File I/O is small (a JSON file; a consent recording up to 10 MiB) and runs in a thread; the library's
dicts change on the event loop only (after the file is written; a removal before it is unlinked), where
the handlers and sessions read them, so a read never sees one change half made.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from realtime_gw.models.private_files import write_private
from realtime_gw.protocols.voices import CONSENT_ID, VOICE_ID, ConsentObject, VoiceObject
from realtime_gw.records.s2s import VoiceCodes

log = logging.getLogger(__name__)


def owner_of(key: str) -> str:
    """The stored owner of what ``key`` makes: a digest, so the files hold no key."""
    return hashlib.sha256(b"realtime-gw voice owner\0" + key.encode()).hexdigest()


@dataclass
class StoredVoice:
    voice: VoiceObject
    owner: str
    consent: str | None = None
    vector: tuple[float, ...] = ()
    """``audio_sample``: the x-vector the TTS stage computed (registered again after a restart)."""
    codes: tuple[tuple[int, ...], ...] = ()
    card: int = 0
    """A speech-to-speech model's voice (``voice.model``): the codec codes its stage computed, and the
    codec's card (its stage keeps nothing: an opening that names the voice carries them)."""
    usable: bool = False
    """Registered with this process's TTS stage, or (``voice.model``) of the served stage's codec card (not
    stored: checked again at start)."""
    fault: str | None = None
    """``voice.model``: why its stored codes cannot open on the served stage (another codec's card, codes
    of another width or out of its range; checked at start, not stored): listed, and refused saying so."""


@dataclass
class StoredConsent:
    consent: ConsentObject
    owner: str


@dataclass
class VoiceLibrary:
    root: Path | None = None
    max_per_key: int = 100
    voices: dict[str, StoredVoice] = field(default_factory=dict)
    consents: dict[str, StoredConsent] = field(default_factory=dict)
    making: Counter[str] = field(default_factory=Counter)
    """Voice creations under way, per owner: they count against ``max_per_key`` until answered."""
    making_prompt: bool = False
    """A speech-to-speech stage is making a voice (it holds a conversation slot until answered): one at a time."""

    @classmethod
    def open(cls, root: str | None, max_per_key: int) -> VoiceLibrary:
        """The library kept under ``root`` (created 0700 if missing), read back; in memory when None."""
        lib = cls(Path(root) if root else None, max_per_key)
        if lib.root is None:
            return lib
        lib.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for sub in ("voices", "consents"):
            (lib.root / sub).mkdir(mode=0o700, exist_ok=True)
        for path in sorted((lib.root / "voices").glob("*.json")):
            try:
                raw = json.loads(path.read_text())
                v = StoredVoice(msgspec.convert(raw["voice"], VoiceObject), raw["owner"], raw.get("consent"),
                                tuple(float(x) for x in raw.get("vector", ())),
                                tuple(tuple(int(c) for c in row) for row in raw.get("codes", ())),
                                int(raw.get("card", 0)))  # fmt: skip
            except (OSError, ValueError, KeyError, TypeError, msgspec.ValidationError) as e:
                log.warning("voices: skipping unreadable %s: %s", path.name, e)
                continue
            lib.voices[v.voice.id] = v
        for path in sorted((lib.root / "consents").glob("*.json")):
            try:
                raw = json.loads(path.read_text())
                c = StoredConsent(msgspec.convert(raw["consent"], ConsentObject), raw["owner"])
            except (OSError, ValueError, KeyError, TypeError, msgspec.ValidationError) as e:
                log.warning("voices: skipping unreadable consent %s: %s", path.name, e)
                continue
            lib.consents[c.consent.id] = c
        log.info("voices: %d voices, %d consents in %s", len(lib.voices), len(lib.consents), lib.root)
        return lib

    # -- reading (the owner's only) ----------------------------------------------------------------------
    def voices_of(self, owner: str) -> list[StoredVoice]:
        return sorted((v for v in self.voices.values() if v.owner == owner),
                      key=lambda v: (v.voice.created_at, v.voice.id))  # fmt: skip

    def voice(self, owner: str, voice_id: str) -> StoredVoice | None:
        v = self.voices.get(voice_id)
        return v if v is not None and v.owner == owner else None

    def usable_ids(self, owner: str, model: str | None = None) -> frozenset[str]:
        """The owner's voices the TTS stage speaks (``model`` None), or the speech-to-speech ``model``'s
        stage (what ``voice`` may name besides the built-in ones)."""
        return frozenset(v.voice.id for v in self.voices.values()
                         if v.owner == owner and v.usable and v.voice.model == model)  # fmt: skip

    def prompt_codes(self, owner: str, model: str) -> dict[str, VoiceCodes | str]:
        """The owner's voices of the speech-to-speech ``model`` now: each id's codes (an opening carries
        them), or why they cannot open on its stage (``StoredVoice.fault``: a session naming it is refused
        saying so)."""
        return {v.voice.id: v.fault or VoiceCodes(v.codes, v.card) for v in self.voices.values()
                if v.owner == owner and v.voice.model == model}  # fmt: skip

    def creations(self, owner: str) -> int:
        """The owner's voices, with those being made."""
        return len(self.voices_of(owner)) + self.making[owner]

    def consents_of(self, owner: str) -> list[StoredConsent]:
        return sorted((c for c in self.consents.values() if c.owner == owner),
                      key=lambda c: (c.consent.created_at, c.consent.id))  # fmt: skip

    def consent(self, owner: str, consent_id: str) -> StoredConsent | None:
        c = self.consents.get(consent_id)
        return c if c is not None and c.owner == owner else None

    # -- writing (on the event loop: the files in a thread) -----------------------------------------------
    @staticmethod
    def new_voice_id() -> str:
        return "voice_" + secrets.token_hex(12)

    @staticmethod
    def new_consent_id() -> str:
        return "cons_" + secrets.token_hex(12)

    async def put_voice(self, v: StoredVoice) -> None:
        assert VOICE_ID.fullmatch(v.voice.id)
        await asyncio.to_thread(self._write, f"voices/{v.voice.id}.json", json.dumps({
            "voice": msgspec.to_builtins(v.voice), "owner": v.owner, "consent": v.consent, "vector": list(v.vector),
            "codes": [list(row) for row in v.codes], "card": v.card,
        }).encode())  # fmt: skip
        self.voices[v.voice.id] = v

    async def drop_voice(self, voice_id: str) -> None:
        self.voices.pop(voice_id, None)  # named by no session from now on
        await asyncio.to_thread(self._unlink, f"voices/{voice_id}.json")

    async def put_consent(self, c: StoredConsent, recording: bytes | None = None) -> None:
        assert CONSENT_ID.fullmatch(c.consent.id)
        files = [(f"consents/{c.consent.id}.audio", recording)] if recording is not None else []
        files.append((f"consents/{c.consent.id}.json", json.dumps(
            {"consent": msgspec.to_builtins(c.consent), "owner": c.owner}).encode()))  # fmt: skip
        await asyncio.to_thread(lambda: [self._write(name, data) for name, data in files])  # one go: never half
        self.consents[c.consent.id] = c

    async def drop_consent(self, consent_id: str) -> None:
        self.consents.pop(consent_id, None)
        # in one go, the recording first: a recording without its .json would never be loaded, nor deletable
        await asyncio.to_thread(lambda: [self._unlink(f"consents/{consent_id}.{ext}") for ext in ("audio", "json")])

    def _write(self, name: str, data: bytes) -> None:
        if self.root is None:
            return
        write_private(self.root / name, data)

    def _unlink(self, name: str) -> None:
        if self.root is not None:
            (self.root / name).unlink(missing_ok=True)


def stored_voice_record(v: StoredVoice) -> dict[str, Any]:
    """What a TTS stage's registration of ``v`` needs beyond its id and kind (see
    ``records.voice.VoiceRegistration``)."""
    return {"description": v.voice.prompt or ""} if v.voice.type == "prompt" else {"vector": v.vector}
