"""Out-of-band responses (``conversation: "none"``) beside the live one: each its own id, phases and
single response.done; no error for a well-behaved client."""

from __future__ import annotations

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import TtsFrame
from realtime_gw.sessions.events import (
    CancelResponse,
    ResponseAudio,
    ResponseFinished,
    ResponseTextDelta,
    Send,
)
from tests.sessions.realtime_helpers import FRAME, client, errors, events, respond, say, session


def test_two_out_of_band_responses_while_one_is_live() -> None:
    s = session()
    say(s, "Tell me a story.")
    main, _ = respond(s)
    s.handle(ResponseAudio(main.response_id, main.epoch, TtsFrame(FRAME, text="Once.")), 0)
    a, created_a = respond(s, conversation="none", output_modalities=["text"], instructions="Classify.")
    b, created_b = respond(s, conversation="none", output_modalities=["text"], metadata={"topic": "x"})
    assert errors(created_a + created_b) == []
    assert len({main.response_id, a.response_id, b.response_id}) == 3
    text = events(s.handle(ResponseTextDelta(a.response_id, a.epoch, "story"), 0))
    assert [ev.response_id for ev in text if isinstance(ev, rt.ResponseTextDeltaEvent)] == [a.response_id]
    done_a = events(s.handle(ResponseFinished(a.response_id, a.epoch), 0))
    (done,) = [ev for ev in done_a if isinstance(ev, rt.ResponseDoneEvent)]
    assert done.response.id == a.response_id and done.response.conversation_id is None
    assert done.response.output[0].content[0].text == "story"
    assert s.response is not None and s.response.id == main.response_id, "the main response goes on"
    # cancelling the out-of-band one by id leaves the main one alone
    out = client(s, {"type": "response.cancel", "response_id": b.response_id})
    assert [c.response_id for c in out if isinstance(c, CancelResponse)] == [b.response_id]
    assert s.response is not None
    assert a.response_id not in s.side and b.response_id not in s.side
    # its items never joined the conversation
    assert all(e.response_id == main.response_id or e.response_id is None for e in s.conversation.entries())


def test_closing_ends_every_response_once() -> None:
    s = session()
    say(s, "hi")
    respond(s)
    respond(s, conversation="none", output_modalities=["text"])
    out = s.close()  # (nobody reads these: the reason, client_disconnected, is not a GA one)
    dones = [e.event for e in out if isinstance(e, Send) and isinstance(e.event, rt.ResponseDoneEvent)]
    assert len(dones) == 2 and {d.response.status for d in dones} == {"cancelled"}


def test_an_out_of_band_response_moves_aside_for_an_in_conversation_one() -> None:
    s = session(output_modalities=["text"])
    say(s, "hi")
    oob, _ = respond(s, conversation="none")
    main, created = respond(s)
    assert errors(created) == [] and s.response is not None and s.response.id == main.response_id
    assert oob.response_id in s.side
    s.handle(ResponseTextDelta(oob.response_id, oob.epoch, "summary"), 0)
    out = events(s.handle(ResponseFinished(oob.response_id, oob.epoch), 0))
    (done,) = [ev for ev in out if isinstance(ev, rt.ResponseDoneEvent)]
    assert done.response.id == oob.response_id and done.response.status == "completed"
    assert s.response is not None and s.response.id == main.response_id
