"""The sentence splitter every sentence-at-a-time TTS backend shares: linear in its input whatever the
input looks like, and bounded per stream."""

from __future__ import annotations

import time

import pytest

from realtime_gw.models.speech.tts_base import MAX_SENTENCE_CHARS, SentenceBuffer, TextTooLong
from realtime_gw.models.speech.tts_tone import ToneTtsBackend
from realtime_gw.records.voice import TtsRequest


def _split(text: str, pieces: int = 1) -> tuple[list[str], float]:
    """Sentences of ``text`` fed in ``pieces`` equal parts, and the CPU seconds it took (best of two)."""
    best = float("inf")
    for _ in range(2):
        t0 = time.process_time()
        b = SentenceBuffer()
        size = -(-len(text) // pieces)
        for i in range(0, len(text), size):
            b.feed(text[i : i + size])
        b.end()
        best = min(best, time.process_time() - t0)
    return list(b.sentences), best


@pytest.mark.parametrize(
    ("unit", "pieces"),
    [("word ", 1), ("a", 1), (".", 1), ("!?", 1), ("Hi! ", 1), ("word ", 4096)],
    ids=["words", "no-spaces", "dots", "marks", "short-sentences", "streamed"],
)
def test_splitting_is_linear(unit: str, pieces: int) -> None:
    """4 MB costs about 4x what 1 MB costs (quadratic splitting would cost 16x: the attack of 2.4 MB
    that stalled every stream for 25 s). The ratio is loose on purpose: the machine is shared."""
    small, large = unit * (1_000_000 // len(unit)), unit * (4_000_000 // len(unit))
    small_sentences, t_small = _split(small, pieces)
    large_sentences, t_large = _split(large, pieces)
    assert t_large / max(t_small, 1e-3) < 9.0
    assert all(len(s) <= MAX_SENTENCE_CHARS for s in large_sentences)
    assert "".join(large_sentences).replace(" ", "") == large.replace(" ", "")  # nothing lost
    assert len(large_sentences) >= 3 * len(small_sentences)


def test_a_run_on_sentence_is_cut_even_when_its_end_arrives_with_it() -> None:
    b = SentenceBuffer(max_chars=20)
    b.feed("word " * 20 + "end. Next")
    assert all(len(s) <= 20 for s in b.sentences) and b.sentences[-1].endswith("end.")
    b.end()
    assert b.sentences[-1] == "Next"


def test_text_per_stream_is_bounded() -> None:
    b = SentenceBuffer(max_text_chars=10)
    b.feed("Hello.")
    with pytest.raises(TextTooLong, match="exceeds 10 characters"):
        b.feed(" World!")
    tone = ToneTtsBackend()
    tone.max_text_chars = 100
    state = tone.open(TtsRequest())
    (result,) = tone.step([(state, ["x" * 101])])
    assert result.done and result.error is not None and "tts_max_text_chars" in result.error
