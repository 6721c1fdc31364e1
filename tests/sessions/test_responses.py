"""The response lifecycle: named phases, illegal transitions, a refused start, stale results, and
exactly one response.done."""

from __future__ import annotations

from typing import Any

import pytest

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import TtsFrame
from realtime_gw.sessions.conversation import Conversation
from realtime_gw.sessions.duplex import Playbacks
from realtime_gw.sessions.events import (
    AudioDelivered,
    AwaitDelivery,
    Ids,
    ResponseAudio,
    ResponseFinished,
    ResponseRefused,
    ResponseTextDelta,
    StartResponse,
    Transcribe,
    TranscriptionDone,
)
from realtime_gw.sessions.response_lifecycle import Phase, ResponsePhaseError, Responses
from realtime_gw.sessions.settings import SessionSettings
from tests.sessions.realtime_helpers import (
    FRAME,
    decode,
    kinds,
    new_session,
    of,
    sent,
    start_response,
    user_text,
)


def dones(effects: list[Any]) -> list[rt.ResponseDoneEvent]:
    return [ev for ev in sent(effects) if isinstance(ev, rt.ResponseDoneEvent)]


def test_phases_of_a_spoken_turn() -> None:
    s = new_session()
    assert s.responses.phase is Phase.IDLE
    s.handle(rt.InputAudioBufferAppendEvent(audio=b"\x00\x00" * 4800), 0)
    item_id = of(s.handle(decode('{"type":"input_audio_buffer.commit"}'), 0), Transcribe)[0].item_id
    s.handle(decode('{"type":"response.create"}'), 0)
    assert s.responses.phase is Phase.WAITING, "waits for the user's transcript"
    (start,) = of(s.handle(TranscriptionDone(item_id, "hello"), 0), StartResponse)
    assert s.responses.phase is Phase.GENERATING
    s.handle(ResponseAudio(start.response_id, start.epoch, TtsFrame(FRAME, text="Hi.")), 0)
    assert s.handle(ResponseFinished(start.response_id, start.epoch), 0) == [
        AwaitDelivery(start.response_id, start.epoch)
    ]
    assert s.responses.phase is Phase.DELIVERING
    assert (
        dones(s.handle(AudioDelivered(start.response_id, start.epoch), 0))[0].response.status == "completed"
    )
    assert s.responses.phase is Phase.IDLE and s.response is None
    s.close()
    assert s.responses.phase is Phase.CLOSED and s.closed


def test_illegal_transitions_raise_a_clear_error() -> None:
    responses = Responses(Ids("sess_unit"), Conversation(8), Playbacks(), frozenset({"default"}), "conv_unit")
    with pytest.raises(ResponsePhaseError, match="cannot cancel"):
        responses.cancel("client_cancelled")
    responses.close()
    with pytest.raises(
        ResponsePhaseError, match=r"cannot create a response while the response slot is closed"
    ):
        responses.create(rt.ResponseParams(), SessionSettings())
    with pytest.raises(ResponsePhaseError, match="closed -> closed is not a transition"):
        responses.close()


def test_results_the_phase_does_not_expect_are_stale() -> None:
    s = new_session()
    user_text(s, "hi")
    start = start_response(s)
    r, e = start.response_id, start.epoch
    assert s.handle(AudioDelivered(r, e), 0) == [], "nothing was awaited yet"
    s.handle(ResponseAudio(r, e, TtsFrame(FRAME)), 0)
    s.handle(ResponseFinished(r, e), 0)
    # generation is over: late frames, text or a second finish are not the worker's to send
    assert s.handle(ResponseAudio(r, e, TtsFrame(FRAME)), 0) == []
    assert s.handle(ResponseTextDelta(r, e, "late"), 0) == []
    assert s.handle(ResponseFinished(r, e, error="late"), 0) == []
    assert s.handle(ResponseRefused(r, e, "late"), 0) == []
    assert len(dones(s.handle(AudioDelivered(r, e), 0))) == 1


# -- NoFreeSlot at the start of a response -------------------------------------------------------------
def test_a_refused_start_fails_the_response_as_server_busy_with_one_done() -> None:
    s = new_session()
    user_text(s, "hi")
    start = start_response(s)
    out = s.handle(
        ResponseRefused(start.response_id, start.epoch, "tts-tone: no free slot (8 requests active)"), 0
    )
    err = sent(out)[0]
    assert isinstance(err, rt.ErrorEvent)
    assert err.error.code == "server_busy" and err.error.type == "server_error"
    (done,) = dones(out)
    assert done.response.status == "failed"
    assert done.response.status_details is not None and done.response.status_details.error is not None
    assert done.response.status_details.error["code"] == "server_busy"
    assert kinds(out)[-2:] == ["response.done", "rate_limits.updated"]
    assert s.responses.phase is Phase.IDLE
    # whatever the transport might still report for it is stale; the session goes on
    assert s.handle(ResponseFinished(start.response_id, start.epoch), 0) == []
    assert s.handle(ResponseRefused(start.response_id, start.epoch, "again"), 0) == []
    again = start_response(s)
    done_again = s.handle(ResponseFinished(again.response_id, again.epoch), 0)
    assert [d.response.status for d in dones(done_again)] == ["completed"]


def test_a_refusal_of_a_cancelled_epoch_is_stale() -> None:
    s = new_session()
    user_text(s, "hi")
    start = start_response(s)
    s.handle(decode('{"type":"response.cancel"}'), 0)
    assert s.handle(ResponseRefused(start.response_id, start.epoch, "no free slot"), 0) == []


# -- found while carving -----------------------------------------------------------------------------
def test_out_of_band_input_is_the_context_even_when_the_output_joins_the_conversation() -> None:
    s = new_session()
    user_text(s, "in the conversation")
    raw = (
        '{"type":"response.create","response":{"instructions":"Be brief.","input":'
        '[{"type":"message","role":"user","content":[{"type":"input_text","text":"out of band"}]}]}}'
    )
    (start,) = of(s.handle(decode(raw), 0), StartResponse)
    assert [(m.role, m.content) for m in start.messages] == [("system", "Be brief."), ("user", "out of band")]


def test_a_system_item_is_not_taken_for_the_instructions() -> None:
    s = new_session()
    s.handle(
        decode(
            '{"type":"conversation.item.create","item":{"type":"message","role":"system","content":[{"type":"input_text","text":"Rule."}]}}'
        ),
        0,
    )
    user_text(s, "hi")
    start = start_response(s)
    assert [(m.role, m.content) for m in start.messages] == [("system", "Rule."), ("user", "hi")]


def test_g711_output_ends_with_the_resampler_tail() -> None:
    s = new_session()
    s.handle(
        decode('{"type":"session.update","session":{"audio":{"output":{"format":{"type":"audio/pcmu"}}}}}'), 0
    )
    user_text(s, "hi")
    start = start_response(s)
    frames = [s.handle(ResponseAudio(start.response_id, start.epoch, TtsFrame(FRAME)), 0) for _ in range(3)]
    finished = s.handle(ResponseFinished(start.response_id, start.epoch), 0)
    deltas = [
        ev for out in [*frames, finished] for ev in sent(out) if isinstance(ev, rt.ResponseAudioDeltaEvent)
    ]
    assert [d.seq for d in deltas] == [0, 1, 2, 3], "the tail is one more delta, in sequence"
    assert sum(len(d.delta) for d in deltas) == 3 * 640  # 3 x 80 ms at 8 kHz, nothing withheld
    assert finished[-1] == AwaitDelivery(start.response_id, start.epoch)
