"""The Moshi stage's backend on the tiny shape (random init, sampling as published): conversations that
join and leave a batch change nothing for the others, a seed replays a conversation, the silence switch,
the first frame, refusals."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from realtime_gw.models.contract import NoFreeSlot
from realtime_gw.models.s2s.backend import MoshiBackend
from realtime_gw.records.s2s import S2sAudio, S2sFrame, S2sOpen, S2sSilence
from tests.models.s2s.conversations import FRAME, noise_frames, talk
from tests.models.waiting import wait_for


@pytest.fixture(scope="module")
def backend() -> MoshiBackend:
    return MoshiBackend("tiny", slots=3, seed=7)


def _run(backend: MoshiBackend, plan: dict[str, tuple[int, int, int]], steps: int) -> dict[str, list[S2sFrame]]:
    """``plan``: name -> (seed, first step, last step); its audio is noise of the same seed."""
    openings = {name: (S2sOpen(seed=seed), first, last) for name, (seed, first, last) in plan.items()}
    return talk(backend, openings, steps, {name: noise_frames(seed, steps) for name, (seed, _, _) in plan.items()})


def test_fp8_ring_kv_keeps_conversations_apart() -> None:
    """``s2s_kv_dtype fp8``: the ring K/V in e4m3 with their scales; packing moves both with the slot."""
    fp8 = MoshiBackend("tiny", slots=3, seed=7, kv_dtype="fp8")
    assert fp8.info["kv_dtype"] == "float8_e4m3fn"
    assert fp8.engine.lm.ring.scales is not None
    c_alone = _run(fp8, {"c": (13, 0, 6)}, 7)["c"]
    crowded = _run(fp8, {"b": (12, 0, 4), "a": (11, 0, 9), "c": (13, 3, 9)}, 10)
    assert [f.text_token for f in crowded["c"]] == [f.text_token for f in c_alone]
    got, want = (np.frombuffer(b"".join(f.pcm for f in fs), "<i2").astype(int) for fs in (crowded["c"], c_alone))
    assert np.abs(got - want).max() <= 2  # a batched conv may round a float differently (1 LSB)
    with pytest.raises(ValueError, match="s2s_kv_dtype"):
        MoshiBackend("tiny", slots=1, kv_dtype="int4")


def test_a_conversation_that_others_join_and_leave_says_what_it_says_alone(backend: MoshiBackend) -> None:
    """b leaves slot 0 at step 4: c (slot 2) is moved down into it (the batch bucket shrinks) and goes on."""
    alone = _run(backend, {"a": (11, 0, 15)}, 16)["a"]
    c_alone = _run(backend, {"c": (13, 0, 6)}, 7)["c"]
    crowded = _run(backend, {"b": (12, 0, 4), "a": (11, 0, 15), "c": (13, 3, 9), "d": (14, 6, 15)}, 16)
    assert [f.text_token for f in crowded["c"]] == [f.text_token for f in c_alone]
    assert [f.index for f in crowded["a"]] == list(range(16))
    assert [f.text_token for f in crowded["a"]] == [f.text_token for f in alone]
    # the voice: the same codes decoded; a batched conv may round a float differently (1 LSB)
    got, want = (np.frombuffer(b"".join(f.pcm for f in fs), "<i2").astype(int) for fs in (crowded["a"], alone))
    assert np.abs(got - want).max() <= 2 and np.abs(want).max() > 1000
    assert len(crowded["c"]) == 7 and crowded["c"][0].index == 0
    assert {f.text_token for f in alone[1:]} - {3, 0}, "sampling at the published temperatures says something"


def test_another_seed_says_something_else(backend: MoshiBackend) -> None:
    a = _run(backend, {"a": (11, 0, 7)}, 8)["a"]
    b = _run(backend, {"a": (99, 0, 7)}, 8)["a"]
    assert [f.text_token for f in a] != [f.text_token for f in b]


def test_a_conversation_released_before_its_first_step_leaves_its_slot_clean(backend: MoshiBackend) -> None:
    """A client that connects and leaves at once: the next conversation in that slot samples with its own
    seed (the slot is reset once, with the newest seed)."""
    fresh = _run(backend, {"a": (3, 0, 5)}, 6)["a"]
    backend.release(backend.open(S2sOpen(seed=99)))
    again = _run(backend, {"a": (3, 0, 5)}, 6)["a"]
    assert [f.text_token for f in again] == [f.text_token for f in fresh]


def test_the_first_frame_is_silence_and_padding(backend: MoshiBackend) -> None:
    first = _run(backend, {"a": (1, 0, 0)}, 1)["a"][0]
    assert first.index == 0 and first.padding and first.text == "" and first.text_token == 3
    assert first.pcm == bytes(2 * FRAME)


def test_silence_forces_padding_and_quiet_then_lets_go(backend: MoshiBackend) -> None:
    st = backend.open(S2sOpen(seed=5))
    try:
        audio = noise_frames(5, 12)
        out: list[S2sFrame] = []
        for t in range(12):
            inputs: list[Any] = [audio[t]]
            if t == 4:
                inputs = [S2sSilence(True), *inputs]
            if t == 8:
                inputs = [S2sSilence(False), *inputs]
            out += backend.step([(st, inputs)])[0].outputs
        silent = out[4:8]
        assert all(f.padding and f.text == "" and f.pcm == bytes(2 * FRAME) for f in silent)
        assert any(f.pcm != bytes(2 * FRAME) for f in out[9:]), "released: it speaks again, context kept"
        assert [f.index for f in out] == list(range(12))
    finally:
        backend.release(st)


def test_several_frames_waiting_advance_one_per_step(backend: MoshiBackend) -> None:
    st = backend.open(S2sOpen(seed=2))
    try:
        (r,) = backend.step([(st, noise_frames(2, 3))])
        assert [f.index for f in r.outputs] == [0] and backend.has_work(st)
        (r,) = backend.step([(st, [])])
        (r2,) = backend.step([(st, [])])
        assert [f.index for f in r.outputs + r2.outputs] == [1, 2] and not backend.has_work(st)
    finally:
        backend.release(st)


def test_refusals(backend: MoshiBackend) -> None:
    with pytest.raises(ValueError, match="moshi takes no voice prompt or persona"):
        backend.open(S2sOpen(persona="a pirate"))
    held = [backend.open(S2sOpen()) for _ in range(3)]
    try:
        with pytest.raises(NoFreeSlot, match="no free slot"):
            backend.open(S2sOpen())
        (r,) = backend.step([(held[0], [S2sAudio(b"\0" * 10)])])
        assert r.done and r.error and "3840 bytes" in r.error
    finally:
        for st in held:
            backend.release(st)
    assert backend.describe().s2s is not None and backend.describe().s2s.text_padding_ids == (3, 0)


async def test_a_full_stage_refuses_a_conversation_at_once() -> None:
    """Through the stage worker the app starts (``--s2s moshi``): each conversation holds a slot; one more
    is refused at submit, never queued; a released one makes room."""
    import asyncio

    from realtime_gw.config import GatewayConfig
    from realtime_gw.models.registry import build_stage

    worker = build_stage("s2s", GatewayConfig(s2s="moshi", s2s_slots=2, warmup=False))
    await worker.start(warmup=False)
    try:
        first, second = worker.submit(S2sOpen(seed=1)), worker.submit(S2sOpen(seed=2))
        with pytest.raises(NoFreeSlot):
            worker.submit(S2sOpen(seed=3))
        for stream in (first, second):
            for a in noise_frames(1, 2):
                stream.push(a)
        frames = aiter(first)
        got = [await asyncio.wait_for(anext(frames), 30) for _ in range(2)]
        assert [f.index for f in got] == [0, 1] and all(isinstance(f, S2sFrame) for f in got)
        first.cancel()
        await wait_for(lambda: worker.active_count < 2, 30)
        third = worker.submit(S2sOpen(seed=3))
        third.cancel()
        second.cancel()
    finally:
        await worker.stop()


async def test_in_the_gateway_every_conversation_steps_once_per_80_ms_tick() -> None:
    """The stage the app starts runs in lockstep: frames waiting are heard one per tick (never in a
    burst faster than real time), and a conversation given no audio steps all the same, on silence."""
    import asyncio
    import time

    from realtime_gw.config import GatewayConfig
    from realtime_gw.models.registry import build_stage
    from realtime_gw.models.s2s.backend import S2S_CONCEALED

    worker = build_stage("s2s", GatewayConfig(s2s="moshi", s2s_slots=2, warmup=False))
    await worker.start(warmup=False)
    concealed = S2S_CONCEALED._value.get()
    try:
        opened = time.monotonic()
        talking, quiet = worker.submit(S2sOpen(seed=1)), worker.submit(S2sOpen(seed=2))
        for a in noise_frames(1, 8):
            talking.push(a)

        async def frames(stream: Any) -> list[tuple[float, S2sFrame]]:
            it, out = aiter(stream), []
            for _ in range(8):
                frame = await asyncio.wait_for(anext(it), 30)
                out.append((time.monotonic(), frame))  # when it came, not when the wait for it began
            return out

        heard, silent = await asyncio.gather(frames(talking), frames(quiet))
        assert [f.index for _, f in heard] == list(range(8)) == [f.index for _, f in silent]
        # eight frames waiting are heard at real time, not in a burst: frame i no earlier than its tick
        # (the first tick falls anywhere in the frame after the opening; a late step shortens one gap only)
        assert all(at - opened >= (i - 1) * 0.08 for i, (at, _) in enumerate(heard)), [at - opened for at, _ in heard]
        assert S2S_CONCEALED._value.get() - concealed >= 8  # the quiet one heard silence at its ticks
        assert worker.lockstep is not None and worker.lockstep.running
    finally:
        await worker.stop()


def test_a_frame_is_late_against_the_tick_it_was_due_at(backend: MoshiBackend) -> None:
    """The worker tells the backend when an iteration's frame was due (``tick``); the frame is late by how
    long after the next tick its audio was ready. No tick (not in a lockstep): no deadline, never late."""
    import time

    from realtime_gw.models.s2s.backend import S2S_LATE_STEPS

    st = backend.open(S2sOpen(seed=4))
    try:
        audio = noise_frames(4, 3)
        late_steps, counted = backend.late_steps, S2S_LATE_STEPS._value.get()
        backend.tick(time.monotonic() - 0.5)  # its step should have started 500 ms ago
        (r,) = backend.step([(st, [audio[0]])])
        assert r.outputs[0].late_ms >= 420.0
        assert backend.late_steps == late_steps + 1 and S2S_LATE_STEPS._value.get() == counted + 1
        backend.tick(time.monotonic() + 10)  # due in the future: on time
        (r,) = backend.step([(st, [audio[1]])])
        assert r.outputs[0].late_ms == 0.0
        (r,) = backend.step([(st, [audio[2]])])  # the tick is the iteration's own: not told, not timed
        assert r.outputs[0].late_ms == 0.0 and backend.late_steps == late_steps + 1
    finally:
        backend.release(st)


async def test_in_the_gateway_a_frame_after_a_step_that_ran_over_is_late_too() -> None:
    """One step stalls 250 ms on the worker's thread: its frame is late by the excess, and so is the next
    one, which could start only when the stall ended (a step-duration measure would call it on time)."""
    import asyncio
    import time

    from realtime_gw.config import GatewayConfig
    from realtime_gw.models.registry import build_stage
    from realtime_gw.models.s2s.backend import S2S_STEP_LATENESS

    worker = build_stage("s2s", GatewayConfig(s2s="moshi", s2s_slots=1, warmup=False))
    engine = worker.backend.engine  # type: ignore[attr-defined]
    step, calls = engine.step, []

    def stalling_step(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 4:  # frame 3
            time.sleep(0.25)
        return step(*args)

    engine.step = stalling_step
    observed = sum(s.value for s in S2S_STEP_LATENESS.collect()[0].samples if s.name.endswith("_count"))
    await worker.start(warmup=False)
    try:
        stream = worker.submit(S2sOpen(seed=1))
        for a in noise_frames(1, 6):
            stream.push(a)
        frames = aiter(stream)
        got = [await asyncio.wait_for(anext(frames), 30) for _ in range(6)]
        assert [f.index for f in got] == list(range(6))
        # frame 3 ran >= 250 ms from its tick; frame 4's tick came 80 ms after 3's, its step ran after the stall
        assert got[3].late_ms >= 170.0 and got[4].late_ms >= 85.0, [f.late_ms for f in got]
        after = sum(s.value for s in S2S_STEP_LATENESS.collect()[0].samples if s.name.endswith("_count"))
        assert after - observed >= 6
    finally:
        await worker.stop()


def test_a_conversation_says_the_same_whatever_batch_bucket_it_runs_in() -> None:
    """Buckets that are not powers of two (``s2s_batch_buckets``; here 1, 3 and the 5 slots): ``a`` runs
    at 3, then 5 as others join, then 3 once the ones above the live count are packed down, then 1 when
    it is packed itself; it and ``e`` (moved from slot 4 to 0) say what they say alone (bucket 1)."""
    from realtime_gw.config import GatewayConfig
    from realtime_gw.models.s2s.backend import build_moshi

    fine = build_moshi(GatewayConfig(s2s="moshi", s2s_slots=5, s2s_batch_buckets=[1, 3]))
    assert fine.engine.batch_buckets == [1, 3, 5] and fine.info["batch_buckets"] == [1, 3, 5]
    assert MoshiBackend("tiny", slots=48, seed=7).engine.batch_buckets[-3:] == [32, 40, 48]  # default: fine_buckets
    ran: list[int] = []
    frame = fine.engine._frame

    def recorded(b: int, length: int) -> None:
        ran.append(b)
        frame(b, length)

    alone = {n: _run(fine, {n: (seed, 0, steps - 1)}, steps)[n] for n, seed, steps in (("a", 11, 12), ("e", 15, 9))}
    fine.engine._frame = recorded  # type: ignore[method-assign]
    plan = {"b": (12, 0, 3), "a": (11, 0, 11), "c": (13, 1, 8), "d": (14, 2, 5), "e": (15, 2, 10)}
    crowded = _run(fine, plan, 12)
    assert ran == [3, 3, 5, 5, 5, 5, 3, 3, 3, 3, 3, 1]
    for name in ("a", "e"):
        assert [f.text_token for f in crowded[name]] == [f.text_token for f in alone[name]]
        got, want = (np.frombuffer(b"".join(f.pcm for f in fs), "<i2").astype(int) for fs in (crowded[name], alone[name]))
        assert np.abs(got - want).max() <= 2  # a batched conv may round a float differently (1 LSB)
    with pytest.raises(ValueError, match="positive batch sizes"):
        MoshiBackend("tiny", slots=2, batch_buckets=[0])
