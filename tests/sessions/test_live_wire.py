"""The GPT-Live output stream as written: continuous, on one clock, speech and silence alike."""

from __future__ import annotations

from realtime_gw.protocols import live
from realtime_gw.protocols import realtime as rt
from realtime_gw.sessions.live_wire import LiveWire
from tests.server.live_events import validate_live

RESOURCE = live.SessionResource(
    id="s", expires_at=1, model="gpt-live-1", status="active", audio=live.Audio(format=live.AudioPCM(rate=24000))
)


def wire(fmt: live.AudioFormat | None = None) -> LiveWire:
    w = LiveWire()
    resource = live.SessionResource(id="s", expires_at=1, model="m", status="active", audio=live.Audio(format=fmt or live.AudioPCM(rate=24000)))
    w.translate(live.SessionStartedEvent(event_id="e", session=resource), 10.0)
    return w


def speech(ms: int = 80) -> rt.ResponseAudioDeltaEvent:
    return rt.ResponseAudioDeltaEvent(
        response_id="r", item_id="i", output_index=0, content_index=0, delta=b"\x01\x02" * (24 * ms)
    )


def test_silence_fills_up_to_a_frame_ahead_of_the_clock_and_speech_follows_on() -> None:
    w = wire()
    assert [(f.start_ms, f.end_ms) for f in w.silence(10.0, speech_queued=False)] == [(0, 80)]
    assert w.silence(10.05, speech_queued=False) == []
    frames = w.silence(10.17, speech_queued=False)
    assert [(f.start_ms, f.end_ms) for f in frames] == [(80, 160), (160, 240)]
    assert all(f.delta == b"\0\0" * 1920 for f in frames)
    assert w.silence(10.3, speech_queued=True) == []  # speech is paced to its own slots
    spoken = w.translate(speech(), 10.3)
    assert isinstance(spoken, live.OutputAudioDeltaEvent) and (spoken.start_ms, spoken.end_ms) == (240, 320)
    text = w.translate(rt.ResponseAudioTranscriptDeltaEvent(response_id="r", item_id="i", output_index=0, content_index=0, delta="Hi", event_id="ev1"), 10.3)
    assert isinstance(text, live.OutputTranscriptDeltaEvent) and text.start_ms == 320
    again = w.translate(rt.ResponseAudioTranscriptDeltaEvent(response_id="r2", item_id="i", output_index=0, content_index=0, delta="Yes"), 11.0)
    assert again.delta == " Yes"  # a second answer still concatenates verbatim
    for ev in [*frames, spoken, text]:
        validate_live(live.encode_server_event(ev))
    assert len(w.silence(60.0, speech_queued=False)) == 25  # bounded catch-up


def test_other_realtime_events_are_not_written() -> None:
    w = wire()
    assert w.translate(rt.InputAudioBufferClearedEvent(), 10.0) is None


def test_16k_and_g711_streams() -> None:
    w = wire(live.AudioPCM(rate=16000))
    out = w.translate(speech(80), 10.0)
    assert len(out.delta) == 2 * 1280 and (out.start_ms, out.end_ms) == (0, 80)
    assert len(w.silence(10.2, False)[0].delta) == 2 * 1280
    w = wire(live.AudioPCMU(rate=8000))
    out = w.translate(rt.ResponseAudioDeltaEvent(response_id="r", item_id="i", output_index=0, content_index=0, delta=b"\x7f" * 640), 10.0)
    assert (out.start_ms, out.end_ms) == (0, 80)
    assert w.silence(10.2, False)[0].delta == b"\xff" * 640
