"""JitterBuffer: ordering, prebuffer, per-response playback position, barge-in flush. Pure, no I/O."""

from __future__ import annotations

import numpy as np

from realtime_gw.client.jitter import JitterBuffer

FRAME = 1920  # 80 ms at 24 kHz


def frame(value: int, n: int = FRAME) -> bytes:
    return np.full(n, value, dtype="<i2").tobytes()


def samples(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2")


def test_prebuffers_then_plays_in_order_and_tracks_position() -> None:
    jb = JitterBuffer(prebuffer_ms=120)
    assert jb.push("r1", 0, frame(1)) == "ok"
    assert not samples(jb.pull(480)).any(), "80 ms < 120 ms prebuffer: still silence"
    assert jb.played_ms("r1") == 0
    jb.push("r1", 1, frame(2))
    out = samples(jb.pull(FRAME + 480))
    assert (out[:FRAME] == 1).all() and (out[FRAME:] == 2).all()
    assert jb.played_ms("r1") == (FRAME + 480) / 24
    assert jb.current == "r1"
    assert jb.buffered_ms == (FRAME - 480) / 24


def test_reorders_and_counts_duplicates() -> None:
    jb = JitterBuffer(prebuffer_ms=0)
    assert jb.push("r", 1, frame(2)) == "gap"
    assert jb.push("r", 0, frame(1)) == "ok"
    assert jb.push("r", 0, frame(1)) == "duplicate"
    out = samples(jb.pull(2 * FRAME))
    assert (out[:FRAME] == 1).all() and (out[FRAME:] == 2).all()
    assert jb.stats("r") == (0, 1)


def test_a_hole_that_never_fills_is_skipped_and_counted() -> None:
    jb = JitterBuffer(prebuffer_ms=0, max_pending=2)
    jb.push("r", 0, frame(1))
    for seq in (2, 3, 4):  # seq 1 never comes
        jb.push("r", seq, frame(seq))
    assert jb.stats("r") == (1, 0)
    assert jb.received_ms("r") == 4 * 80


def test_end_plays_out_a_short_reply_below_the_prebuffer() -> None:
    jb = JitterBuffer(prebuffer_ms=200)
    jb.push("r", 0, frame(5, 240))
    assert not samples(jb.pull(240)).any()
    jb.end("r")
    assert (samples(jb.pull(240)) == 5).all()
    assert jb.finished() == ["r"]
    jb.forget("r")
    assert jb.current is None and jb.played_ms("r") == 0


def test_flush_drops_queued_audio_and_mutes_late_frames() -> None:
    jb = JitterBuffer(prebuffer_ms=0)
    for seq in range(5):
        jb.push("r", seq, frame(1))
    jb.pull(FRAME)
    jb.flush("r")
    assert jb.push("r", 5, frame(1)) == "muted", "frames still in flight after barge-in are not played"
    assert not samples(jb.pull(FRAME)).any()
    assert jb.played_ms("r") == 80
    assert jb.underruns == 0, "running dry after a flush is not an underrun"


def test_underrun_counted_when_a_live_reply_runs_dry() -> None:
    jb = JitterBuffer(prebuffer_ms=0)
    jb.push("r", 0, frame(1))
    jb.pull(2 * FRAME)
    assert jb.underruns == 1


def test_replies_play_back_to_back() -> None:
    jb = JitterBuffer(prebuffer_ms=0)
    jb.push("a", 0, frame(1))
    jb.end("a")
    jb.push("b", 0, frame(2))
    out = samples(jb.pull(2 * FRAME))
    assert (out[:FRAME] == 1).all() and (out[FRAME:] == 2).all()
    assert jb.played_ms("a") == jb.played_ms("b") == 80
