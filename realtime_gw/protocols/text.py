"""Where streamed text is cut for speech: one rule of sentence ends, for every layer that speaks text.

A sentence ends at .!? (optionally followed by closing quotes or brackets) plus whitespace, or at a
newline. Requiring the whitespace keeps "3.14" and a half-streamed "Hello." (more may follow) together.
Two users cut by it:

- ``SentenceBuffer``: a TTS stream's text, sentence by sentence, each at most ``max_chars`` (a longer
  one is cut at a space), so a backend synthesizes one sentence per step;
- ``segment_end``: the speech stream's (``sessions/speech.py``) "speak up to here": all the complete
  sentences of the text waiting, as one segment (one TTS stream, which splits it again as above).

Linear on any input: a match starts only at the first mark of a run (the lookbehind) and possessive
quantifiers never backtrack, so a megabyte of "!!!!" is scanned once, not once per position; text that
grows piece by piece is scanned from the start of its trailing run of end marks only (``resume_at``).
"""

from __future__ import annotations

import re
from collections import deque

SENTENCE_END = re.compile(r"(?<![.!?])[.!?]++[\"'\u201d\u2019)\]]*+\s++|\n++")
END_MARKS = ".!?\"'\u201d\u2019)]"
"""What may stand just before a sentence end's whitespace (the marks and the closers)."""
MAX_SENTENCE_CHARS = 400
"""Text without any sentence end is cut at a space beyond this, so a run-on stream still speaks."""


def resume_at(text: str, scanned: int) -> int:
    """Where to go on scanning ``text`` whose first ``scanned`` characters held no sentence end: the
    start of their trailing run of end marks, as a sentence end may begin there."""
    return len(text[:scanned].rstrip(END_MARKS))


def segment_end(text: str, scanned: int = 0, run_on: int = MAX_SENTENCE_CHARS) -> int:
    """Where the complete sentences in ``text`` end (0: none yet); ``text[:scanned]`` is known to hold
    none. Text without one is cut after its last space once ``run_on`` long (or whole, without a space)."""
    end = 0
    for match in SENTENCE_END.finditer(text, resume_at(text, scanned)):
        end = match.end()
    if end == 0 and len(text) >= run_on:
        end = text.rfind(" ") + 1 or len(text)
    return end


class TextTooLong(ValueError):
    """A stream's text went past its backend's ``max_text_chars`` (config ``tts_max_text_chars``)."""


class SentenceBuffer:
    """Accumulates streamed text and hands out complete sentences, in time linear in the text."""

    def __init__(self, max_chars: int = MAX_SENTENCE_CHARS, max_text_chars: int | None = None) -> None:
        self.max_chars = max_chars
        self.max_text_chars = max_text_chars
        self.ended = False
        self.fed = 0
        """Characters fed so far (bounded by ``max_text_chars``)."""
        self.sentences: deque[str] = deque()
        self._buf = ""

    def feed(self, text: str) -> None:
        if self.ended:
            raise ValueError("text pushed after END_OF_INPUT")
        self.fed += len(text)
        if self.max_text_chars is not None and self.fed > self.max_text_chars:
            raise TextTooLong(
                f"text exceeds {self.max_text_chars} characters per request (tts_max_text_chars)"
            )
        # Offsets into one string, one scan: the buffer is sliced once per sentence and once at the end
        # (re-slicing the remainder after every sentence made a megabyte quadratic).
        # The buffered text held no sentence end, so only its trailing run of end marks and the new
        # text are scanned.
        scan = resume_at(self._buf, len(self._buf))
        buf = self._buf + text
        start = 0
        for m in SENTENCE_END.finditer(buf, scan):
            start = self._take(buf, start, m.end(), keep_tail=False)
        self._buf = buf[self._take(buf, start, len(buf), keep_tail=True) :]

    def _take(self, buf: str, start: int, end: int, keep_tail: bool) -> int:
        """Add ``buf[start:end]`` as sentences of at most ``max_chars`` (cut at a space when there is
        one); with ``keep_tail`` the last piece (not longer than ``max_chars``) stays buffered, as more
        text may complete it. Returns where the buffered text starts."""
        while end - start > self.max_chars:
            cut = buf.rfind(" ", start, start + self.max_chars)
            cut = cut if cut > start else start + self.max_chars
            self._add(buf[start:cut])
            start = cut
        if not keep_tail:
            self._add(buf[start:end])
            start = end
        return start

    def end(self) -> None:
        """No more text: whatever is buffered becomes the last sentence."""
        if not self.ended:
            self.ended = True
            self._add(self._buf)
            self._buf = ""

    def _add(self, sentence: str) -> None:
        sentence = sentence.strip()
        if sentence:
            self.sentences.append(sentence)

    @property
    def ready(self) -> bool:
        return bool(self.sentences) or self.ended
