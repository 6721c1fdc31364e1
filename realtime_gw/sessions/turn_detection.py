"""Server VAD decisions from speech probabilities: when a user turn starts and stops.

Positions are ms on the session's input-audio timeline. Hysteresis as in Silero's own iterator:
speech starts at ``threshold`` and only counts as silence below ``threshold - 0.15``.
"""

from __future__ import annotations

from dataclasses import dataclass


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


class TurnDetector:
    def __init__(self, threshold: float = 0.5, silence_duration_ms: float = 500) -> None:
        self.threshold = threshold
        self.silence_duration_ms = silence_duration_ms
        self.speaking = False
        self.start_ms = 0.0
        self.last_voice_ms = 0.0
        self.position_ms = 0.0
        """End of the last window seen."""

    def reset(self) -> None:
        self.speaking = False

    def feed(self, start_ms: float, window_ms: float, probs: list[float]) -> list[SpeechStarted | SpeechStopped]:
        out: list[SpeechStarted | SpeechStopped] = []
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
            elif end - self.last_voice_ms >= self.silence_duration_ms:
                self.speaking = False
                out.append(SpeechStopped(self.start_ms, self.last_voice_ms, end))
        return out
