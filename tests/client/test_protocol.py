"""ClientState and the client codec, fed synthetic server events. Pure, no I/O."""

from __future__ import annotations

import msgspec

from realtime_gw.client.protocol import (
    ClientState,
    PlaybackAckEvent,
    UnknownEvent,
    auth_headers,
    decode_server_event,
    encode_client_event,
    input_session,
    pace_delay,
    pcm_chunks,
    realtime_connect_options,
    realtime_url,
    session_update,
    text_turn,
    ws_url,
)
from realtime_gw.protocols import realtime as rt

REF = {"response_id": "resp_1", "item_id": "item_1"}


def roundtrip(ev: rt.ServerEvent) -> rt.ServerEvent | UnknownEvent:
    return decode_server_event(rt.encode_server_event(ev))


def audio(seq: int) -> rt.ResponseAudioDeltaEvent:
    return rt.ResponseAudioDeltaEvent(**REF, delta=b"\x00\x00" * 1920, seq=seq)


def test_decodes_every_server_event_and_keeps_unknown_ones_raw() -> None:
    ev = roundtrip(audio(3))
    assert isinstance(ev, rt.ResponseAudioDeltaEvent) and ev.seq == 3 and len(ev.delta) == 3840
    created = roundtrip(
        rt.SessionCreatedEvent(session=rt.SessionOut(id="s", capabilities={"supports_playback_ack": True}))
    )
    assert isinstance(created, rt.SessionCreatedEvent)
    unknown = decode_server_event(b'{"type": "duplex.turn", "state": "listening"}')
    assert isinstance(unknown, UnknownEvent) and unknown.raw["state"] == "listening"
    extra = decode_server_event(b'{"type": "input_audio_buffer.cleared", "event_id": "e", "future_field": 1}')
    assert isinstance(extra, rt.InputAudioBufferClearedEvent), "additive fields never break decoding"


def test_client_events_encode_as_the_server_expects() -> None:
    raw = encode_client_event(session_update(input_session(16000)))
    decoded = rt.decode_client_event(raw)
    assert isinstance(decoded, rt.SessionUpdateEvent)
    assert decoded.event_id and decoded.event_id.startswith("evt_")
    ack = msgspec.json.decode(encode_client_event(PlaybackAckEvent(response_id="r", played_ms=120)))
    assert ack["type"] == "playback.ack" and ack["played_ms"] == 120 and ack["response_id"] == "r"


def test_tracks_replies_seq_gaps_and_lateness() -> None:
    st = ClientState()
    st.feed(
        rt.SessionCreatedEvent(session=rt.SessionOut(id="s", capabilities={"supports_playback_ack": True})),
        0.0,
    )
    assert st.supports_playback_ack
    st.feed(rt.InputAudioBufferSpeechStoppedEvent(audio_end_ms=900, item_id="u1"), 1.0)
    st.feed(rt.ResponseCreatedEvent(response=rt.Response(id="resp_1")), 1.1)
    st.feed(
        rt.ResponseOutputItemAddedEvent(response_id="resp_1", output_index=0, item=rt.Item(id="item_1")), 1.1
    )
    st.feed(audio(0), 1.5)
    st.feed(audio(1), 1.55)  # early: fine
    st.feed(audio(1), 1.6)  # duplicate
    st.feed(audio(3), 1.5 + 3 * 0.08 + 0.05)  # seq 2 lost; 50 ms behind its slot
    st.feed(rt.ResponseAudioTranscriptDeltaEvent(**REF, delta="hi"), 1.8)
    reply = st.feed(rt.ResponseDoneEvent(response=rt.Response(id="resp_1", status="completed")), 2.0)
    assert reply is not None and reply.done and reply.status == "completed"
    assert reply.item_id == "item_1" and reply.transcript == "hi"
    assert (reply.frames, reply.seqs_lost, reply.seqs_duplicated, reply.next_seq) == (3, 1, 1, 4)
    assert abs(reply.max_lateness_ms - 50) < 1e-6
    assert abs((reply.time_to_first_audio or 0) - 0.4) < 1e-9
    assert abs((reply.turn_latency or 0) - 0.5) < 1e-9
    assert reply.audio is not None and len(reply.audio) == 3 * 3840
    assert st.current is None and st.last is reply and st.responses_done == 1


def test_urls_auth_and_connect_options_shared_by_every_transport() -> None:
    assert ws_url("http://h:8000", "/v1/realtime") == "ws://h:8000/v1/realtime"
    assert ws_url("https://h", "/x", a="1", b="") == "wss://h/x?a=1", "empty query values are left out"
    assert ws_url("h:9", "/x") == "ws://h:9/x", "a bare host:port is a ws URL"
    assert ws_url("ws://h/custom?k=v", "/x", a="1") == "ws://h/custom?k=v&a=1", "a given path and query stay"
    assert realtime_url("http://h", "m", duplex=True) == "ws://h/v1/realtime?model=m&duplex=1"
    assert realtime_url("http://h") == "ws://h/v1/realtime"
    assert auth_headers(None) is None and auth_headers("") is None
    assert auth_headers("k") == {"Authorization": "Bearer k"}
    assert auth_headers("k", "Api-Key") == {"Authorization": "Api-Key k"}
    opts = realtime_connect_options("k", 3.0)
    assert opts["subprotocols"] == ["realtime"] and opts["max_size"] is None and opts["open_timeout"] == 3.0
    assert opts["additional_headers"] == {"Authorization": "Bearer k"}


def test_pacing_is_an_absolute_real_time_schedule() -> None:
    pcm = b"\x01\x00" * 1000  # 1000 samples at 16 kHz: 20 ms chunks of 320 samples, the last shorter
    assert [len(c) for c in pcm_chunks(pcm, 16000, 20)] == [640, 640, 640, 80]
    assert b"".join(pcm_chunks(pcm, 16000, 20)) == pcm
    # chunk n leaves at start + n x 20 ms: a late wake-up shortens the next wait instead of drifting
    assert abs(pace_delay(10.0, 1, 20, 1.0, now=10.0) - 0.02) < 1e-9
    assert abs(pace_delay(10.0, 2, 20, 1.0, now=10.025) - 0.015) < 1e-9
    assert pace_delay(10.0, 2, 20, 1.0, now=10.05) == 0.0, "behind schedule: no wait, never negative"
    assert abs(pace_delay(10.0, 2, 20, 2.0, now=10.0) - 0.02) < 1e-9, "speed 2 halves the schedule"
    assert pace_delay(10.0, 5, 20, 0.0, now=10.0) == 0.0, "speed 0 is unpaced"


def test_text_turn_is_the_message_then_the_response_request() -> None:
    item, create = text_turn("hello")
    assert isinstance(item, rt.ConversationItemCreateEvent) and isinstance(create, rt.ResponseCreateEvent)
    assert item.item.content is not None and item.item.content[0].text == "hello"
