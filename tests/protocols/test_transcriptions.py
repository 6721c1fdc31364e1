"""The transcription endpoint's pure parts: the form's checks, cutting at pauses, the response formats."""

from __future__ import annotations

import json

import numpy as np
import pytest
from openai.types.audio import Transcription, TranscriptionTextDoneEvent, TranscriptionVerbose

from realtime_gw.protocols import transcriptions as tp


def form(**fields: str | list[str]) -> dict[str, list[str]]:
    return {k: v if isinstance(v, list) else [v] for k, v in fields.items()}


def test_openai_model_names_map_to_the_stage() -> None:
    for model in ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe", "pocketsphinx"):
        assert tp.check_form(form(model=model), "pocketsphinx", True).model == model
    with pytest.raises(tp.TranscriptionInputError) as e:
        tp.check_form(form(model="kyutai"), "pocketsphinx", True)
    assert e.value.param == "model" and e.value.code == "model_not_found"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({}, "model"),
        ({"response_format": "diarized_json"}, "response_format"),
        ({"language": "de"}, "language"),
        ({"timestamp_granularities[]": ["word"]}, "timestamp_granularities"),  # needs verbose_json
        ({"timestamp_granularities[]": ["letter"], "response_format": "verbose_json"}, "timestamp_granularities"),
        ({"include[]": ["logprobs"]}, "include"),
        ({"stream": "maybe"}, "stream"),
    ],
)
def test_refusals_name_the_field(fields: dict[str, object], param: str) -> None:
    base = {} if param == "model" else {"model": "whisper-1"}
    with pytest.raises(tp.TranscriptionInputError) as e:
        tp.check_form(form(**base, **fields), "pocketsphinx", True)  # type: ignore[arg-type]
    assert e.value.param == param and e.value.status == 400


def test_word_times_only_where_the_stage_gives_them() -> None:
    fields = form(model="whisper-1", response_format="verbose_json", **{"timestamp_granularities[]": ["word", "segment"]})
    assert tp.check_form(fields, "pocketsphinx", True).granularities == ("word", "segment")
    with pytest.raises(tp.TranscriptionInputError, match="does not time words"):
        tp.check_form(fields, "kyutai", False)
    fields["timestamp_granularities[]"] = ["segment"]
    assert tp.check_form(fields, "kyutai", False).granularities == ("segment",)


def test_pieces_end_in_pauses_and_cover_the_audio() -> None:
    rate = 16000
    rng = np.random.default_rng(0)
    loud = (rng.standard_normal(rate) * 3000).astype("<i2")
    # 1 s of "speech", 0.3 s pause, repeated: 39 s
    unit = np.concatenate([loud, np.zeros(int(0.3 * rate), "<i2")])
    pcm = np.tile(unit, 30).tobytes()
    cuts = tp.pieces(pcm, rate)
    assert cuts[0][0] == 0 and cuts[-1][1] == len(pcm)
    assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:], strict=False))
    for start, end in cuts[:-1]:
        assert tp.PIECE_MIN_S <= (end - start) / 2 / rate <= tp.PIECE_MAX_S
        at = end // 2 % len(unit)
        assert at == 0 or at > rate, "a piece ended inside the speech"
    assert tp.pieces(b"", rate) == [] and tp.pieces(bytes(100), rate) == [(0, 100)]


def transcript() -> tp.Transcript:
    return tp.Transcript(
        75.5,
        [
            tp.Segment(0.0, 12.0, "hello there", [tp.Word("hello", 0.5, 0.9), tp.Word("there", 1.0, 1.4)]),
            tp.Segment(12.0, 75.5, "general kenobi", [tp.Word("general", 62.0, 62.5), tp.Word("kenobi", 62.5, 63.25)]),
        ],
    )


def test_formats_as_the_sdk_types_them() -> None:
    t = transcript()
    body, media = tp.render(t, tp.TranscriptionForm("whisper-1"), "english")
    assert media == "application/json" and Transcription.model_validate_json(body).text == "hello there general kenobi"
    verbose = tp.TranscriptionForm("whisper-1", "verbose_json", granularities=("word",))
    parsed = TranscriptionVerbose.model_validate_json(tp.render(t, verbose, "english")[0])
    assert parsed.segments is None and parsed.words and parsed.words[-1].end == 63.25
    both = TranscriptionVerbose.model_validate_json(tp.render(t, tp.TranscriptionForm("x", "verbose_json"), "english")[0])
    assert both.segments and both.segments[1].start == 12.0 and both.words is None
    srt = tp.render(t, tp.TranscriptionForm("x", "srt"), "english")[0]
    assert srt == "1\n00:00:00,000 --> 00:00:12,000\nhello there\n\n2\n00:00:12,000 --> 00:01:15,500\ngeneral kenobi\n"
    vtt = tp.render(t, tp.TranscriptionForm("x", "vtt"), "english")[0]
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:12.000\nhello there\n")
    assert tp.render(t, tp.TranscriptionForm("x", "text"), "english")[0] == "hello there general kenobi\n"
    done = TranscriptionTextDoneEvent.model_validate_json(json.dumps(tp.done_event(t)))
    assert done.usage is not None and done.usage.output_tokens == 4 and done.usage.input_tokens == round(75.5 * 12.5)
