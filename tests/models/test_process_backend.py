"""A backend hosted in a child process (``ProcessBackend``) behind the ordinary stage worker: same
results as in-thread; a hung or GIL-holding step is killed at the deadline, its streams fail, a fresh
child serves and every slot is back; a child holding the GIL never stalls the event loop."""

from __future__ import annotations

import asyncio
import functools
import os
import pickle
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from realtime_gw.models.faults import FaultyFactory
from realtime_gw.models.process_backend import ProcessBackend
from realtime_gw.models.runtime import END_OF_INPUT, NoFreeSlot, StageWorker, WorkerFault
from tests.models.toy_backends import Req, SlotToy, WarmingToy
from tests.models.waiting import wait_for

StartHosted = Callable[..., Awaitable[StageWorker]]


@pytest.fixture
async def start_hosted() -> AsyncIterator[StartHosted]:
    """``await start_hosted(*fault_specs, spare=False, **StageWorker kwargs)``: a two-slot ``SlotToy``
    in a child process."""
    workers: list[StageWorker] = []

    async def _start(*faults: str, spare: bool = False, **kwargs: Any) -> StageWorker:
        factory = FaultyFactory("toy", functools.partial(SlotToy, 2), faults)
        worker = StageWorker(ProcessBackend(factory, name="slot-toy", spare=spare), **kwargs)
        await worker.start()
        workers.append(worker)
        return worker

    yield _start
    for worker in workers:
        await worker.stop()


async def test_a_hosted_backend_serves_as_it_would_in_a_thread(start_hosted: StartHosted) -> None:
    w = await start_hosted(max_batch=8)
    backend: ProcessBackend = w.backend  # type: ignore[assignment]
    assert backend.pid is not None and backend.pid != os.getpid()
    assert backend.describe().voices == ("toy-voice",)  # the description crosses at start
    a, b = w.submit(Req(n=3)), w.submit(Req(n=0))
    b.push("x")
    b.close_input()  # END_OF_INPUT crosses the pipe and is still END_OF_INPUT there
    outs = await asyncio.gather(a.collect(), b.collect())
    assert outs == [[1, 2, 3], ["x", END_OF_INPUT]]
    assert pickle.loads(pickle.dumps(END_OF_INPUT)) is END_OF_INPUT
    await wait_for(lambda: w.active_count == 0)


async def test_request_faults_stay_with_their_request(start_hosted: StartHosted) -> None:
    w = await start_hosted()
    with pytest.raises(WorkerFault, match="kaboom"):
        await w.submit(Req(boom=True)).collect()  # step raised in the child: that batch fails
    with pytest.raises(WorkerFault, match="full"):
        await w.submit(Req(full=True)).collect()  # open raised in the child: that request fails
    assert await w.submit(Req(n=2)).collect() == [1, 2]
    assert w.restarts == 0


async def test_cancel_gives_the_slot_back_in_the_child(start_hosted: StartHosted) -> None:
    w = await start_hosted(max_active=3, max_backlog=2)
    a = w.submit(Req(n=None))
    assert await anext(aiter(a)) == 1
    a.cancel()
    await wait_for(lambda: w.active_count == 0)
    # both slots free again: two endless streams open, a third is refused (the child's two slots
    # bound the worker, whatever its max_active)
    assert w.max_active == 2
    b, c = w.submit(Req(n=None)), w.submit(Req(n=None))
    assert [await anext(aiter(s)) for s in (b, c)] == [1, 1]
    with pytest.raises(NoFreeSlot):
        w.submit(Req(n=1))
    b.cancel()
    c.cancel()


@pytest.mark.parametrize("fault", ["hang@2:60", "spin@2:60"])
async def test_a_stuck_step_is_killed_and_every_slot_comes_back(
    start_hosted: StartHosted, fault: str
) -> None:
    """``hang`` sleeps, ``spin`` holds the child's GIL in a busy loop: either way the child is killed at
    the deadline, a fresh one (warmed up, no fault) serves, and both slots are free."""
    w = await start_hosted(f"toy:{fault}", max_active=3, step_timeout_s=1.0)
    backend: ProcessBackend = w.backend  # type: ignore[assignment]
    first_pid = backend.pid
    a, b = w.submit(Req(n=None)), w.submit(Req(n=None))
    for s in (a, b):
        with pytest.raises(WorkerFault, match="exceeded 1 s"):
            await s.collect()
    await wait_for(lambda: w.ready, timeout=30.0)
    assert w.restarts == 1 and backend.launches == 2 and backend.pid != first_pid
    c, d = w.submit(Req(n=None)), w.submit(Req(n=None))
    assert [await anext(aiter(s)) for s in (c, d)] == [1, 1]  # the two slots of the fresh child
    with pytest.raises(NoFreeSlot):
        w.submit(Req(n=1))
    c.cancel()
    d.cancel()
    await wait_for(lambda: w.active_count == 0)


async def test_a_reset_switches_to_the_warm_spare(start_hosted: StartHosted) -> None:
    w = await start_hosted("toy:hang@1:60", spare=True, step_timeout_s=1.0)
    backend: ProcessBackend = w.backend  # type: ignore[assignment]
    await wait_for(lambda: backend._spare is not None, timeout=30.0)  # prepared after the first warm-up
    spare_pid = backend._spare.process.pid  # type: ignore[union-attr]
    with pytest.raises(WorkerFault, match="exceeded"):
        await w.submit(Req(n=1)).collect()
    await wait_for(lambda: w.ready, timeout=30.0)
    assert backend.pid == spare_pid  # no fresh start on the recovery path
    assert await w.submit(Req(n=2)).collect() == [1, 2]  # launched second: no fault in it
    await wait_for(lambda: backend._spare is not None, timeout=30.0)  # and the next spare is ready
    assert backend.launches == 3


async def test_a_child_that_dies_is_replaced(start_hosted: StartHosted) -> None:
    w = await start_hosted("toy:die@1")
    with pytest.raises(WorkerFault, match="worker failed"):
        await w.submit(Req(n=2)).collect()
    await wait_for(lambda: w.ready, timeout=30.0)
    assert w.restarts == 1
    assert await w.submit(Req(n=2)).collect() == [1, 2]


async def test_a_child_killed_while_idle_is_replaced_at_the_next_request(start_hosted: StartHosted) -> None:
    w = await start_hosted()
    backend: ProcessBackend = w.backend  # type: ignore[assignment]
    backend._process.kill()  # e.g. the OOM killer
    backend._process.join()
    with pytest.raises(WorkerFault, match="worker failed"):
        await w.submit(Req(n=1)).collect()  # its states died with it: nothing is sent to a stranger
    await wait_for(lambda: w.ready, timeout=30.0)
    assert await w.submit(Req(n=1)).collect() == [1]


async def test_a_child_holding_the_gil_does_not_stall_the_event_loop(start_hosted: StartHosted) -> None:
    """The child spins 1.5 s in C calls that never release its GIL; the parent's loop keeps ticking
    (the same spin on a worker thread would hold the parent's GIL: see loadtest/bench/isolation.py)."""
    w = await start_hosted("toy:spin@1:1.5", step_timeout_s=30.0)
    loop = asyncio.get_running_loop()
    lags: list[float] = []

    async def tick() -> None:
        while True:
            t = loop.time()
            await asyncio.sleep(0.01)
            lags.append(loop.time() - t - 0.01)

    ticker = asyncio.create_task(tick())
    t0 = loop.time()
    assert await w.submit(Req(n=1)).collect() == [1]
    spun = loop.time() - t0
    ticker.cancel()
    assert spun >= 1.5  # the spin really ran (a lower bound, not a speed claim)
    assert len(lags) > 20 and max(lags) < 1.0  # loose: the box is shared; in-thread it would be ~1.5 s


async def test_stop_ends_the_child(start_hosted: StartHosted) -> None:
    w = await start_hosted()
    backend: ProcessBackend = w.backend  # type: ignore[assignment]
    process = backend._process
    await w.stop()
    assert process is not None and not process.is_alive()
    assert backend.pid is None


def test_direct_use_outside_a_worker() -> None:
    backend = ProcessBackend(functools.partial(SlotToy, 1), name="slot-toy")
    try:
        state = backend.open(Req(n=2))
        assert backend.has_work(state)
        with pytest.raises(NoFreeSlot):
            backend.open(Req())
        assert backend.step([(state, [])])[0].outputs == [1]
        backend.release(state)
        assert backend.open(Req(n=1)) is not None  # the slot came back
    finally:
        backend.close()


def test_the_description_is_read_again_after_the_warmup() -> None:
    """The child sends its backend's description when built and again after the warm-up (which fills the
    report); a fresh child after a reset describes itself anew."""
    backend = ProcessBackend(WarmingToy, name="warming-toy")
    try:
        assert backend.describe().warmup_report == {}
        backend.warmup()
        assert backend.describe().warmup_report == {"warm_batches": 1}
        backend.reset()
        assert backend.describe().warmup_report == {}
    finally:
        backend.close()
