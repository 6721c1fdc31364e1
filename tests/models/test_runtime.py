"""StageWorker behaviour with a toy backend: batching, cancellation, slots, faults, flow control."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from realtime_gw.models.runtime import END_OF_INPUT, NoFreeSlot, RequestRefused, WorkerFault
from tests.models.toy_backends import Req, Toy
from tests.models.waiting import wait_for


async def test_batches_across_concurrent_streams(start_worker: Any) -> None:
    toy = Toy()
    w = await start_worker(toy, max_batch=8)
    streams = [w.submit(Req(n=5)) for _ in range(4)]
    outs = await asyncio.gather(*(s.collect() for s in streams))
    assert outs == [[1, 2, 3, 4, 5]] * 4
    assert max(toy.batches) == 4  # all four advanced in the same step
    assert len(toy.released) == 4 and w.active_count == 0
    assert len(toy.threads) == 1  # open/step/release all on the worker's own thread
    assert threading.get_ident() not in toy.threads


async def test_max_batch_round_robin(start_worker: Any) -> None:
    toy = Toy()
    w = await start_worker(toy, max_batch=2)
    streams = [w.submit(Req(n=3)) for _ in range(5)]
    outs = await asyncio.gather(*(s.collect() for s in streams))
    assert outs == [[1, 2, 3]] * 5
    assert max(toy.batches) == 2


async def test_inputs_then_end_of_input(start_worker: Any) -> None:
    toy = Toy()
    w = await start_worker(toy)
    s = w.submit(Req(n=0))
    s.push("a")
    s.push("b")
    s.close_input()
    assert await s.collect() == ["a", "b", END_OF_INPUT]


async def test_cancel_releases_state(start_worker: Any) -> None:
    toy = Toy()
    w = await start_worker(toy, max_backlog=4)
    s = w.submit(Req(n=None))
    it = aiter(s)
    assert await anext(it) == 1
    s.cancel()
    await wait_for(lambda: w.active_count == 0 and len(toy.released) == 1)
    assert toy.released[0] is toy.opened[0]
    assert [x async for x in s] == []  # a cancelled stream ends quietly


async def test_no_free_slot_when_max_active_reached(start_worker: Any) -> None:
    toy = Toy()
    w = await start_worker(toy, max_active=2)
    a, b = w.submit(Req(n=None)), w.submit(Req(n=None))
    with pytest.raises(NoFreeSlot):
        w.submit(Req())
    a.cancel()
    await wait_for(lambda: w.active_count == 1)
    c = w.submit(Req(n=2))  # a slot came back
    assert await c.collect() == [1, 2]
    b.cancel()


async def test_backend_no_free_slot_fails_that_request(start_worker: Any) -> None:
    toy = Toy()
    w = await start_worker(toy)
    s = w.submit(Req(full=True))
    with pytest.raises(WorkerFault, match="full"):
        await s.collect()
    assert await w.submit(Req(n=1)).collect() == [1]


async def test_step_fault_fails_only_that_batch(start_worker: Any) -> None:
    toy = Toy()
    w = await start_worker(toy, max_batch=8)
    bad, mate = w.submit(Req(boom=True)), w.submit(Req(n=2))
    with pytest.raises(WorkerFault, match="kaboom"):
        await bad.collect()
    with pytest.raises(WorkerFault):
        await mate.collect()  # same batch as the fault
    assert len(toy.released) == 2  # faulted states are still released
    assert await w.submit(Req(n=3)).collect() == [1, 2, 3]  # the worker keeps serving
    assert w.active_count == 0


async def test_flow_control_pauses_generating_stream(start_worker: Any) -> None:
    toy = Toy()
    w = await start_worker(toy, max_backlog=4)
    s = w.submit(Req(n=None))
    await wait_for(lambda: s.backlog >= 4)
    steps = len(toy.batches)
    await asyncio.sleep(0.05)
    assert len(toy.batches) == steps and s.backlog == 4  # paused: the consumer is behind
    it = aiter(s)
    assert [await anext(it) for _ in range(6)] == [1, 2, 3, 4, 5, 6]
    await wait_for(lambda: s.backlog >= 4)  # resumed, and paused again at the bound
    assert len(toy.batches) > steps
    s.cancel()
    await wait_for(lambda: w.active_count == 0)


async def test_stop_right_after_a_result_does_not_hang() -> None:
    # Regression: a cancel landing as a step completes was swallowed by asyncio.wait_for (< 3.12),
    # and stop() then waited forever (~80% of stops right after a result, with this toy backend).
    from realtime_gw.models.runtime import StageWorker

    for _ in range(20):
        w = StageWorker(Toy())
        await w.start(warmup=False)
        assert await w.submit(Req(n=1)).collect() == [1]
        await asyncio.wait_for(w.stop(), 2.0)


async def test_a_hung_step_in_a_thread_gives_its_slots_back_when_it_returns() -> None:
    from realtime_gw.models.faults import FaultSpec, FaultyBackend
    from realtime_gw.models.runtime import StageWorker
    from tests.models.toy_backends import SlotToy

    toy = SlotToy(slots=2)
    w = StageWorker(FaultyBackend(toy, FaultSpec.parse("toy:hang@2:1.5")), max_active=2, step_timeout_s=0.2)
    await w.start()
    try:
        a, b = w.submit(Req(n=None)), w.submit(Req(n=None))
        for s in (a, b):
            with pytest.raises(WorkerFault, match="exceeded"):
                await s.collect()
        # No warm-up while the abandoned step holds the slots (it could not take them all, and would
        # leak the ones it took): the worker is ready before the step returns, and its two slots come
        # back when it does.
        await wait_for(lambda: w.ready)
        assert w.restarts == 1 and len(toy.free) == 0
        await wait_for(lambda: len(toy.free) == 2, timeout=5.0)
        outs = await asyncio.gather(w.submit(Req(n=2)).collect(), w.submit(Req(n=2)).collect())
        assert outs == [[1, 2], [1, 2]]
        assert len(toy.free) == 2 and len(toy.released) == len(toy.opened)
    finally:
        await w.stop()


async def test_a_dying_thread_releases_every_state_before_the_new_warm_up() -> None:
    from realtime_gw.models.faults import FaultSpec, FaultyBackend
    from realtime_gw.models.runtime import StageWorker
    from tests.models.toy_backends import SlotToy

    toy = SlotToy(slots=2)
    w = StageWorker(FaultyBackend(toy, FaultSpec.parse("toy:die@2")), max_active=2)
    await w.start()
    try:
        a, b = w.submit(Req(n=None)), w.submit(Req(n=None))
        for s in (a, b):
            with pytest.raises(WorkerFault, match="worker failed"):
                await s.collect()
        await wait_for(lambda: w.ready)  # the warm-up took both slots: both were back
        assert w.restarts == 1 and len(toy.free) == 2
        assert await w.submit(Req(n=1)).collect() == [1]
    finally:
        await w.stop()


def test_an_iteration_that_dies_releases_the_states_it_opened() -> None:
    from realtime_gw.models.contract import Iteration, run_iteration
    from realtime_gw.models.faults import FaultSpec, FaultyBackend, InjectedThreadDeath
    from tests.models.toy_backends import SlotToy

    toy = SlotToy(slots=2)
    with pytest.raises(InjectedThreadDeath):
        run_iteration(
            FaultyBackend(toy, FaultSpec.parse("toy:die@1")), Iteration(open=[(Req(), [])], max_batch=2)
        )
    assert len(toy.free) == 2  # opened in the dying iteration: no stream owned it, so it was freed there


async def test_a_request_over_the_cost_bound_is_refused_at_submit(start_worker: Any) -> None:
    toy = Toy()
    w = await start_worker(toy, admit=lambda r: "too long" if r.n is not None and r.n > 5 else None)
    with pytest.raises(RequestRefused, match="too long"):  # a WorkerFault the client can act on
        await w.submit(Req(n=6)).collect()
    assert issubclass(RequestRefused, WorkerFault)
    assert toy.opened == [] and w.active_count == 0
    assert await w.submit(Req(n=2)).collect() == [1, 2]


async def test_slot_freed_wakes_a_waiter_when_a_request_leaves(start_worker: Any) -> None:
    w = await start_worker(Toy(), max_active=1, max_backlog=2)
    s = w.submit(Req(n=None))
    with pytest.raises(NoFreeSlot):
        w.submit(Req())
    waiter = asyncio.create_task(w.slot_freed(5.0))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    s.cancel()
    assert await waiter
    assert await w.submit(Req(n=1)).collect() == [1]
    assert not await w.slot_freed(0.01)  # nothing left since: a bounded wait, False


async def test_a_request_cancelled_before_it_opened_frees_its_place_for_a_waiter(start_worker: Any) -> None:
    w = await start_worker(Toy(), max_active=1, max_backlog=2)
    waiter = asyncio.create_task(w.slot_freed(5.0))
    await asyncio.sleep(0.01)  # the worker's loop idle, the waiter waiting
    s = w.submit(Req(n=None))
    s.cancel()  # before the worker's loop ran again: it never opens, and its place is free at once
    assert await asyncio.wait_for(waiter, 1.0)
    assert await w.submit(Req(n=1)).collect() == [1]


async def test_a_request_being_opened_keeps_its_slot(start_worker: Any) -> None:
    """While an iteration opens a request, that request holds its slot: a submit meanwhile is refused at
    once (``NoFreeSlot``), never admitted and then failed by a full backend."""
    from tests.models.toy_backends import GatedSlotToy

    toy = GatedSlotToy(slots=2)
    w = await start_worker(toy, max_active=2)
    a = w.submit(Req(n=None))
    await asyncio.to_thread(toy.opening.wait, 5.0)  # a's open is under way on the worker's thread
    b = w.submit(Req(n=None))
    assert w.active_count == 2
    with pytest.raises(NoFreeSlot):
        w.submit(Req(n=None))
    toy.gate.set()
    assert [await anext(aiter(s)) for s in (a, b)] == [1, 1]
    a.cancel()
    b.cancel()
    await wait_for(lambda: w.active_count == 0 and len(toy.free) == 2)


async def test_the_backends_slots_bound_the_worker(start_worker: Any) -> None:
    from tests.models.toy_backends import SlotToy

    toy = SlotToy(slots=2)
    w = await start_worker(toy, max_active=64)
    assert w.max_active == 2
    a, b = w.submit(Req(n=None)), w.submit(Req(n=None))
    with pytest.raises(NoFreeSlot):
        w.submit(Req(n=1))  # refused by the worker, not failed by the backend
    a.cancel()
    b.cancel()


async def test_clients_at_capacity_are_never_failed_by_a_full_backend(start_worker: Any) -> None:
    """Six clients share four slots of a backend whose steps take a while; each streams a turn, ends it,
    starts the next at once, and sometimes drops one midway. A full worker says so at submit (the client
    waits for a slot); no admitted request ever fails."""
    from tests.models.toy_backends import SlotToy

    toy = SlotToy(slots=4, step_s=0.003)
    w = await start_worker(toy, max_active=4, max_batch=4)
    refused = 0

    async def client(k: int) -> int:
        nonlocal refused
        turns = 0
        for turn in range(12):
            while True:
                try:
                    s = w.submit(Req(n=0))
                    break
                except NoFreeSlot:
                    refused += 1
                    await w.slot_freed(1.0)
            for i in range(3):
                s.push(f"{k}.{turn}.{i}")
                await asyncio.sleep(0.001 * ((k + i) % 4))  # the turn spans several steps
            if (k + turn) % 5 == 0:
                s.cancel()  # the client dropped this turn
                continue
            s.close_input()
            assert await s.collect() == [f"{k}.{turn}.{i}" for i in range(3)] + [END_OF_INPUT]
            turns += 1
        return turns

    done = await asyncio.wait_for(asyncio.gather(*(client(k) for k in range(6))), 20.0)
    assert sum(done) > 0 and refused > 0  # the pool really was full at times
    await wait_for(lambda: w.active_count == 0 and len(toy.free) == 4)
    assert len(toy.released) == len(toy.opened)
