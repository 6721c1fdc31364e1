"""The input audio buffer on its own: decoding, bounds, the input-audio timeline."""

from __future__ import annotations

import base64

import pytest

from realtime_gw.protocols import audio
from realtime_gw.sessions.input_buffer import MIN_COMMIT_MS, InputBuffer, decode_audio_part
from realtime_gw.sessions.settings import SessionError

MS_24K = b"\x01\x00" * 24  # 1 ms of PCM16 at 24 kHz


def test_append_keeps_pcm_and_returns_what_vad_hears() -> None:
    b = InputBuffer(max_bytes=10_000)
    assert b.append(MS_24K * 10) == MS_24K * 10
    assert len(b) == 480 and b.end_ms == pytest.approx(10.0)


def test_g711_is_decoded_to_pcm_at_8khz() -> None:
    b = InputBuffer(max_bytes=10_000, input_format="audio/pcmu", rate=8000)
    pcm = b.append(b"\xff" * 80)  # 10 ms of mu-law
    assert pcm == audio.decode_input(b"\xff" * 80, "audio/pcmu") and len(pcm) == 160
    assert b.end_ms == pytest.approx(10.0)


def test_overflow_and_bad_audio_keep_nothing() -> None:
    b = InputBuffer(max_bytes=100)
    b.append(b"\0" * 100)
    with pytest.raises(SessionError) as full:
        b.append(b"\0\0")
    assert full.value.code == "input_audio_buffer_full" and len(b) == 100
    with pytest.raises(SessionError) as odd:
        InputBuffer(100).append(b"\0")  # half a sample
    assert odd.value.param == "audio"


def test_commit_needs_minimum_audio() -> None:
    b = InputBuffer(max_bytes=100_000)
    b.append(MS_24K * (MIN_COMMIT_MS - 1))
    with pytest.raises(SessionError) as e:
        b.check_commit()
    assert e.value.code == "input_audio_buffer_commit_empty"
    b.append(MS_24K)
    b.check_commit()


def test_take_moves_the_timeline() -> None:
    b = InputBuffer(max_bytes=100_000)
    b.append(MS_24K * 100)
    assert b.take(20.0, 50.0) == MS_24K * 30  # audio before 20 ms is dropped with it
    assert b.start_ms == pytest.approx(50.0) and b.end_ms == pytest.approx(100.0)
    b.drop_before(40.0)  # already gone: nothing happens
    assert b.start_ms == pytest.approx(50.0)
    b.drop_before(70.0)
    assert b.start_ms == pytest.approx(70.0) and len(b) == 30 * 48
    b.clear()
    assert len(b) == 0 and b.start_ms == pytest.approx(100.0) == b.end_ms


def test_reformat_drops_audio_of_the_old_format() -> None:
    b = InputBuffer(max_bytes=100_000)
    b.append(MS_24K * 10)
    assert not b.reformat("audio/pcm", 24000) and len(b) == 480
    assert b.reformat("audio/pcm", 16000) and len(b) == 0
    assert b.append(b"\0\0" * 16) and b.end_ms == pytest.approx(1.0)


def test_audio_parts_of_items_decode_or_name_the_field() -> None:
    assert decode_audio_part(base64.b64encode(b"\1\0\2\0").decode(), "audio/pcm") == b"\1\0\2\0"
    with pytest.raises(SessionError) as e:
        decode_audio_part("not base64!", "audio/pcm")
    assert e.value.param == "item.content.audio"
