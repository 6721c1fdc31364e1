"""Text side of the codec TTS: the word-level feed that turns streamed text into tokens (the tokenizers
themselves are ``realtime_gw.models.tokenizers``).

The talker consumes one text token per frame (text leads, audio follows), so text only has to arrive a
word ahead of the audio. Words are released once whitespace follows them (a half-streamed word could
still grow) or at end of input; each word's text rides on the frame where its first token is spoken.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Protocol

_WORD = re.compile(r"\S+(?=\s)")


class TextTokenizer(Protocol):
    name: str
    pad_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...


class TextFeed:
    """Streamed text -> a queue of token ids plus word marks ``(token index, word)``."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.ended = False
        self.tokens: deque[int] = deque()
        self.marks: deque[tuple[int, str]] = deque()
        self.queued = 0
        """Tokens ever queued (the index the next queued token gets)."""
        self._buf = ""
        self._words = 0

    def feed(self, text: str) -> None:
        if self.ended:
            raise ValueError("text pushed after END_OF_INPUT")
        self._buf += text
        last = 0
        for m in _WORD.finditer(self._buf):
            self._add(m.group())
            last = m.end()
        self._buf = self._buf[last:]

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            for word in self._buf.split():
                self._add(word)
            self._buf = ""

    def _add(self, word: str) -> None:
        # A leading space between words, as BPE vocabularies expect ("Ġword"); bytes keep the pause.
        ids = self.tokenizer.encode((" " if self._words else "") + word)
        self._words += 1
        self.marks.append((self.queued, word))
        self.tokens.extend(ids)
        self.queued += len(ids)

    def take_marks(self, upto: int) -> list[str]:
        """Words whose first token index is < ``upto`` (i.e. already spoken), in order."""
        out = []
        while self.marks and self.marks[0][0] < upto:
            out.append(self.marks.popleft()[1])
        return out
