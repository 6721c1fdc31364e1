"""The GPT-Live output stream as it is written: one continuous audio stream on the session clock.

The transport's outbox paces and purges the realtime session's audio as it does for ``/v1/realtime``;
this object turns each event it writes into its GPT-Live form (or drops it) and keeps the stream's
position: every ``session.output_audio.delta`` starts where the previous one ended, speech or
silence. When no speech is queued and the stream falls behind the session clock, ``silence``
fills the gap, so the client hears (and can record) a real-time stream. Output transcript fragments
are placed where the speech they go with starts. Pure: the clock is passed in.
"""

from __future__ import annotations

from realtime_gw.protocols import live
from realtime_gw.protocols import realtime as rt
from realtime_gw.protocols.audio import FRAME_SAMPLES, OUTPUT_RATE, resample
from realtime_gw.sessions.stream_clock import StreamClock

FRAME_MS = FRAME_SAMPLES * 1000 / OUTPUT_RATE
SILENCE_LEAD_MS = FRAME_MS
"""Silence is written one frame ahead of the clock: a client playing the stream in real time has each
frame before its time comes (the filler wakes every half frame)."""
MAX_SILENCE_FRAMES = 25
"""At most this much silence (2 s) at once: a stalled writer catches up, it does not flood."""


class LiveWire:
    def __init__(self) -> None:
        self.format: live.AudioFormat = live.AudioPCM(rate=24000)
        self.clock = StreamClock(FRAME_MS, MAX_SILENCE_FRAMES)
        """Started when ``session.started`` is written (0 on the session clock); its position is the
        audio written (or queued as silence) so far."""
        self.spoke = False

    def translate(self, event: object, now: float) -> live.ServerEvent | None:
        """The GPT-Live event to write for ``event``, or None when the protocol has none."""
        out = self._translate(event, now)
        if out is not None:
            out.server_event_seq = None  # the outbox's counter is not a field of this protocol
        return out

    def _translate(self, event: object, now: float) -> live.ServerEvent | None:
        match event:
            case live.SessionStartedEvent():
                self.clock.start(now)
                assert event.session.audio is not None and event.session.audio.format is not None
                self.format = event.session.audio.format
                return event
            case rt.ResponseAudioDeltaEvent():
                pcm = event.delta
                if isinstance(self.format, live.AudioPCM) and self.format.rate != OUTPUT_RATE:
                    pcm = resample(pcm, OUTPUT_RATE, self.format.rate)
                return self._place(live.OutputAudioDeltaEvent(delta=pcm), self._ms(pcm))
            case rt.ResponseAudioTranscriptDeltaEvent():
                delta = event.delta
                if self.spoke and not delta.startswith(" "):
                    delta = " " + delta  # a new answer: the fragments still concatenate verbatim
                self.spoke = True
                at = round(self.clock.position_ms)
                return live.OutputTranscriptDeltaEvent(event_id=event.event_id, delta=delta, start_ms=at, end_ms=at)
            case live.ServerEvent():
                return event
        return None

    def silence(self, now: float, speech_queued: bool) -> list[live.OutputAudioDeltaEvent]:
        """Silence frames that bring the stream up to one frame ahead of the session clock (none while
        speech is queued: it is paced to its own slots)."""
        if speech_queued:
            return []
        frames = self.clock.frames_behind(now, slack_ms=-SILENCE_LEAD_MS)
        return [self._place(live.OutputAudioDeltaEvent(delta=self._silent_frame()), FRAME_MS) for _ in range(frames)]

    def _place(self, event: live.OutputAudioDeltaEvent, ms: float) -> live.OutputAudioDeltaEvent:
        at = self.clock.advance(ms)
        event.start_ms, event.end_ms = round(at), round(at + ms)
        return event

    def _ms(self, data: bytes) -> float:
        if isinstance(self.format, live.AudioPCM):
            return len(data) / 2 / self.format.rate * 1000
        return len(data) / 8.0  # G.711: one byte a sample at 8 kHz

    def _silent_frame(self) -> bytes:
        if isinstance(self.format, live.AudioPCM):
            return b"\0\0" * round(self.format.rate * FRAME_MS / 1000)
        byte = b"\xff" if isinstance(self.format, live.AudioPCMU) else b"\xd5"
        return byte * round(8000 * FRAME_MS / 1000)
