"""Session settings and ``session.update``: validated merge of a partial update. Pure."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec import UNSET

from realtime_gw.protocols import audio
from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import OUTPUT_RATE
from realtime_gw.sessions.duplex import DuplexSettings

OUTPUT_RATES = {"audio/pcm": OUTPUT_RATE, "audio/pcmu": 8000, "audio/pcma": 8000}
OUTPUT_FORMATS = frozenset(OUTPUT_RATES)
SEMANTIC_SILENCE_MS = {"low": 1200, "medium": 700, "high": 400, "auto": 700}
"""semantic_vad is approximated by server VAD with a silence length per eagerness."""


class SessionError(Exception):
    """A client event that breaks a rule; becomes one ``error`` event, state unchanged."""

    def __init__(self, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


@dataclass(slots=True)
class SessionSettings:
    instructions: str = ""
    output_modalities: list[str] = field(default_factory=lambda: ["audio"])
    input_format: str = "audio/pcm"
    input_rate: int = 24000
    transcription: rt.TranscriptionConfig | None = None
    turn_detection: rt.ServerVad | rt.SemanticVad | None = field(default_factory=rt.ServerVad)
    noise_reduction: str | None = None
    output_format: str = "audio/pcm"
    voice: str = "default"
    speed: float = 1.0
    max_output_tokens: int | None = None
    duplex: DuplexSettings = field(default_factory=DuplexSettings)

    def to_wire(self, session_id: str, model: str, duplex: bool = False) -> rt.SessionOut:
        td: Any = None if self.turn_detection is None else msgspec.to_builtins(self.turn_detection)
        in_fmt: dict[str, Any] = {"type": self.input_format}
        if self.input_format == "audio/pcm" and self.input_rate == OUTPUT_RATE:
            in_fmt["rate"] = self.input_rate
        elif self.input_format == "audio/pcm":
            # The API's `rate` only admits 24000; other input rates are echoed in an additive field.
            in_fmt["sample_rate_hz"] = self.input_rate
        out_fmt: dict[str, Any] = {"type": self.output_format}
        if self.output_format == "audio/pcm":
            out_fmt["rate"] = OUTPUT_RATE
        return rt.SessionOut(
            id=session_id,
            model=model,
            instructions=self.instructions,
            output_modalities=list(self.output_modalities),
            audio={
                "input": {
                    "format": in_fmt,
                    "transcription": None
                    if self.transcription is None
                    else msgspec.to_builtins(self.transcription),
                    "turn_detection": td,
                    "noise_reduction": None
                    if self.noise_reduction is None
                    else {"type": self.noise_reduction},
                },
                "output": {"format": out_fmt, "voice": self.voice, "speed": self.speed},
            },
            max_output_tokens="inf" if self.max_output_tokens is None else self.max_output_tokens,
            capabilities={"supports_barge_in": True, "supports_playback_ack": True, "chunk_period_ms": 80}
            if duplex
            else None,
            duplex=dataclasses.asdict(self.duplex) if duplex else None,
        )



def check_voice(voice: str, voices: frozenset[str], param: str) -> str:
    if voice not in voices:
        raise SessionError(f"Unknown voice '{voice}'; available: {', '.join(sorted(voices))}", "invalid_value", param)
    return voice


def apply_session_update(current: SessionSettings, p: rt.SessionParams, voices: frozenset[str]) -> SessionSettings:
    """The settings after ``session.update``; raises ``SessionError`` (naming the field) and leaves
    ``current`` untouched when anything is invalid."""
    new = dataclasses.replace(current)
    if p.type is not UNSET and p.type != "realtime":
        raise SessionError(
            f"Unsupported session type '{p.type}'; only 'realtime' is served", "invalid_value", "session.type"
        )
    if p.instructions is not UNSET:
        new.instructions = p.instructions
    if p.output_modalities is not UNSET:
        if not p.output_modalities:
            raise SessionError("output_modalities must not be empty", "invalid_value", "session.output_modalities")
        new.output_modalities = list(p.output_modalities)
    if p.max_output_tokens is not UNSET:
        if isinstance(p.max_output_tokens, int) and p.max_output_tokens < 1:
            raise SessionError("max_output_tokens must be at least 1", "invalid_value", "session.max_output_tokens")
        new.max_output_tokens = None if p.max_output_tokens == "inf" else p.max_output_tokens
    if p.audio is not UNSET:
        _apply_audio(new, p.audio, voices)
    if p.duplex is not UNSET:
        d = p.duplex
        new.duplex = DuplexSettings(
            overlap_short_ack_ms=new.duplex.overlap_short_ack_ms
            if d.overlap_short_ack_ms is UNSET
            else d.overlap_short_ack_ms,
            overlap_barge_in_ms=new.duplex.overlap_barge_in_ms
            if d.overlap_barge_in_ms is UNSET
            else d.overlap_barge_in_ms,
            echo_guard_ms=new.duplex.echo_guard_ms if d.echo_guard_ms is UNSET else d.echo_guard_ms,
        )
        if new.duplex.overlap_barge_in_ms < new.duplex.overlap_short_ack_ms:
            raise SessionError(
                "overlap_barge_in_ms must not be shorter than overlap_short_ack_ms",
                "invalid_value",
                "session.duplex.overlap_barge_in_ms",
            )
    return new


def _apply_audio(new: SessionSettings, a: rt.AudioConfig, voices: frozenset[str]) -> None:
    if a.input is not UNSET:
        i = a.input
        if i.format is not UNSET:
            try:
                new.input_rate = audio.input_rate(i.format.type, i.format.rate)
            except ValueError as e:
                raise SessionError(str(e), "invalid_value", "session.audio.input.format") from None
            new.input_format = i.format.type
        if i.transcription is not UNSET:
            new.transcription = i.transcription
        if i.turn_detection is not UNSET:
            td = i.turn_detection
            if isinstance(td, rt.ServerVad):
                if not 0.0 < td.threshold < 1.0:
                    raise SessionError(
                        "threshold must be between 0 and 1",
                        "invalid_value",
                        "session.audio.input.turn_detection.threshold",
                    )
                if td.silence_duration_ms < 0 or td.prefix_padding_ms < 0:
                    raise SessionError(
                        "durations must not be negative",
                        "invalid_value",
                        "session.audio.input.turn_detection",
                    )
            new.turn_detection = td
        if i.noise_reduction is not UNSET:
            new.noise_reduction = None if i.noise_reduction is None else i.noise_reduction.type
    if a.output is not UNSET:
        o = a.output
        if o.format is not UNSET:
            if o.format.type not in OUTPUT_FORMATS:
                raise SessionError(
                    f"Unsupported output format '{o.format.type}'; use one of {sorted(OUTPUT_FORMATS)}",
                    "invalid_value",
                    "session.audio.output.format.type",
                )
            if o.format.type == "audio/pcm" and o.format.rate not in (None, OUTPUT_RATE):
                raise SessionError(
                    f"Output audio/pcm is {OUTPUT_RATE} Hz; rate {o.format.rate} is not supported",
                    "invalid_value",
                    "session.audio.output.format.rate",
                )
            new.output_format = o.format.type
        if o.voice is not UNSET:
            new.voice = check_voice(o.voice, voices, "session.audio.output.voice")
        if o.speed is not UNSET:
            if not audio.speed_in_range(o.speed):
                raise SessionError(audio.SPEED_ERROR, "invalid_value", "session.audio.output.speed")
            new.speed = o.speed

