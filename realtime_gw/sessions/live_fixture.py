"""``session.output_audio.fixture.play``: a client's clip played into the output stream.

The clip (raw PCM16 at 24 kHz, at most 30 s) travels in a lane of its own in the outbox, paced as the
voice is; the face interrupts the voice first and keeps the input muted until the clip has left
(``fixture.played`` when the outbox reports its last frame written). One fixture at a time. Pure.
"""

from __future__ import annotations

from realtime_gw.protocols import live
from realtime_gw.protocols import realtime as rt
from realtime_gw.protocols.audio import FRAME_SAMPLES, OUTPUT_RATE, OutputEncoder
from realtime_gw.sessions.events import AudioDelivered, AwaitDelivery, Effect, Ids, PlaybackStarted

MAX_FIXTURE_S = 30
FRAME_BYTES = FRAME_SAMPLES * 2


class FixtureError(ValueError):
    pass


class Fixture:
    def __init__(self, ids: Ids) -> None:
        self.ids = ids
        self.playing: str | None = None
        """The lane id of the clip being played, while one is."""
        self.client_event_id: str | None = None

    def check(self, pcm: bytes) -> None:
        if self.playing is not None:
            raise FixtureError("A fixture is already playing; only one can be active")
        if not pcm or len(pcm) % 2:
            raise FixtureError("audio must be non-empty PCM16 (an even number of bytes)")
        if len(pcm) > MAX_FIXTURE_S * OUTPUT_RATE * 2:
            raise FixtureError(f"audio is longer than {MAX_FIXTURE_S} s of 24 kHz PCM16")

    def play(self, ev: live.OutputAudioFixturePlayEvent, output_format: str) -> list[Effect]:
        """The clip's frames in their own lane, then a wait for their delivery (``check`` first)."""
        lane = self.playing = self.ids.new("fixture")
        self.client_event_id = ev.event_id
        encoder = OutputEncoder(output_format)
        out: list[Effect] = [self.ids.send(live.OutputAudioFixturePlayingEvent(client_event_id=ev.event_id))]
        for seq, pos in enumerate(range(0, len(ev.audio), FRAME_BYTES)):
            pcm = ev.audio[pos : pos + FRAME_BYTES]
            last = pos + FRAME_BYTES >= len(ev.audio)
            data = encoder.encode(pcm) + (encoder.flush() if last else b"")
            delta = rt.ResponseAudioDeltaEvent(
                response_id=lane, item_id=lane, output_index=0, content_index=0, delta=data, seq=seq
            )
            out.append(self.ids.send(delta, response_id=lane, audio_ms=len(pcm) / 2 / OUTPUT_RATE * 1000))
        return [*out, AwaitDelivery(lane, 0)]

    def owns(self, event: object) -> bool:
        """A notice of the outbox about the clip (not the realtime session's business)."""
        return isinstance(event, AudioDelivered | PlaybackStarted) and event.response_id == self.playing

    def notice(self, event: AudioDelivered | PlaybackStarted) -> list[Effect]:
        if isinstance(event, PlaybackStarted):
            return []
        self.playing = None
        return [self.ids.send(live.OutputAudioFixturePlayedEvent(client_event_id=self.client_event_id))]
