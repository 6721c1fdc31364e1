"""Property fuzzing of the ``/v1/realtime`` state machine (``RealtimeSession.handle(event, now)``).

A driver plays client and transport at once: random client events (rendered as JSON and decoded, so
decode errors flow in too), worker results for live *and* stale ``(response_id, epoch)`` pairs, VAD
windows, transcriptions, playback reports and ticks, at random times. After every call it checks:

- ``handle`` never raises; every ``Send`` encodes;
- exactly one ``response.created`` and at most one ``response.done`` per response id, and after the
  final ``close()`` exactly one ``response.done`` for every response ever created;
- no ``Send`` of a response (its lane, or a ``response.*`` event naming it) after its ``response.done``
  or before its ``response.created``;
- a worker result whose pair is not the live one has no effect at all (no stale-epoch output);
- ``StartResponse`` once per response, under its live epoch; audio ``seq`` runs 0, 1, 2... per response;
- errors are ``invalid_request_error`` or ``server_error`` with a message; a closed session is inert.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import TtsFrame, VadProbs
from realtime_gw.sessions.events import (
    AskTurn,
    AudioDelivered,
    AwaitDelivery,
    CancelAsr,
    CancelResponse,
    Close,
    FeedAsr,
    FeedVad,
    Limits,
    PlaybackStarted,
    PurgeAudio,
    ResponseAudio,
    ResponseFinished,
    ResponseTextDelta,
    Send,
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
from tests.fuzz.strategies import dumps, fuzz, mutated_events, session_params, small_text

WORKER_RESULTS = (ResponseTextDelta, ResponseAudio, ResponseFinished, AudioDelivered)
TERMINAL = {"completed", "cancelled", "failed", "incomplete"}


def _tag(ev: rt.ServerEvent) -> str:
    return type(ev).__struct_config__.tag  # type: ignore[attr-defined,no-any-return]


def _response_of(ev: rt.ServerEvent) -> str | None:
    """The response a ``response.*`` event belongs to."""
    if isinstance(ev, (rt.ResponseCreatedEvent, rt.ResponseDoneEvent)):
        return ev.response.id
    if _tag(ev).startswith("response."):
        return ev.response_id  # type: ignore[attr-defined,no-any-return]
    return None


@dataclass
class Driver:
    duplex: bool
    max_items: int = 10_000
    """Large: a full conversation trips a known bug (see test_full_conversation_leaves_no_phantom_response)."""
    s: RealtimeSession = field(init=False)
    now: float = 0.0
    created: list[str] = field(default_factory=list)
    done: dict[str, str] = field(default_factory=dict)
    started: dict[str, StartResponse] = field(default_factory=dict)
    audio_seq: dict[str, int] = field(default_factory=dict)
    awaiting: list[AwaitDelivery] = field(default_factory=list)
    transcribes: list[Transcribe] = field(default_factory=list)
    asr_streams: set[str] = field(default_factory=set)
    vad: dict[int, float] = field(default_factory=dict)
    """VAD stream id -> ms of windows reported so far (stopped streams stay: their results are stale)."""
    items: list[str] = field(default_factory=list)
    closed: bool = False
    calls: int = 0

    def __post_init__(self) -> None:
        limits = Limits(max_input_buffer_bytes=200_000, max_items=self.max_items, voices=frozenset({"default", "alloy"}))
        self.s = RealtimeSession("sess_fuzz0001", limits, now=0.0, duplex=self.duplex)
        self.check(None, self.s.start(0.0), None)

    # -- feeding ------------------------------------------------------------------------------------------
    def feed(self, event: object) -> list[Any]:
        slots = [self.s.responses, *self.s.side.slots.values()]  # the main response and any out-of-band ones
        live = {(slot.live.id, slot.live.epoch) for slot in slots if slot.live is not None}
        was_closed = self.s.closed
        effects = self.s.handle(event, self.now)
        self.calls += 1
        if was_closed:
            assert effects == [], "a closed session is inert"
        self.check(event, effects, live)
        return effects

    def client(self, obj: Any) -> list[Any]:
        raw = obj if isinstance(obj, str) else dumps(obj)
        return self.feed(rt.decode_client_event(raw))

    def finish(self) -> None:
        if not self.s.closed:
            self.check(None, self.s.close(), None)
        assert self.s.closed
        missing = [r for r in self.created if r not in self.done]
        assert not missing, f"responses without response.done after close: {missing}"

    # -- the invariants -----------------------------------------------------------------------------------
    def check(self, event: object, effects: list[Any], live: set[tuple[str, int]] | None) -> None:
        if isinstance(event, WORKER_RESULTS) and (event.response_id, event.epoch) not in (live or set()):
            assert effects == [], f"a stale {type(event).__name__} produced {effects}"
        for e in effects:
            if isinstance(e, Send):
                self._check_send(e)
            elif isinstance(e, StartResponse):
                assert e.response_id in self.created and e.response_id not in self.done, e.response_id
                assert e.response_id not in self.started, f"{e.response_id} started twice"
                side = self.s.side.get(e.response_id)  # an out-of-band response beside the main one
                live = side.live if side is not None else self.s.response
                assert live is not None and (live.id, live.epoch) == (e.response_id, e.epoch), (
                    "a response starts under its live epoch"
                )
                self.started[e.response_id] = e
            elif isinstance(e, CancelResponse):
                assert e.response_id in self.created
            elif isinstance(e, AwaitDelivery):
                assert e.response_id in self.started and e.response_id not in self.done
                self.awaiting.append(e)
            elif isinstance(e, Transcribe):
                assert len(e.pcm) % 2 == 0
                self.transcribes.append(e)
            elif isinstance(e, StartVad):
                assert e.stream_id not in self.vad, "VAD stream ids are never reused"
                self.vad[e.stream_id] = 0.0
            elif isinstance(e, StopVad):
                assert e.stream_id in self.vad or e.stream_id == 0  # close() stops "stream 0" (none) too
            elif isinstance(e, FeedVad):
                assert e.stream_id in self.vad
            elif isinstance(e, StartAsr):
                assert e.item_id not in self.asr_streams, "ASR streams are keyed by a new item id"
                self.asr_streams.add(e.item_id)
            elif isinstance(e, (FeedAsr, CancelAsr)):
                assert e.item_id in self.asr_streams
            elif isinstance(e, AskTurn):
                assert len(e.pcm) % 2 == 0
            elif isinstance(e, Close):
                assert self.s.closed
            else:
                assert isinstance(e, PurgeAudio), e
        if self.s.closed:
            self.closed = True

    def _check_send(self, e: Send) -> None:
        ev = e.event
        rt.encode_server_event(ev)  # the writer must be able to send it
        rid = _response_of(ev)
        if isinstance(ev, rt.ResponseCreatedEvent):
            assert rid not in self.created, f"{rid} created twice"
            self.created.append(ev.response.id)
        if e.response_id is not None:
            assert e.response_id in self.created, f"lane of unknown response {e.response_id}: {_tag(ev)}"
            assert e.response_id not in self.done, f"{_tag(ev)} sent for {e.response_id} after its response.done"
        if rid is not None:
            assert e.response_id == rid, f"{_tag(ev)} of {rid} outside its lane"
            assert rid in self.created and rid not in self.done, f"{_tag(ev)} for {rid} after its response.done"
        if isinstance(ev, rt.ResponseDoneEvent):
            assert ev.response.status in TERMINAL
            self.done[ev.response.id] = ev.response.status
        elif isinstance(ev, rt.ResponseAudioDeltaEvent):
            want = self.audio_seq.get(ev.response_id, 0)
            assert ev.seq == want, f"audio seq {ev.seq}, expected {want}"
            self.audio_seq[ev.response_id] = want + 1
        elif isinstance(ev, rt.ErrorEvent):
            assert ev.error.type in ("invalid_request_error", "server_error") and ev.error.message
        elif isinstance(ev, (rt.ConversationItemAdded, rt.ConversationItemDone)) and ev.item.id not in self.items:
            self.items.append(ev.item.id or "")


# -- actions ------------------------------------------------------------------------------------------------
picks = st.sampled_from([0, 0, 0, 0, 1, 2, 3, 7])
"""Which of the known responses / items / streams an action addresses: mostly the newest."""
epoch_skew = st.sampled_from([0, 0, 0, 0, 0, 0, -1, 1, -5])
"""Results for the live epoch, sometimes for a stale or a future one."""
USER_TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "out of band"}]}
vad_probs = st.lists(
    st.tuples(st.sampled_from([0.0, 0.1, 0.4, 0.6, 0.95]), st.integers(min_value=1, max_value=45)), min_size=1, max_size=4
).map(lambda runs: [p for p, n in runs for _ in range(n)])
"""Speech probabilities in runs (speech long enough to barge in is ~38 windows of 32 ms)."""
PARAMS: dict[str, tuple[st.SearchStrategy[Any], ...]] = {
    # client events
    "update": (session_params,),
    "append": (st.integers(min_value=0, max_value=600), st.integers(min_value=0, max_value=3)),
    "commit": (),
    "clear": (),
    "out_clear": (),
    "item": (
        st.sampled_from(["user", "user", "assistant", "system", None]),
        st.lists(st.sampled_from(["input_text", "input_audio", "output_text", "output_audio", "text"]), max_size=2),
        small_text,
        st.sampled_from([None, None, "root", "pick", "bogus"]),
        picks,
    ),
    "retrieve": (picks,),
    "delete": (picks,),
    "truncate": (picks, st.sampled_from([0, 0, 0, 1, -1]), st.sampled_from([0, 40, 80, 100, 160, 500, 3000, -5])),
    "create": (
        st.sampled_from([None, ["text"], ["audio"], ["audio", "text"]]),
        st.sampled_from([None, None, "auto", "none", "elsewhere"]),
        st.sampled_from([None, None, "default", "alloy", "nobody"]),
        st.booleans(),
        st.sampled_from([None, None, None, 1.5, 0.01, 100.0]),
        st.sampled_from([None, None, None, [USER_TEXT], [{"type": "message", "role": 7}], [{"type": "function_call"}]]),
    ),
    "cancel": (st.sampled_from([None, "live", "old", "bogus"]), picks),
    "ack": (picks, st.integers(min_value=0, max_value=3000)),
    "mutated": (mutated_events(),),
    "garbage": (st.text(max_size=20),),
    "close": (),
    # the transport and the workers
    "text": (picks, epoch_skew, small_text),
    "audio": (picks, epoch_skew, st.sampled_from([1920, 1920, 960, 0]), small_text),
    "finished": (picks, epoch_skew, st.sampled_from([None, None, None, "boom"])),
    "delivered": (picks, epoch_skew),
    "transcript": (picks, st.sampled_from([None, "hello there", ""]), st.sampled_from([None, None, "asr died"])),
    "vad": (picks, vad_probs),
    "playing": (picks,),
    "tick": (st.floats(min_value=0.0, max_value=3.0),),
}
WEIGHTS = {
    "update": 2, "append": 3, "commit": 2, "clear": 1, "out_clear": 1, "item": 4, "retrieve": 1, "delete": 1,
    "truncate": 3, "create": 5, "cancel": 2, "ack": 2, "mutated": 2, "garbage": 1, "close": 1,
    "text": 4, "audio": 8, "finished": 5, "delivered": 4, "transcript": 3, "vad": 4, "playing": 4, "tick": 4,
}  # fmt: skip


ACTIONS = {k: st.tuples(st.just(k), *params) for k, params in PARAMS.items()}


def weighted_actions(weights: dict[str, int]) -> st.SearchStrategy[tuple[Any, ...]]:
    kinds = [k for k, w in weights.items() for _ in range(w)]
    return st.sampled_from(kinds).flatmap(ACTIONS.__getitem__)


actions = weighted_actions(WEIGHTS)


def _pick(seq: list[Any], i: int) -> Any:
    return seq[-1 - (i % len(seq))] if seq else None


def run_action(d: Driver, a: tuple[Any, ...]) -> None:
    kind, s = a[0], d.s
    if kind == "update":
        d.client({"type": "session.update", "session": a[1]})
    elif kind == "append":
        ms, level = a[1], a[2]
        per_ms = 8 if s.settings.input_format != "audio/pcm" else s.settings.input_rate * 2 // 1000
        pcm = bytes([level * 40, 0]) * (ms * per_ms // 2)
        d.client({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
    elif kind in ("commit", "clear", "out_clear"):
        d.client({"type": {"commit": "input_audio_buffer.commit", "clear": "input_audio_buffer.clear",
                           "out_clear": "output_audio_buffer.clear"}[kind]})  # fmt: skip
    elif kind == "item":
        _, role, parts, text, prev, i = a
        content = [
            {"type": p, "text": text} if "text" in p else {"type": p, "audio": base64.b64encode(b"\x01\x00" * 240).decode()}
            if p == "input_audio" else {"type": p, "transcript": text}
            for p in parts
        ]  # fmt: skip
        item: dict[str, Any] = {"type": "message", "content": content}
        if role is not None:
            item["role"] = role
        ev: dict[str, Any] = {"type": "conversation.item.create", "item": item}
        if prev is not None:
            ev["previous_item_id"] = _pick(d.items, i) if prev == "pick" else prev
        d.client(ev)
    elif kind in ("retrieve", "delete"):
        d.client({"type": f"conversation.item.{kind}", "item_id": _pick(d.items, a[1]) or "nothing"})
    elif kind == "truncate":
        d.client({"type": "conversation.item.truncate", "item_id": _pick(d.items, a[1]) or "nothing",
                  "content_index": a[2], "audio_end_ms": a[3]})  # fmt: skip
    elif kind == "create":
        _, mods, conversation, voice, instructions, speed, oob = a
        params: dict[str, Any] = {}
        if speed is not None:
            params.setdefault("audio", {}).setdefault("output", {})["speed"] = speed
        if oob is not None:
            params["input"] = oob
        if mods is not None:
            params["output_modalities"] = mods
        if conversation is not None:
            params["conversation"] = conversation
        if voice is not None:
            params.setdefault("audio", {}).setdefault("output", {})["voice"] = voice
        if instructions:
            params["instructions"] = "Be brief."
        d.client({"type": "response.create", **({"response": params} if params else {})})
    elif kind == "cancel":
        which = a[1]
        ev = {"type": "response.cancel"}
        if which == "live" and s.response is not None:
            ev["response_id"] = s.response.id
        elif which == "old":
            ev["response_id"] = _pick(d.created, a[2]) or "resp_none"
        elif which == "bogus":
            ev["response_id"] = "resp_bogus"
        d.client(ev)
    elif kind == "ack":
        d.client({"type": "playback.ack", "response_id": _pick(d.created, a[1]) or "resp_none", "played_ms": a[2]})
    elif kind in ("mutated", "garbage"):
        d.client(a[1])
    elif kind == "close":
        d.client({"type": "session.close"})
    elif kind in ("text", "audio", "finished", "delivered"):
        start = _pick(list(d.started.values()), a[1])
        if kind == "delivered":
            awaiting = _pick(d.awaiting, a[1])
            if awaiting is not None:
                d.awaiting.remove(awaiting)
                start = d.started[awaiting.response_id]
        if start is None:
            return
        rid, epoch = start.response_id, start.epoch + a[2]
        if kind == "text":
            d.feed(ResponseTextDelta(rid, epoch, a[3]))
        elif kind == "audio":
            d.feed(ResponseAudio(rid, epoch, TtsFrame(pcm=b"\x02\x00" * a[3], text=a[4])))
        elif kind == "finished":
            d.feed(ResponseFinished(rid, epoch, a[3]))
        else:
            d.feed(AudioDelivered(rid, epoch))
    elif kind == "transcript":
        t = _pick(d.transcribes, a[1])
        if t is not None:
            d.transcribes.remove(t)  # the transport reports each transcription once
            d.feed(TranscriptionDone(t.item_id, a[2], a[3]))
    elif kind == "vad":
        if not d.vad:
            return
        stream = sorted(d.vad)[-1 - (a[1] % len(d.vad))]
        window = 32.0
        d.feed(VadResult(VadProbs(start_ms=d.vad[stream], window_ms=window, probs=a[2]), stream))
        d.vad[stream] += window * len(a[2])
    elif kind == "playing":
        rid = _pick(d.created, a[1])
        if rid is not None:
            d.feed(PlaybackStarted(rid, d.now))
    elif kind == "tick":
        d.now += a[1]
        d.feed(Tick())


@fuzz(300)
@given(st.booleans(), st.lists(actions, min_size=10, max_size=80))
def test_random_event_sequences_keep_the_response_invariants(duplex: bool, steps: list[tuple[Any, ...]]) -> None:
    d = Driver(duplex)
    for a in steps:
        run_action(d, a)
    d.finish()


# Sequences biased to the paths that matter most: turns with results, barge-in, truncation, acks.
turn_actions = weighted_actions(
    {"item": 3, "create": 4, "text": 4, "audio": 10, "finished": 5, "delivered": 4, "playing": 4, "cancel": 1,
     "out_clear": 1, "append": 3, "vad": 4, "transcript": 3, "truncate": 3, "ack": 3, "tick": 4, "commit": 1}
)  # fmt: skip


TURN_DETECTION = [
    None,
    {"type": "server_vad", "silence_duration_ms": 100, "idle_timeout_ms": 1000},
    {"type": "server_vad", "silence_duration_ms": 200, "create_response": False},
    {"type": "semantic_vad", "eagerness": "high"},
]


@fuzz(300)
@given(
    st.booleans(),
    st.sampled_from(TURN_DETECTION),
    st.sampled_from([None, {"model": "asr"}]),
    st.sampled_from(["audio/pcm", "audio/pcmu"]),
    st.lists(turn_actions, min_size=20, max_size=100),
)
def test_turn_heavy_sequences_keep_the_response_invariants(
    duplex: bool, turn_detection: Any, transcription: Any, output_format: str, steps: list[tuple[Any, ...]]
) -> None:
    d = Driver(duplex)
    audio_in = {"turn_detection": turn_detection, "transcription": transcription}
    d.client({"type": "session.update", "session": {"audio": {"input": audio_in, "output": {"format": {"type": output_format}}}}})
    for a in steps:
        run_action(d, a)
    d.finish()


def test_driver_sees_a_full_turn() -> None:
    """The driver's own bookkeeping, on a plain text turn and a cancelled audio turn."""
    d = Driver(False)
    d.client({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
    run_action(d, ("item", "user", ["input_text"], "hi", None, 0))
    run_action(d, ("create", ["text"], None, None, False, None, None))
    run_action(d, ("text", 0, 0, "hello"))
    run_action(d, ("text", 0, -1, "stale"))
    run_action(d, ("finished", 0, 0, None))
    assert list(d.done.values()) == ["completed"]
    run_action(d, ("create", ["audio"], None, None, False, None, None))
    run_action(d, ("audio", 0, 0, 1920, "hi"))
    run_action(d, ("cancel", "live", 0))
    run_action(d, ("audio", 0, 0, 1920, "late"))  # stale now: no effect
    d.finish()
    assert list(d.done.values()) == ["completed", "cancelled"] and len(d.started) == 2


# -- found by fuzzing, fixed: regression test --------------------------------------------------------------
def test_full_conversation_leaves_no_phantom_response() -> None:
    d = Driver(False, max_items=2)
    session = {"truncation": "disabled", "audio": {"input": {"turn_detection": None}}}  # else old items are forgotten
    d.client({"type": "session.update", "session": session})
    for _ in range(2):
        run_action(d, ("item", "user", ["input_text"], "hi", None, 0))
    errors = [e.event.error.code for e in d.client({"type": "response.create"}) if isinstance(e, Send)]
    assert errors == ["conversation_full"]
    assert d.s.response is None, "a refused response.create leaves no live response"
    d.finish()  # and close() must not emit a response.done for a response never created
