"""StageWorker behaviour with a toy backend: batching, cancellation, slots, faults, flow control."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from realtime_gw.models.runtime import END_OF_INPUT, NoFreeSlot, StepResult, WorkerFault


@dataclass
class Req:
    n: int | None = 3
    """Outputs to generate; None = forever."""
    boom: bool = False
    """The backend's step raises when this request is in the batch."""
    full: bool = False
    """The backend's open raises NoFreeSlot."""


@dataclass(eq=False)
class St:
    req: Req
    made: int = 0
    inputs: list[Any] = field(default_factory=list)


class Toy:
    """Counts up to ``req.n``; one output per step; echoes pushed inputs as outputs."""

    name = "toy"

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.opened: list[St] = []
        self.released: list[St] = []
        self.threads: set[int] = set()

    def open(self, request: Req) -> St:
        self.threads.add(threading.get_ident())
        if request.full:
            raise NoFreeSlot("toy: full")
        st = St(request)
        self.opened.append(st)
        return st

    def step(self, work: list[tuple[St, list[Any]]]) -> list[StepResult]:
        self.threads.add(threading.get_ident())
        self.batches.append(len(work))
        if any(st.req.boom for st, _ in work):
            raise RuntimeError("kaboom")
        results = []
        for st, inputs in work:
            st.inputs += inputs
            if inputs:
                results.append(StepResult(outputs=list(inputs), done=inputs[-1] is END_OF_INPUT))
                continue
            st.made += 1
            results.append(StepResult(outputs=[st.made], done=st.req.n is not None and st.made >= st.req.n))
        return results

    def release(self, state: St) -> None:
        self.threads.add(threading.get_ident())
        self.released.append(state)

    def has_work(self, state: St) -> bool:
        return state.req.n is None or state.made < state.req.n

    def warmup(self) -> None:
        pass


async def wait_for(cond: Any, timeout: float = 1.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


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
