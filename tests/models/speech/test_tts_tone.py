"""Tone TTS (gateway-overhead backend) through a real StageWorker."""

from __future__ import annotations

from typing import Any

import numpy as np

from realtime_gw.models.speech.tts_tone import ToneTtsBackend
from realtime_gw.records.voice import FRAME_SAMPLES, TtsRequest


async def test_tone_frames(start_worker: Any) -> None:
    backend = ToneTtsBackend()
    backend.warmup()
    w = await start_worker(backend)
    s = w.submit(TtsRequest(voice="alloy"))
    s.push("! ")  # 1 char -> 60 ms, rounded up to one frame
    s.push("A much longer second sentence.")  # 30 chars -> 1.8 s
    s.close_input()
    frames = await s.collect()
    assert all(len(f.pcm) == 2 * FRAME_SAMPLES for f in frames[:-1]) and frames[-1].final
    assert [f.text for f in frames if f.text] == ["!", "A much longer second sentence."]
    pcm = np.frombuffer(b"".join(f.pcm for f in frames), dtype="<i2")
    assert len(pcm) == FRAME_SAMPLES + round(30 * 0.06 * 24000)
    # phase-continuous: no jump larger than one sample step of a 220 Hz tone at this amplitude
    assert np.abs(np.diff(pcm.astype(np.int32))).max() < 0.2 * 32768 * 2 * np.pi * 220 / 24000 + 2


async def test_tone_speed_and_empty(start_worker: Any) -> None:
    w = await start_worker(ToneTtsBackend())
    s = w.submit(TtsRequest(speed=2.0))
    s.push("x" * 100)
    s.close_input()
    frames = await s.collect()
    assert sum(len(f.pcm) for f in frames) // 2 == round(100 * 0.03 * 24000)
    empty = w.submit(TtsRequest())
    empty.close_input()
    [final] = await empty.collect()
    assert final.final and final.pcm == b""
