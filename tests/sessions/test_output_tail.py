"""Regression: the G.711 output resampler's withheld tail is sent at the end of a response (it used to
be dropped: ``OutputEncoder.flush`` was never called)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import FRAME_SAMPLES, TtsFrame
from realtime_gw.sessions.events import (
    AudioDelivered,
    AwaitDelivery,
    Limits,
    ResponseAudio,
    ResponseFinished,
    Send,
    StartResponse,
)
from realtime_gw.sessions.realtime import RealtimeSession


def _client(s: RealtimeSession, raw: str) -> list[Any]:
    ev = rt.decode_client_event(raw)
    assert not isinstance(ev, rt.ErrorEvent), ev
    return s.handle(ev, 0.0)


def _tone(samples: int) -> bytes:
    return (np.sin(np.arange(samples) * 0.05) * 8000).astype("<i2").tobytes()


@pytest.mark.parametrize(("fmt", "rate"), [("audio/pcmu", 8000), ("audio/pcma", 8000), ("audio/pcm", 24000)])
def test_every_output_sample_is_sent_before_output_audio_done(fmt: str, rate: int) -> None:
    s = RealtimeSession("sess_tail", Limits())
    s.start(0.0)
    audio = {"input": {"turn_detection": None}, "output": {"format": {"type": fmt}}}
    _client(s, json.dumps({"type": "session.update", "session": {"audio": audio}}))
    _client(s, '{"type":"conversation.item.create","item":{"type":"message","role":"user",'
               '"content":[{"type":"input_text","text":"hi"}]}}')  # fmt: skip
    (start,) = [e for e in _client(s, '{"type":"response.create"}') if isinstance(e, StartResponse)]
    frames = [_tone(FRAME_SAMPLES)] * 7 + [_tone(1000)]  # the last TTS frame is short
    effects: list[Any] = []
    for pcm in frames:
        effects += s.handle(ResponseAudio(start.response_id, start.epoch, TtsFrame(pcm)), 0.0)
    effects += s.handle(ResponseFinished(start.response_id, start.epoch), 0.0)
    assert isinstance(effects[-1], AwaitDelivery)  # the tail goes out before the response may complete
    effects += s.handle(AudioDelivered(start.response_id, start.epoch), 0.0)
    events = [e.event for e in effects if isinstance(e, Send)]
    deltas = [ev for ev in events if isinstance(ev, rt.ResponseAudioDeltaEvent)]
    bytes_per_sample = 2 if fmt == "audio/pcm" else 1
    samples_in = 7 * FRAME_SAMPLES + 1000
    assert sum(len(d.delta) for d in deltas) // bytes_per_sample == round(samples_in * rate / 24000)
    assert [d.seq for d in deltas] == list(range(len(deltas)))
    done = next(i for i, ev in enumerate(events) if isinstance(ev, rt.ResponseAudioDoneEvent))
    assert events.index(deltas[-1]) < done
