"""Plain request and result records exchanged with stage workers (no torch, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from realtime_gw.protocols.audio import FRAME_SAMPLES, OUTPUT_RATE

__all__ = [
    "FRAME_SAMPLES",
    "OUTPUT_RATE",
    "AsrRequest",
    "AsrResult",
    "ChatMessage",
    "TtsFrame",
    "TtsRequest",
    "VadProbs",
    "VadRequest",
]


@dataclass(slots=True)
class ChatMessage:
    """One message of the conversation as a responder sees it (OpenAI chat roles)."""

    role: str
    content: str


@dataclass(slots=True)
class TtsRequest:
    voice: str = "default"
    speed: float = 1.0


@dataclass(slots=True)
class TtsFrame:
    """One 80 ms frame of 24 kHz PCM16 (the final frame of an utterance may be shorter or empty)."""

    pcm: bytes
    text: str = ""
    """Text whose audio starts in this frame ("" on continuation frames)."""
    final: bool = False


@dataclass(slots=True)
class AsrRequest:
    pcm: bytes
    """PCM16 little-endian mono."""
    sample_rate: int


@dataclass(slots=True)
class AsrResult:
    text: str


@dataclass(slots=True)
class VadRequest:
    sample_rate: int
    """Rate of the PCM16 chunks that will be pushed to this stream."""


@dataclass(slots=True)
class VadProbs:
    """Speech probabilities for consecutive windows of one stream's audio."""

    start_ms: float
    """Position of the first window, in ms of audio pushed to this stream so far."""
    window_ms: float
    probs: list[float]
