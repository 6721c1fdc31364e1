"""Out-of-band responses beside the live one. Pure.

A ``response.create`` with ``conversation: "none"`` while a response is already live does not wait
and is not refused: it runs in a slot of its own (a ``Responses`` of one response each, sharing the
session's ids, conversation and playback ledger), with its own response id, phases and single
``response.done``. Its items never join the conversation. Only the session's main slot answers
turns, is cut by barge-in and is what ``response.cancel`` without a ``response_id`` cancels (an
out-of-band response that runs there alone moves aside when an in-conversation one is asked for); an
out-of-band response beside it is cancelled by id (or ends with the session). It may speak: its
audio deltas carry its own ``response_id`` and follow the main response's audio on the socket, so
only one response at a time is heard speaking. At most ``MAX_SIDE_RESPONSES`` run at once.
"""

from __future__ import annotations

from collections.abc import Callable

from realtime_gw.protocols import realtime as rt
from realtime_gw.sessions.events import Effect
from realtime_gw.sessions.response_lifecycle import Phase, Responses
from realtime_gw.sessions.settings import SessionError, SessionSettings

MAX_SIDE_RESPONSES = 8


class SideResponses:
    def __init__(self, new_slot: Callable[[], Responses]) -> None:
        self.new_slot = new_slot
        self.slots: dict[str, Responses] = {}

    def __contains__(self, response_id: object) -> bool:
        return response_id in self.slots

    def create(self, p: rt.ResponseParams, settings: SessionSettings) -> list[Effect]:
        if len(self.slots) >= MAX_SIDE_RESPONSES:
            raise SessionError(
                f"At most {MAX_SIDE_RESPONSES} out-of-band responses may run beside the live one",
                "conversation_already_has_active_response",
            )
        slot = self.new_slot()
        out = slot.create(p, settings)
        assert slot.live is not None
        self.slots[slot.live.id] = slot
        return out + self.settle()

    def adopt(self, main: Responses) -> None:
        """The main slot's live response is out of band and an in-conversation one is asked for:
        the out-of-band one moves to a slot of its own (its id and epoch go with it, so its results
        still find it) and the main slot is free."""
        r = main.live
        assert r is not None and not r.in_conversation
        if len(self.slots) >= MAX_SIDE_RESPONSES:
            raise SessionError(
                f"At most {MAX_SIDE_RESPONSES} out-of-band responses may run beside the live one",
                "conversation_already_has_active_response",
            )
        slot = self.new_slot()
        slot.live, slot.phase, slot.epoch = r, main.phase, main.epoch
        r.answer_after = False  # the main slot's next response answers the turn
        main.live, main.phase = None, Phase.IDLE
        self.slots[r.id] = slot

    def get(self, response_id: str) -> Responses | None:
        return self.slots.get(response_id)

    def settle(self) -> list[Effect]:
        """Forget the slots whose response has ended."""
        for response_id in [rid for rid, slot in self.slots.items() if slot.live is None]:
            del self.slots[response_id]
        return []

    def start_if_ready(self) -> list[Effect]:
        out: list[Effect] = []
        for slot in list(self.slots.values()):
            out += slot.start_if_ready()
        return out + self.settle()  # a response may fail as it would start (``Responses.start_if_ready``)

    def close(self) -> list[Effect]:
        out: list[Effect] = []
        for slot in self.slots.values():
            out += slot.close()
        self.slots.clear()
        return out
