"""The ``Gateway``: what every handler shares: the config, the workers, the responder, access control
and live session counts. Built once by ``app.create_app``; handlers reach it as
``ws.app.state.gateway``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from realtime_gw.config import GatewayConfig
from realtime_gw.models.registry import Workers, accepted_voices
from realtime_gw.records.s2s import VoiceCodes
from realtime_gw.server.auth import Access
from realtime_gw.server.responder import Responder
from realtime_gw.server.voice_library import VoiceLibrary, owner_of


@dataclass
class Gateway:
    """What every handler shares: the config, the workers, and live session bookkeeping."""

    config: GatewayConfig
    workers: Workers
    responder: Responder
    access: Access
    sessions: dict[str, int] = field(default_factory=lambda: {"realtime": 0, "live": 0, "openpi": 0, "speech": 0})
    transcriptions: int = 0
    """Files being transcribed (``POST /v1/audio/transcriptions``), bounded by ``transcription_max_concurrent``."""
    voices: VoiceLibrary = field(default_factory=VoiceLibrary)
    """Custom voices and consent recordings, per API key (``/v1/audio/voices``)."""
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the server begins to shut down, before it closes connections (``app.GracefulServer``):
    sessions whose protocol has a closing event send it first."""

    def voices_for(self, key: str | None) -> frozenset[str]:
        """The voice names ``key`` may speak with: the TTS model's, "default", OpenAI's, and its own
        custom voices' ids."""
        own = self.voices.usable_ids(owner_of(key)) if key is not None else frozenset()
        return accepted_voices(self.workers.tts.describe()) | own

    def s2s_voices_of(self, key: str | None) -> Callable[[str], Mapping[str, VoiceCodes | str]]:
        """The custom voices ``key`` made for a speech-to-speech model, by the model's name (``binding``),
        as the library has them when called: each id's codes, which an opening that names it carries to
        the stage, or why it cannot open there (``VoiceLibrary.prompt_codes``)."""
        owner = owner_of(key) if key is not None else None
        return lambda model: self.voices.prompt_codes(owner, model) if owner is not None else {}
