"""The remote stage (front-end proxy + stage actor) without Ray: ``remote_fakes.LocalActor`` calls the
real ``StageActor`` with Ray's call syntax, pickling every message. The live two-front-end cluster is
tests/server/test_ray_frontends.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from realtime_gw.config import GatewayConfig
from realtime_gw.models.remote.client import RemoteStage, _Entry
from realtime_gw.models.remote.wire import Batch, Load
from realtime_gw.models.runtime import END_OF_INPUT, NoFreeSlot, Stream, WorkerFault
from tests.models.remote_fakes import LocalActor, toy_stage
from tests.models.toy_backends import Req

CONFIG = GatewayConfig(policy="none", ray_lease_s=0.3)

Frontend = Callable[..., Any]
Actors = Callable[..., list[LocalActor]]


@pytest.fixture
async def make_actors() -> AsyncIterator[Actors]:
    """``make_actors(n, max_active)``: replicas of a toy stage; killed at teardown."""
    made: list[LocalActor] = []

    def _make(n: int, max_active: int = 4) -> list[LocalActor]:
        made.extend(LocalActor(toy_stage(max_active), CONFIG) for _ in range(n))
        return made[-n:]

    yield _make
    for actor in made:
        await actor.kill(restart=False)


@pytest.fixture
async def frontend() -> AsyncIterator[Frontend]:
    """``await frontend(actors)``: a started ``RemoteStage``; stopped at teardown."""
    stages: list[RemoteStage] = []

    async def _start(actors: list[LocalActor]) -> RemoteStage:
        stage = RemoteStage("toy", actors)
        await stage.start()
        stages.append(stage)
        return stage

    yield _start
    for stage in stages:
        await stage.stop()


async def test_streams_run_remotely_as_locally(make_actors: Actors, frontend: Frontend) -> None:
    stage = await frontend(make_actors(1))
    assert stage.ready and stage.backend.voices == ("toy-voice",) and stage.max_active == 4
    counted = stage.submit(Req(n=3))
    echoed = stage.submit(Req(n=None))
    echoed.push("a")
    echoed.push("b")
    echoed.close_input()
    assert await counted.collect() == [1, 2, 3]
    assert await echoed.collect() == ["a", "b", END_OF_INPUT]


async def test_two_frontends_share_one_actor(make_actors: Actors, frontend: Frontend) -> None:
    shared = make_actors(1)
    one, two = await frontend(shared), await frontend(shared)
    a, b = one.submit(Req(n=2)), two.submit(Req(n=3))
    assert await asyncio.gather(a.collect(), b.collect()) == [[1, 2], [1, 2, 3]]
    assert shared[0].target.load().frontends == 2


async def test_new_streams_go_to_the_replica_with_most_free_slots(
    make_actors: Actors, frontend: Frontend
) -> None:
    replicas = make_actors(2)
    stage = await frontend(replicas)
    endless = [stage.submit(Req(n=None)) for _ in range(4)]
    await asyncio.sleep(0.3)  # opened, and both replicas' loads reported back
    assert [r.target.load().active for r in replicas] == [2, 2]
    for s in endless:
        s.cancel()


async def test_a_full_replica_passes_the_stream_to_the_next(make_actors: Actors, frontend: Frontend) -> None:
    replicas = make_actors(2, max_active=1)
    other, stage = await frontend(replicas), await frontend(replicas)
    held = other.submit(Req(n=None))
    await asyncio.sleep(0.1)
    # ``stage`` still believes both replicas are free: the first it tries may refuse; it goes on.
    mine = stage.submit(Req(n=None))
    outputs = aiter(mine)
    assert [await anext(outputs), await anext(outputs)] == [1, 2]
    with pytest.raises(NoFreeSlot):  # refused by both, or at once once their loads are known
        await stage.submit(Req(n=None)).collect()
    held.cancel()
    mine.cancel()


async def test_a_dead_replica_fails_its_streams_and_new_ones_go_to_the_live_one(
    make_actors: Actors, frontend: Frontend
) -> None:
    replicas = make_actors(2)
    stage = await frontend(replicas)
    streams = [stage.submit(Req(n=None)) for _ in range(2)]
    await asyncio.sleep(0.2)
    await replicas[0].kill(restart=False)
    with pytest.raises(WorkerFault, match="replica 0 died"):
        await asyncio.wait_for(streams[0].collect(), 5)
    assert not stage.replicas[0].ready
    assert await stage.submit(Req(n=2)).collect() == [1, 2]
    assert replicas[1].target.load().active == 1  # the survivor of the two endless streams
    streams[1].cancel()


async def test_a_restarted_replica_fails_the_old_streams_and_serves_again(
    make_actors: Actors, frontend: Frontend
) -> None:
    replicas = make_actors(1)
    stage = await frontend(replicas)
    old = stage.submit(Req(n=None))
    await asyncio.sleep(0.1)
    await replicas[0].kill(restart=True)
    with pytest.raises(WorkerFault):
        await asyncio.wait_for(old.collect(), 5)
    for _ in range(50):  # back once its next poll answers
        if stage.ready:
            break
        await asyncio.sleep(0.1)
    assert await stage.submit(Req(n=1)).collect() == [1]


async def test_a_silent_frontend_loses_its_streams_within_its_lease(
    make_actors: Actors, frontend: Frontend
) -> None:
    shared = make_actors(1)
    gone = await frontend(shared)
    for _ in range(3):
        gone.submit(Req(n=None))
    await asyncio.sleep(0.1)
    assert shared[0].target.streams_of(gone.frontend_id) == 3
    for task in gone._tasks:  # dies without a word: no more polls, no leave
        task.cancel()
    await asyncio.sleep(CONFIG.ray_lease_s * 1.5)
    assert shared[0].target.streams_of(gone.frontend_id) == 0
    assert shared[0].target.load().active == 0


async def test_the_actor_runs_a_stream_only_a_window_ahead_of_its_reader(
    make_actors: Actors, frontend: Frontend
) -> None:
    replicas = make_actors(1)
    stage = await frontend(replicas)
    stream = stage.submit(Req(n=None))
    await asyncio.sleep(0.3)  # nobody reads: ``max_backlog`` outputs unread, the actor stops the stream
    made = replicas[0].target.frontends[stage.frontend_id].streams[1].state.made
    assert made == stage.max_backlog
    got = []
    async for x in stream:
        got.append(x)
        if len(got) == made + 3:  # reading resumes it
            break
    assert got == list(range(1, made + 4))
    stream.cancel()


async def test_crossing_poll_answers_are_applied_in_the_actors_order() -> None:
    stage = RemoteStage("toy", [object()])  # never started: answers are handed in directly
    replica = stage.replicas[0]
    s: Stream[Any] = Stream(stage, Req(), 64)  # type: ignore[arg-type]
    stage._entries[1] = _Entry(1, s, replica, opened=True, confirmed=True)
    load = Load(ready=True, free_slots=1, max_active=1)

    def answer(seq: int, outputs: list[int], done: bool = False, record: int = 1) -> Batch:
        return Batch("inc", record, seq, load, [(1, outputs, done, None, 0.0)])

    stage._receive(replica, answer(2, [3, 4]))  # crossed the answer before it: waits
    assert s.backlog == 0
    stage._receive(replica, answer(1, [1, 2]))
    stage._receive(replica, answer(1, [5], record=2))  # the actor's next record of this front-end
    stage._receive(replica, answer(3, [99], record=1))  # a late answer of the old record: dropped
    stage._receive(replica, answer(2, [6], done=True, record=2))
    assert await s.collect() == [1, 2, 3, 4, 5, 6]
