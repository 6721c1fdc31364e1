"""Streaming TTS wire formats: ``POST /v1/audio/speech`` (OpenAI-compatible) and the
``/v1/audio/speech/stream`` WebSocket (incremental text in, 80 ms PCM frames out). Pure."""

from __future__ import annotations

import io
import struct
from typing import Literal

import msgspec
import numpy as np
import soundfile

from realtime_gw.protocols.audio import FRAME_SAMPLES, OUTPUT_RATE, SPEED_ERROR, speed_in_range
from realtime_gw.protocols.realtime_shapes import VoiceId

RESPONSE_FORMATS = ("wav", "pcm", "flac")
MAX_INSTRUCTIONS_CHARS = 4096
"""``instructions`` (how to speak, in words) longer than this are refused (OpenAI's limit is 4096 too)."""


class SpeechRequest(msgspec.Struct, kw_only=True):
    input: str
    model: str = "realtime-gw"
    voice: str | VoiceId = "default"
    """A voice name, or a custom voice as ``{"id": ...}`` (``/v1/audio/voices``): a name once decoded."""
    response_format: str = "wav"
    stream_format: str = "audio"
    speed: float = 1.0
    instructions: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.voice, VoiceId):
            self.voice = self.voice.id


class SpeechInputError(ValueError):
    def __init__(self, message: str, param: str | None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def check_speech_request(req: SpeechRequest, voices: frozenset[str], max_chars: int = 4096) -> None:
    """Raise ``SpeechInputError`` naming the parameter, as OpenAI does."""
    if not req.input.strip():
        raise SpeechInputError("input must not be empty", "input")
    if len(req.input) > max_chars:
        raise SpeechInputError(f"input is longer than {max_chars} characters", "input")
    if req.voice not in voices:
        raise SpeechInputError(f"Unknown voice '{req.voice}'; available: {', '.join(sorted(voices))}", "voice")
    if req.response_format not in RESPONSE_FORMATS:
        raise SpeechInputError(
            f"response_format '{req.response_format}' is not supported; use one of {', '.join(RESPONSE_FORMATS)}",
            "response_format",
        )
    if req.stream_format not in ("audio", "sse"):
        raise SpeechInputError("stream_format must be 'audio' or 'sse'", "stream_format")
    if req.stream_format == "sse" and req.response_format == "flac":
        raise SpeechInputError("stream_format 'sse' carries pcm or wav, not flac", "stream_format")
    if not speed_in_range(req.speed):
        raise SpeechInputError(SPEED_ERROR, "speed")
    if (why := instructions_error(req.instructions)) is not None:
        raise SpeechInputError(why, "instructions")


def instructions_error(instructions: str | None) -> str | None:
    """Why ``instructions`` (the HTTP body's or the speech WebSocket's ``session.config``'s) are refused."""
    if instructions is not None and len(instructions) > MAX_INSTRUCTIONS_CHARS:
        return f"instructions are longer than {MAX_INSTRUCTIONS_CHARS} characters"
    return None


def wav_header(sample_rate: int = OUTPUT_RATE, data_bytes: int = 0xFFFFFFFF - 36) -> bytes:
    """A PCM16 mono WAV header; with the default size it is the streaming form (length unknown)."""
    riff = min(0xFFFFFFFF, data_bytes + 36)
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", min(0xFFFFFFFF, data_bytes))
    )


def flac_bytes(pcm16: bytes, sample_rate: int = OUTPUT_RATE) -> bytes:
    """A whole FLAC file of PCM16 mono (FLAC frames need the whole signal's framing). CPU-bound for
    long clips: callers on an event loop run it in a thread."""
    buf = io.BytesIO()
    soundfile.write(buf, np.frombuffer(pcm16, dtype="<i2"), sample_rate, format="FLAC", subtype="PCM_16")
    return buf.getvalue()


# -- the WebSocket stream ---------------------------------------------------------------------------


class StreamEvent(msgspec.Struct, tag_field="type", kw_only=True):
    pass


class SessionConfig(StreamEvent, tag="session.config"):
    voice: str | VoiceId = "default"
    """As ``SpeechRequest.voice``: a name once decoded."""
    speed: float = 1.0
    instructions: str | None = None
    """How to speak, in words, as ``POST /v1/audio/speech``'s (backends that take a description use it)."""
    response_format: Literal["pcm"] = "pcm"

    def __post_init__(self) -> None:
        if isinstance(self.voice, VoiceId):
            self.voice = self.voice.id


class InputText(StreamEvent, tag="input.text"):
    text: str


class InputDone(StreamEvent, tag="input.done"):
    pass


StreamClientEvent = SessionConfig | InputText | InputDone


class AudioStart(StreamEvent, tag="audio.start"):
    utterance: int
    sample_rate: int = OUTPUT_RATE
    format: str = "pcm_s16le"
    frame_samples: int = FRAME_SAMPLES


class AudioDone(StreamEvent, tag="audio.done"):
    utterance: int
    frames: int
    audio_ms: float
    text: str


class StreamError(StreamEvent, tag="error"):
    message: str
    code: str
    param: str | None = None


_stream_decoder = msgspec.json.Decoder(StreamClientEvent)


def decode_stream_event(raw: str | bytes) -> StreamClientEvent | StreamError:
    try:
        return _stream_decoder.decode(raw)
    except msgspec.ValidationError as e:
        return StreamError(message=f"Invalid event: {e}", code="invalid_event")
    except msgspec.DecodeError as e:
        return StreamError(message=f"Malformed JSON: {e}", code="invalid_json")
