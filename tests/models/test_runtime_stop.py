"""StageWorker.stop while a step is under way on the worker's thread: every state the backend opened is
released exactly once, and never while a step that uses it still runs."""

from __future__ import annotations

import asyncio

import pytest

from realtime_gw.models.runtime import StageWorker, WorkerFault
from tests.models.toy_backends import BlockingToy, Req
from tests.models.waiting import wait_for


async def stop_during_blocked_step(toy: BlockingToy, worker: StageWorker) -> None:
    """Stop ``worker`` while ``toy``'s blocking step waits, and let the step return only once stop is
    under way (its schedule cancelled), with room for a release that would not wait for the step."""
    await wait_for(toy.stepping.is_set, timeout=2.0)
    stopping = asyncio.create_task(worker.stop())
    await wait_for(lambda: worker._task is not None and worker._task.done(), timeout=2.0)
    await asyncio.sleep(0.05)
    toy.go.set()
    await asyncio.wait_for(stopping, 5.0)


def assert_each_released_once(toy: BlockingToy) -> None:
    assert toy.released_mid_step == []
    assert len(toy.opened) > 0
    assert {id(st): toy.releases.get(id(st), 0) for st in toy.opened} == {id(st): 1 for st in toy.opened}


async def test_stop_during_a_step_that_finishes_one_stream_releases_each_state_once() -> None:
    # Step 1 opens both; step 2 (blocked) finishes one (released by that iteration) and goes on with
    # the other (released by stop, after the step).
    toy = BlockingToy(block_at=2)
    worker = StageWorker(toy, max_backlog=4)
    await worker.start(warmup=False)
    ending, endless = worker.submit(Req(n=2)), worker.submit(Req(n=None))
    await wait_for(toy.stepping.is_set, timeout=2.0)
    waiting = worker.submit(Req(n=1))  # queued behind the blocked step: never opened
    await stop_during_blocked_step(toy, worker)
    assert len(toy.opened) == 2
    assert_each_released_once(toy)
    assert ending.cancelled and endless.cancelled and waiting.cancelled


async def test_stop_during_the_step_that_opens_requests_releases_what_it_opened() -> None:
    # Step 1 (blocked) opens both requests: no stream holds their states yet.
    toy = BlockingToy(block_at=1)
    worker = StageWorker(toy)
    await worker.start(warmup=False)
    worker.submit(Req(n=1))
    worker.submit(Req(n=None))
    await stop_during_blocked_step(toy, worker)
    assert len(toy.opened) == 2
    assert_each_released_once(toy)


async def test_a_step_abandoned_before_stop_gives_its_states_back_when_it_returns() -> None:
    # Step 2 hangs past the deadline: the worker abandons it and restarts; it is stopped while the step
    # still holds both states, which go back when the step returns.
    toy = BlockingToy(block_at=2)
    worker = StageWorker(toy, step_timeout_s=0.2, max_backlog=4)
    await worker.start(warmup=False)
    streams = [worker.submit(Req(n=None)), worker.submit(Req(n=None))]
    for s in streams:
        with pytest.raises(WorkerFault, match="exceeded"):
            await s.collect()
    await wait_for(lambda: worker.ready)
    await asyncio.wait_for(worker.stop(), 2.0)
    assert toy.released == []
    toy.go.set()
    await wait_for(lambda: len(toy.released) == 2, timeout=2.0)
    assert len(toy.opened) == 2
    assert_each_released_once(toy)
