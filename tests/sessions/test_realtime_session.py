"""Session rules on the pure state machine: events in, effects out, no server, no models."""

from __future__ import annotations

import pytest

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import TtsFrame, VadProbs
from realtime_gw.sessions.events import (
    AudioDelivered,
    AwaitDelivery,
    CancelResponse,
    FeedAsr,
    Limits,
    PurgeAudio,
    ResponseAudio,
    ResponseFinished,
    ResponseTextDelta,
    StartAsr,
    StartResponse,
    StartVad,
    StopVad,
    Tick,
    Transcribe,
    TranscriptionDone,
    VadResult,
)
from realtime_gw.sessions.realtime import RealtimeSession
from tests.sessions.realtime_helpers import (
    FRAME,
    decode,
    done_of,
    kinds,
    new_session,
    of,
    sent,
    start_response,
    user_text,
)


def test_start_sends_session_created_and_default_vad() -> None:
    s = RealtimeSession("sess_x", Limits())
    effects = s.start(0.0)
    assert kinds(effects) == ["session.created"]
    assert of(effects, StartVad)[0].sample_rate == 24000


def test_manual_mode_stops_vad_and_echoes_null_turn_detection() -> None:
    s = RealtimeSession("sess_x", Limits())
    s.start(0.0)
    effects = s.handle(
        decode('{"type":"session.update","session":{"audio":{"input":{"turn_detection":null}}}}'), 0
    )
    assert of(effects, StopVad)
    (updated,) = sent(effects)
    assert updated.session.audio["input"]["turn_detection"] is None  # type: ignore[attr-defined]


def test_text_turn_lifecycle_and_single_response_done() -> None:
    s = new_session()
    assert kinds(user_text(s, "hello there")) == ["conversation.item.added", "conversation.item.done"]
    effects = s.handle(decode('{"type":"response.create"}'), 0.0)
    start = of(effects, StartResponse)[0]
    assert start.messages[-1].content == "hello there" and start.audio
    assert kinds(effects)[0] == "response.created"
    out = s.handle(ResponseAudio(start.response_id, start.epoch, TtsFrame(FRAME, text="Hello there.")), 0)
    assert kinds(out) == ["response.output_audio_transcript.delta", "response.output_audio.delta"]
    delta = sent(out)[1]
    assert delta.delta == FRAME and delta.seq == 0  # type: ignore[attr-defined]
    generated = s.handle(ResponseFinished(start.response_id, start.epoch), 0)
    assert generated == [AwaitDelivery(start.response_id, start.epoch)], "live until its audio is out"
    done = s.handle(AudioDelivered(start.response_id, start.epoch), 0)
    assert kinds(done)[-2:] == ["response.done", "rate_limits.updated"]
    assert done_of(done).response.status == "completed"
    # a late duplicate finish is stale and ignored
    assert s.handle(AudioDelivered(start.response_id, start.epoch), 0) == []


def test_second_response_create_while_active_is_an_error() -> None:
    s = new_session()
    user_text(s, "hi")
    start_response(s)
    effects = s.handle(decode('{"type":"response.create","event_id":"e7"}'), 0)
    (err,) = sent(effects)
    assert err.error.code == "conversation_already_has_active_response"  # type: ignore[attr-defined]
    assert err.error.event_id == "e7"  # type: ignore[attr-defined]


def test_cancel_makes_results_stale_and_sends_one_done() -> None:
    s = new_session()
    user_text(s, "hi")
    start = start_response(s)
    effects = s.handle(decode('{"type":"response.cancel"}'), 0)
    assert of(effects, CancelResponse) and of(effects, PurgeAudio)
    assert kinds(effects).count("response.done") == 1
    assert done_of(effects).response.status == "cancelled"
    # frames and the finish of the cancelled epoch are dropped
    assert s.handle(ResponseAudio(start.response_id, start.epoch, TtsFrame(FRAME)), 0) == []
    assert s.handle(ResponseFinished(start.response_id, start.epoch), 0) == []
    # cancelling again (a client's cancel racing the end) is no error and no second response.done
    assert s.handle(decode('{"type":"response.cancel"}'), 0) == []
    assert s.handle(decode(f'{{"type":"response.cancel","response_id":"{start.response_id}"}}'), 0) == []
    assert kinds(s.handle(decode('{"type":"response.cancel","response_id":"resp_other"}'), 0)) == ["error"]


def test_failed_response_reports_failed_status() -> None:
    s = new_session()
    user_text(s, "hi")
    start = start_response(s)
    done = s.handle(ResponseFinished(start.response_id, start.epoch, error="tts crashed"), 0)
    assert done_of(done).response.status == "failed"


def test_text_only_modality_streams_text() -> None:
    s = new_session()
    s.handle(decode('{"type":"session.update","session":{"output_modalities":["text"]}}'), 0)
    user_text(s, "hi")
    start = start_response(s)
    assert not start.audio
    out = s.handle(ResponseTextDelta(start.response_id, start.epoch, "hi"), 0)
    assert kinds(out) == ["response.output_text.delta"]
    done = s.handle(ResponseFinished(start.response_id, start.epoch), 0)
    assert "response.output_text.done" in kinds(done)


def test_buffer_commit_rules() -> None:
    s = new_session()
    assert sent(s.handle(decode('{"type":"input_audio_buffer.commit"}'), 0))[0].error.code == (  # type: ignore[attr-defined]
        "input_audio_buffer_commit_empty"
    )
    pcm = b"\x00\x00" * 2400  # 100 ms at 24 kHz
    append = rt.InputAudioBufferAppendEvent(audio=pcm)
    # The client commits turns: the turn's transcription hears it from its first append.
    start, feed = s.handle(append, 0)
    assert isinstance(start, StartAsr) and feed == FeedAsr(start.item_id, pcm)
    effects = s.handle(decode('{"type":"input_audio_buffer.commit"}'), 0)
    assert kinds(effects)[0] == "input_audio_buffer.committed"
    (tr,) = of(effects, Transcribe)
    assert tr.pcm == pcm and tr.sample_rate == 24000
    assert tr.streamed and tr.item_id == start.item_id
    assert len(s.buffer) == 0


def test_buffer_is_bounded() -> None:
    s = new_session()
    big = rt.InputAudioBufferAppendEvent(audio=b"\x00" * (48000 * 10 + 2), event_id="big")
    (err,) = sent(s.handle(big, 0))
    assert err.error.code == "input_audio_buffer_full" and err.error.event_id == "big"  # type: ignore[attr-defined]
    assert len(s.buffer) == 0


def test_response_waits_for_transcript_of_committed_audio() -> None:
    s = new_session()
    s.handle(rt.InputAudioBufferAppendEvent(audio=b"\x00\x00" * 4800), 0)
    commit = s.handle(decode('{"type":"input_audio_buffer.commit"}'), 0)
    item_id = of(commit, Transcribe)[0].item_id
    effects = s.handle(decode('{"type":"response.create"}'), 0)
    assert not of(effects, StartResponse), "must wait for the transcript"
    out = s.handle(TranscriptionDone(item_id, "open the door"), 0)
    (start,) = of(out, StartResponse)
    assert start.messages[-1].content == "open the door"


def test_server_vad_turn_commits_and_creates_response() -> None:
    s = RealtimeSession("sess_v", Limits())
    s.start(0.0)
    s.handle(rt.InputAudioBufferAppendEvent(audio=b"\x00\x00" * 24000 * 3), 0)  # 3 s buffered
    probs = [0.0] * 10 + [0.9] * 30 + [0.0] * 20  # 32 ms windows: speech from 320 ms to 1280 ms
    effects = s.handle(VadResult(VadProbs(start_ms=0.0, window_ms=32.0, probs=probs), s.vad_stream), 0)
    k = kinds(effects)
    assert k[:2] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"]
    assert "input_audio_buffer.committed" in k and "response.created" in k
    started, stopped = sent(effects)[:2]
    assert started.audio_start_ms == 320  # type: ignore[attr-defined]
    assert stopped.audio_end_ms == 1280  # type: ignore[attr-defined]
    (tr,) = of(effects, Transcribe)
    # committed audio: prefix padding (300 ms) before the start up to the end of the silence window
    assert len(tr.pcm) == pytest.approx((1280 + 500 - 20 - 320 + 300) * 48, abs=48 * 40)


def test_vad_results_of_a_replaced_stream_are_dropped() -> None:
    s = RealtimeSession("sess_v", Limits())
    s.start(0.0)
    old = s.vad_stream
    s.handle(
        decode(
            '{"type":"session.update","session":{"audio":{"input":{"format":{"type":"audio/pcm","rate":16000}}}}}'
        ),
        0,
    )
    assert s.vad_stream != old
    assert s.handle(VadResult(VadProbs(0.0, 32.0, [0.9] * 5), old), 0) == []


def test_speech_during_response_interrupts_it() -> None:
    s = RealtimeSession("sess_v", Limits())
    s.start(0.0)
    user_text(s, "hi")
    start_response(s)
    effects = s.handle(VadResult(VadProbs(0.0, 32.0, [0.9] * 3), s.vad_stream), 0)
    assert of(effects, CancelResponse)
    done = [ev for ev in sent(effects) if isinstance(ev, rt.ResponseDoneEvent)]
    assert done[0].response.status == "cancelled"
    assert done[0].response.status_details.reason == "turn_detected"  # type: ignore[union-attr]


def test_idle_timeout_triggers_a_response() -> None:
    s = RealtimeSession("sess_v", Limits(), now=0.0)
    s.start(0.0)
    s.handle(
        decode(
            '{"type":"session.update","session":{"audio":{"input":{"turn_detection":{"type":"server_vad","idle_timeout_ms":5000}}}}}'
        ),
        0,
    )
    assert s.handle(Tick(), 4.0) == []
    effects = s.handle(Tick(), 5.5)
    assert kinds(effects)[0] == "input_audio_buffer.timeout_triggered"
    assert "response.created" in kinds(effects)


def test_items_create_retrieve_delete_and_errors() -> None:
    s = new_session()
    added = sent(user_text(s, "one"))[0]
    item_id = added.item.id  # type: ignore[attr-defined]
    got = sent(s.handle(decode(f'{{"type":"conversation.item.retrieve","item_id":"{item_id}"}}'), 0))[0]
    assert got.item.content[0].text == "one"  # type: ignore[attr-defined]
    assert kinds(s.handle(decode(f'{{"type":"conversation.item.delete","item_id":"{item_id}"}}'), 0)) == [
        "conversation.item.deleted"
    ]
    err = sent(s.handle(decode('{"type":"conversation.item.delete","item_id":"nope"}'), 0))[0]
    assert err.error.code == "item_delete_invalid_item_id"  # type: ignore[attr-defined]
    err = sent(
        s.handle(decode('{"type":"conversation.item.create","item":{"type":"mcp_call","id":"m"}}'), 0)
    )[0]
    assert err.error.param == "item.type"  # type: ignore[attr-defined]
    err = sent(
        s.handle(
            decode(
                '{"type":"conversation.item.create","item":{"type":"message","role":"user","content":[{"type":"output_audio"}]}}'
            ),
            0,
        )
    )[0]
    assert err.error.param == "item.content[0].type"  # type: ignore[attr-defined]


def test_truncate_keeps_only_heard_words() -> None:
    s = new_session()
    user_text(s, "hi")
    start = start_response(s)
    r = start.response_id
    s.handle(ResponseAudio(r, start.epoch, TtsFrame(FRAME, text="One two three four.")), 0)
    for _ in range(9):
        s.handle(ResponseAudio(r, start.epoch, TtsFrame(FRAME)), 0)
    s.handle(ResponseAudio(r, start.epoch, TtsFrame(FRAME, text="Five six seven eight.")), 0)
    for _ in range(9):
        s.handle(ResponseAudio(r, start.epoch, TtsFrame(FRAME)), 0)
    s.handle(ResponseFinished(r, start.epoch), 0)
    s.handle(AudioDelivered(r, start.epoch), 0)
    item_id = s.conversation.entries()[-1].item.id
    # 1600 ms of audio: first sentence 0-800 ms, second 800-1600 ms; heard up to 1200 ms
    too_far = s.handle(
        decode(
            f'{{"type":"conversation.item.truncate","item_id":"{item_id}","content_index":0,"audio_end_ms":1700}}'
        ),
        0,
    )
    assert sent(too_far)[0].audio_end_ms == 1600, "clamped to the audio generated, not refused"  # type: ignore[attr-defined]
    ok = s.handle(
        decode(
            f'{{"type":"conversation.item.truncate","item_id":"{item_id}","content_index":0,"audio_end_ms":1200}}'
        ),
        0,
    )
    assert kinds(ok) == ["conversation.item.truncated"]
    assert s.conversation.get(item_id).item.content[0].transcript == "One two three four. Five six"
    user_item = s.conversation.entries()[0].item.id
    err = s.handle(
        decode(
            f'{{"type":"conversation.item.truncate","item_id":"{user_item}","content_index":0,"audio_end_ms":0}}'
        ),
        0,
    )
    assert sent(err)[0].error.code == "invalid_item"  # type: ignore[attr-defined]


def test_unsupported_formats_are_rejected_without_changing_state() -> None:
    s = new_session()
    err = sent(
        s.handle(
            decode(
                '{"type":"session.update","session":{"audio":{"input":{"format":{"type":"audio/pcm","rate":44100}}}}}'
            ),
            0,
        )
    )[0]
    assert err.error.param == "session.audio.input.format"  # type: ignore[attr-defined]
    assert s.settings.input_rate == 24000
    err = sent(
        s.handle(
            decode(
                '{"type":"session.update","session":{"audio":{"output":{"format":{"type":"audio/opus"}}}}}'
            ),
            0,
        )
    )[0]
    assert err.error.param == "session.audio.output.format.type"  # type: ignore[attr-defined]


def test_g711_output_is_encoded_at_8khz() -> None:
    s = new_session()
    s.handle(
        decode('{"type":"session.update","session":{"audio":{"output":{"format":{"type":"audio/pcmu"}}}}}'), 0
    )
    user_text(s, "hi")
    start = start_response(s)
    out = s.handle(ResponseAudio(start.response_id, start.epoch, TtsFrame(FRAME * 3)), 0)
    delta = sent(out)[0]
    assert delta.sample_rate_hz == 8000  # type: ignore[attr-defined]
    assert 0 < len(delta.delta) <= 3 * 640  # type: ignore[attr-defined]  # 1 byte per sample at 8 kHz


def test_close_cancels_live_response() -> None:
    s = new_session()
    user_text(s, "hi")
    start_response(s)
    effects = s.close()
    assert of(effects, CancelResponse) and of(effects, StopVad)
    assert s.handle(decode('{"type":"response.create"}'), 0) == []
