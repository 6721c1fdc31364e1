"""Interruptions as the frameworks make them never produce an error event: truncate before or
instead of response.cancel (content_index 0), cancel then truncate, truncate past the audio, and the
client's truncate 1-2 ms past the server's own barge-in estimate."""

from __future__ import annotations

from typing import Any

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import TtsFrame
from realtime_gw.sessions.events import (
    AudioDelivered,
    CancelResponse,
    PlaybackStarted,
    PurgeAudio,
    ResponseAudio,
    ResponseFinished,
    StartResponse,
)
from realtime_gw.sessions.realtime import RealtimeSession
from realtime_gw.sessions.turns import Interrupt
from tests.sessions.realtime_helpers import FRAME, client, errors, events, respond, say, session, types


def speaking(s: RealtimeSession, frames: int = 10) -> tuple[StartResponse, str]:
    say(s, "Tell me a story.")
    start, _ = respond(s)
    for i in range(frames):
        s.handle(
            ResponseAudio(
                start.response_id,
                start.epoch,
                TtsFrame(FRAME, text="Once upon a time." if i % 5 == 0 else ""),
            ),
            0,
        )
    assert s.response is not None
    return start, s.response.item_id


def truncate(
    s: RealtimeSession, item_id: str, ms: int, content_index: int = 0, now: float = 0.0
) -> list[Any]:
    return client(
        s,
        {
            "type": "conversation.item.truncate",
            "item_id": item_id,
            "content_index": content_index,
            "audio_end_ms": ms,
        },
        now,
    )


def test_truncate_of_the_live_reply_cancels_it_without_cancel() -> None:
    """openai-agents / pipecat: truncate at content_index 0 first (or alone)."""
    s = session()
    start, item_id = speaking(s)
    out = truncate(s, item_id, 500)
    assert errors(out) == []
    assert any(isinstance(e, CancelResponse) for e in out) and any(isinstance(e, PurgeAudio) for e in out)
    kinds = types(out)
    assert kinds[-1] == "conversation.item.truncated" and "response.done" in kinds
    done = next(ev for ev in events(out) if isinstance(ev, rt.ResponseDoneEvent))
    assert done.response.status == "cancelled"
    assert s.conversation.get(item_id).audio_ms == 500
    # the cancel that follows (with or without the id) is harmless: no error, no second response.done
    assert s.response is None
    assert client(s, {"type": "response.cancel"}) == []
    assert client(s, {"type": "response.cancel", "response_id": start.response_id}) == []
    later = s.handle(ResponseAudio(start.response_id, start.epoch, TtsFrame(FRAME)), 0)
    assert later == [], "frames of the cancelled reply are stale"


def test_truncate_at_any_content_index_and_past_the_audio_is_clamped() -> None:
    s = session()
    _, item_id = speaking(s, frames=10)  # 800 ms generated
    out = truncate(s, item_id, 5000, content_index=3)
    assert errors(out) == []
    (truncated,) = [ev for ev in events(out) if isinstance(ev, rt.ConversationItemTruncatedEvent)]
    assert truncated.audio_end_ms == 800


def test_cancel_then_truncate() -> None:
    """LiveKit: response.cancel, then the truncate of what was heard."""
    s = session()
    _, item_id = speaking(s)
    assert errors(client(s, {"type": "response.cancel"})) == []
    out = truncate(s, item_id, 300)
    assert types(out) == ["conversation.item.truncated"]
    assert s.conversation.get(item_id).audio_ms == 300


def test_barge_in_estimate_then_the_clients_own_truncate_wins() -> None:
    """Server VAD barged in and cut the item to its estimate; the framework's truncate, a little
    later or earlier than that, is accepted and is the final word."""
    s = session()
    start, item_id = speaking(s, frames=25)  # 2000 ms generated
    s.handle(PlaybackStarted(start.response_id, 10.0), 10.0)
    s.handle(ResponseFinished(start.response_id, start.epoch), 10.0)
    # the server's barge-in at 11.484 s: the client heard ~1484 ms
    cut = s._carry_out(Interrupt(), 11.484)
    assert client(s, {"type": "response.cancel"}, 11.5) == [], "the framework's cancel after the barge-in"
    estimate = next(ev for ev in events(cut) if isinstance(ev, rt.ConversationItemTruncatedEvent))
    assert estimate.audio_end_ms == 1484
    for ms in (1486, 1200, 1999, 4000):
        out = truncate(s, item_id, ms, now=11.6)
        assert errors(out) == [], ms
        assert s.conversation.get(item_id).audio_ms == min(ms, 2000)
    part = s.conversation.get(item_id).item.content[0]
    assert part.transcript, "the words heard up to the last cut"


def test_truncate_after_delivery_and_of_unknown_items() -> None:
    s = session()
    start, item_id = speaking(s)
    s.handle(ResponseFinished(start.response_id, start.epoch), 0)
    s.handle(AudioDelivered(start.response_id, start.epoch), 0)
    assert types(truncate(s, item_id, 400)) == ["conversation.item.truncated"]
    (err,) = errors(truncate(s, "item_nope", 10))
    assert err.error.code == "item_truncate_invalid_item_id"
    (err,) = errors(client(s, {"type": "conversation.item.retrieve", "item_id": "item_nope"}))
    assert err.error.code == "item_retrieve_invalid_item_id"
