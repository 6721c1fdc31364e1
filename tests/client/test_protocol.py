"""ClientState and the client codec, fed synthetic server events. Pure, no I/O."""

from __future__ import annotations

import msgspec

from realtime_gw.client.protocol import (
    ClientState,
    PlaybackAckEvent,
    UnknownEvent,
    decode_server_event,
    encode_client_event,
    input_session,
    session_update,
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
