"""Turn decisions from speech probabilities: when a user turn starts and stops.

Positions are ms on the session's input-audio timeline. Hysteresis as in Silero's own iterator:
speech starts at ``threshold`` and only counts as silence below ``threshold - 0.15``.

``server_vad`` ends a turn after ``silence_duration_ms`` of silence. ``semantic_vad`` asks a turn
model instead: after ``SEMANTIC_PAUSE_MS`` of silence the detector reports ``PauseHeard`` (the
session sends the turn's audio to the model), and the turn ends when the model's probability that it
is complete reaches the eagerness' threshold (``verdict``) while the user is still silent; speech
resuming makes that verdict stale. OpenAI's longest waits per eagerness end the turn regardless.
When the model cannot answer, the pause is judged by silence length alone (``fallback_ms``).
"""

from __future__ import annotations

from dataclasses import dataclass

SEMANTIC_PAUSE_MS = 200
"""Silence after speech that asks the turn model (pipecat's ``stop_secs`` with Smart Turn)."""
SEMANTIC_MAX_SILENCE_MS = {"low": 8000, "medium": 4000, "high": 2000, "auto": 4000}
"""OpenAI's max timeouts per eagerness: the turn ends after this much silence whatever the model says."""
SEMANTIC_THRESHOLDS = {"low": 0.8, "medium": 0.5, "high": 0.3, "auto": 0.5}
"""Probability of a complete turn that ends it: low eagerness wants to be surer the user finished."""
TURN_AUDIO_MS = 8000
"""The turn model reads the last 8 s of the turn."""


@dataclass(slots=True)
class SpeechStarted:
    start_ms: float


@dataclass(slots=True)
class SpeechStopped:
    start_ms: float
    end_ms: float
    """End of the last voiced window."""
    commit_ms: float
    """Where the committed audio ends (after the trailing silence)."""


@dataclass(frozen=True, slots=True)
class PauseHeard:
    """Semantic mode: the user paused; is the turn (``start_ms`` .. ``end_ms``) complete?"""

    @property
    def audio_from_ms(self) -> float:
        """Where the audio the turn model reads begins (its last ``TURN_AUDIO_MS``)."""
        return max(self.start_ms, self.end_ms - TURN_AUDIO_MS)

    pause_id: int
    start_ms: float
    end_ms: float


class TurnDetector:
    def __init__(self, threshold: float = 0.5, silence_duration_ms: float = 500) -> None:
        self.threshold = threshold
        self.silence_duration_ms = silence_duration_ms
        """Silence that ends a turn (semantic mode: the longest wait)."""
        self.pause_ms: float | None = None
        """Semantic mode: silence that asks the turn model; None: server VAD."""
        self.complete_threshold = 0.5
        self.fallback_ms = silence_duration_ms
        self.speaking = False
        self.start_ms = 0.0
        self.last_voice_ms = 0.0
        self.position_ms = 0.0
        """End of the last window seen."""
        self._pause_id = 0
        self._asked = False
        """The current pause was put to the turn model."""
        self._unjudged = False
        """The model could not judge the current pause: silence length decides."""

    def semantic(self, eagerness: str | None, fallback_ms: float = 0.0) -> None:
        """Judge pauses with the turn model at ``eagerness`` (None: by silence length, server VAD)."""
        if eagerness is None:
            self.pause_ms = None
            return
        self.pause_ms = SEMANTIC_PAUSE_MS
        self.silence_duration_ms = SEMANTIC_MAX_SILENCE_MS[eagerness]
        self.complete_threshold = SEMANTIC_THRESHOLDS[eagerness]
        self.fallback_ms = fallback_ms

    def reset(self) -> None:
        self.speaking = False
        self._asked = self._unjudged = False

    def feed(
        self, start_ms: float, window_ms: float, probs: list[float]
    ) -> list[SpeechStarted | SpeechStopped | PauseHeard]:
        out: list[SpeechStarted | SpeechStopped | PauseHeard] = []
        release = max(self.threshold - 0.15, 0.01)
        for i, p in enumerate(probs):
            begin = start_ms + i * window_ms
            end = begin + window_ms
            self.position_ms = end
            if not self.speaking:
                if p >= self.threshold:
                    self.speaking = True
                    self.start_ms = begin
                    self.last_voice_ms = end
                    out.append(SpeechStarted(begin))
            elif p >= release:
                self.last_voice_ms = end
                self._asked = self._unjudged = False  # a new pause will be judged afresh
            elif end - self.last_voice_ms >= self._silence_limit():
                out.append(self._stop())
            elif self.pause_ms is not None and not self._asked and end - self.last_voice_ms >= self.pause_ms:
                self._asked = True
                self._pause_id += 1
                out.append(PauseHeard(self._pause_id, self.start_ms, end))
        return out

    def verdict(self, pause_id: int, probability: float | None) -> list[SpeechStopped]:
        """The turn model's answer for ``pause_id`` (None: it could not answer). Ends the turn when
        it is complete and the user has stayed silent since the question."""
        if not (self.speaking and self._asked and pause_id == self._pause_id):
            return []  # speech resumed (or the turn ended) meanwhile
        if probability is None:
            self._unjudged = True
            return [self._stop()] if self.position_ms - self.last_voice_ms >= self._silence_limit() else []
        return [self._stop()] if probability >= self.complete_threshold else []

    def _silence_limit(self) -> float:
        return min(self.fallback_ms, self.silence_duration_ms) if self._unjudged else self.silence_duration_ms

    def _stop(self) -> SpeechStopped:
        self.speaking = False
        self._asked = self._unjudged = False
        return SpeechStopped(self.start_ms, self.last_voice_ms, self.position_ms)
