"""The user's turns as GPT-Live input transcript fragments, on the input timeline. Pure.

Each fragment carries its turn's ``start_ms``/``end_ms`` (speech start and stop as the realtime
session's VAD placed them); fragments of all turns concatenate verbatim into one transcript (a new
turn's first fragment starts with a space).
"""

from __future__ import annotations

from realtime_gw.protocols import live
from realtime_gw.protocols import realtime as rt


class InputTranscripts:
    def __init__(self) -> None:
        self.turn_ms: dict[str, list[int]] = {}
        """Each user turn's ``[start_ms, end_ms]`` on the input timeline (for its transcript)."""
        self.hearing: set[str] = set()
        """User turns whose transcript is being sent (their first delta went out)."""
        self.transcribed = False
        """Some user turn's transcript went out before: the next one starts with a space."""

    def translate(self, ev: object, buffer_end_ms: float) -> live.InputTranscriptDeltaEvent | None:
        """Keep the turn's place from the VAD events; a transcription delta as its GPT-Live fragment."""
        match ev:
            case rt.InputAudioBufferSpeechStartedEvent():
                self.turn_ms[ev.item_id] = [ev.audio_start_ms, ev.audio_start_ms]
            case rt.InputAudioBufferSpeechStoppedEvent():
                self.turn_ms.setdefault(ev.item_id, [ev.audio_end_ms, ev.audio_end_ms])[1] = ev.audio_end_ms
            case rt.ConversationItemInputAudioTranscriptionDeltaEvent():
                start, end = self.turn_ms.get(ev.item_id, [0, 0])
                end = max(end, start, round(buffer_end_ms) if end == start else end)
                first = ev.item_id not in self.hearing
                self.hearing.add(ev.item_id)
                delta = (" " if first and self.transcribed else "") + ev.delta
                self.transcribed = True
                return live.InputTranscriptDeltaEvent(delta=delta, start_ms=start, end_ms=end)
            case (
                rt.ConversationItemInputAudioTranscriptionCompletedEvent()
                | rt.ConversationItemInputAudioTranscriptionFailedEvent()
            ):
                self.turn_ms.pop(ev.item_id, None)  # the turn's transcript is complete: forget it
                self.hearing.discard(ev.item_id)
        return None
