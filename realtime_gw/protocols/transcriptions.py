"""``POST /v1/audio/transcriptions``: the form's fields checked, OpenAI's model names mapped to the
configured ASR stage, the audio cut into pieces at pauses, and the transcript written in each response
format (``json``, ``text``, ``srt``, ``vtt``, ``verbose_json``) and as server-sent events. Pure.

Shapes follow the ``openai`` SDK (``openai.types.audio``): ``Transcription``, ``TranscriptionVerbose``
(segments and words), ``TranscriptionTextDeltaEvent`` and ``TranscriptionTextDoneEvent``.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

OPENAI_MODELS = frozenset(
    {
        "whisper-1",
        "gpt-4o-transcribe",
        "gpt-4o-mini-transcribe",
        "gpt-4o-mini-transcribe-2025-12-15",
        "gpt-transcribe",
    }
)
"""OpenAI's transcription models: each is served by the configured ASR stage (``asr``)."""
RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("word", "segment")
STAGE_LANGUAGES = {"pocketsphinx": {"en": "english"}, "kyutai": {"en": "english", "fr": "french"}}
"""What each ASR stage hears (ISO-639-1 code -> the name ``verbose_json`` reports); the first is assumed."""
AUDIO_TOKENS_PER_S = 12.5
"""Usage in tokens (the streamed ``done`` event's shape): one audio token per 80 ms of input."""

PIECE_MAX_S = 20.0
"""Longest piece of a file one ASR stream hears: the stream is held no longer, and a live call can
take the slot between pieces."""
PIECE_MIN_S = 10.0
"""Where a piece may end: the quietest 10 ms between this and ``PIECE_MAX_S``."""


class TranscriptionInputError(Exception):
    def __init__(self, message: str, param: str | None, code: str = "invalid_value", status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
        self.status = status


@dataclass(slots=True)
class TranscriptionForm:
    model: str
    response_format: str = "json"
    language: str = "en"
    prompt: str | None = None
    granularities: tuple[str, ...] = ()
    stream: bool = False


def check_form(fields: dict[str, list[str]], stage: str, word_times: bool) -> TranscriptionForm:
    """The form's text fields (``include[]`` and ``timestamp_granularities[]`` repeat) against what the
    configured ``stage`` can do; raises ``TranscriptionInputError`` naming the field."""

    def one(name: str) -> str | None:
        values = fields.get(name)
        return values[-1] if values else None

    def many(name: str) -> list[str]:
        return fields.get(name + "[]", []) + fields.get(name, [])

    model = one("model")
    if not model:
        raise TranscriptionInputError("you must provide a model parameter", "model", "missing_required_parameter")
    if model not in OPENAI_MODELS and model != stage:
        known = ", ".join(sorted(OPENAI_MODELS | {stage}))
        raise TranscriptionInputError(f"Unknown model '{model}'; use one of: {known}", "model", "model_not_found")
    fmt = one("response_format") or "json"
    if fmt not in RESPONSE_FORMATS:
        raise TranscriptionInputError(
            f"Unsupported response_format '{fmt}'; use one of: {', '.join(RESPONSE_FORMATS)}", "response_format"
        )
    languages = STAGE_LANGUAGES[stage]
    language = (one("language") or next(iter(languages))).lower()
    if language not in languages:
        raise TranscriptionInputError(
            f"The configured ASR stage ({stage}) transcribes {', '.join(languages)}, not '{language}'", "language"
        )
    granularities = tuple(dict.fromkeys(many("timestamp_granularities")))
    for g in granularities:
        if g not in GRANULARITIES:
            raise TranscriptionInputError(f"Unknown timestamp granularity '{g}'", "timestamp_granularities")
    if granularities and fmt != "verbose_json":
        raise TranscriptionInputError(
            "timestamp_granularities needs response_format 'verbose_json'", "timestamp_granularities"
        )
    if "word" in granularities and not word_times:
        raise TranscriptionInputError(
            f"The configured ASR stage ({stage}) does not time words; ask for 'segment' timestamps",
            "timestamp_granularities",
        )
    for item in many("include"):
        if item == "logprobs":
            raise TranscriptionInputError(
                f"The configured ASR stage ({stage}) gives no token log probabilities", "include"
            )
        raise TranscriptionInputError(f"Unknown include '{item}'", "include")
    stream = (one("stream") or "false").lower()
    if stream not in ("true", "false"):
        raise TranscriptionInputError("stream must be true or false", "stream")
    return TranscriptionForm(
        model=model,
        response_format=fmt,
        language=language,
        prompt=one("prompt"),
        granularities=granularities,
        stream=stream == "true",
    )


# -- cutting the audio --------------------------------------------------------------------------------
def pieces(pcm: bytes, rate: int, max_s: float = PIECE_MAX_S, min_s: float = PIECE_MIN_S) -> list[tuple[int, int]]:
    """(start, end) byte offsets of PCM16 ``pcm`` cut into pieces of at most ``max_s``, each ending at
    the quietest 10 ms after ``min_s`` (a pause, where no word is cut)."""
    hop = rate // 100
    x = np.frombuffer(pcm, dtype="<i2")
    n = len(x) // hop
    energy = (x[: n * hop].astype(np.float32).reshape(n, hop) ** 2).mean(axis=1) if n else np.zeros(0)
    out: list[tuple[int, int]] = []
    start = 0  # in hops
    lo, hi = int(min_s * 100), int(max_s * 100)
    while n - start > hi:
        cut = start + lo + int(np.argmin(energy[start + lo : start + hi])) + 1
        out.append((start * hop * 2, cut * hop * 2))
        start = cut
    return out + [(start * hop * 2, len(pcm))] if pcm else out


# -- the transcript -------------------------------------------------------------------------------------
@dataclass(slots=True)
class Word:
    word: str
    start: float
    end: float


@dataclass(slots=True)
class Segment:
    start: float
    end: float
    text: str
    words: list[Word] = field(default_factory=list)


@dataclass(slots=True)
class Transcript:
    duration: float
    segments: list[Segment] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join(s.text for s in self.segments if s.text)


def usage_tokens(transcript: Transcript) -> dict[str, Any]:
    audio = round(transcript.duration * AUDIO_TOKENS_PER_S)
    words = len(transcript.text.split())
    return {
        "type": "tokens",
        "input_tokens": audio,
        "output_tokens": words,
        "total_tokens": audio + words,
        "input_token_details": {"audio_tokens": audio, "text_tokens": 0},
    }


def render(t: Transcript, form: TranscriptionForm, language_name: str) -> tuple[str, str]:
    """(body, media type) of the response in ``form.response_format``."""
    fmt = form.response_format
    if fmt == "text":
        return t.text + "\n", "text/plain; charset=utf-8"
    if fmt == "srt":
        return _cues(t, ",", numbered=True), "application/x-subrip; charset=utf-8"
    if fmt == "vtt":
        return "WEBVTT\n\n" + _cues(t, ".", numbered=False), "text/vtt; charset=utf-8"
    usage = {"type": "duration", "seconds": round(t.duration, 3)}
    if fmt == "json":
        return json.dumps({"text": t.text, "usage": usage}), "application/json"
    body: dict[str, Any] = {
        "task": "transcribe",
        "language": language_name,
        "duration": round(t.duration, 3),
        "text": t.text,
        "usage": usage,
    }
    if "segment" in form.granularities or not form.granularities:
        body["segments"] = [_segment(i, s) for i, s in enumerate(t.segments)]
    if "word" in form.granularities:
        body["words"] = [
            {"word": w.word, "start": round(w.start, 2), "end": round(w.end, 2)} for s in t.segments for w in s.words
        ]
    return json.dumps(body), "application/json"


def _segment(i: int, s: Segment) -> dict[str, Any]:
    """Whisper's segment shape. The scores this stage does not compute are reported neutrally:
    ``avg_logprob`` 0, ``temperature`` 0 (no sampling), ``tokens`` empty, ``no_speech_prob`` 1 for a
    piece with no words else 0; ``compression_ratio`` is measured as Whisper does (zlib)."""
    raw = s.text.encode()
    ratio = len(raw) / len(zlib.compress(raw)) if raw else 0.0
    return {
        "id": i,
        "seek": round(s.start * 100),
        "start": round(s.start, 2),
        "end": round(s.end, 2),
        "text": s.text,
        "tokens": [],
        "temperature": 0.0,
        "avg_logprob": 0.0,
        "compression_ratio": round(ratio, 3),
        "no_speech_prob": 0.0 if s.text else 1.0,
    }


def _clock(seconds: float, sep: str) -> str:
    ms = round(seconds * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def _cues(t: Transcript, sep: str, numbered: bool) -> str:
    out = []
    for n, s in enumerate((s for s in t.segments if s.text), start=1):
        head = f"{n}\n" if numbered else ""
        out.append(f"{head}{_clock(s.start, sep)} --> {_clock(s.end, sep)}\n{s.text}\n")
    return "\n".join(out)


def sse(event: dict[str, Any]) -> str:
    return f"data: {json.dumps(event)}\n\n"


def delta_event(text: str) -> dict[str, Any]:
    return {"type": "transcript.text.delta", "delta": text}


def done_event(t: Transcript) -> dict[str, Any]:
    return {"type": "transcript.text.done", "text": t.text, "usage": usage_tokens(t)}
