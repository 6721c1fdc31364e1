"""The remote stage (front-end proxy + stage actor) without Ray: ``remote_fakes.LocalActor`` calls the
real ``StageActor`` with Ray's call syntax, pickling every message. The live two-front-end cluster is
tests/server/test_ray_frontends.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from realtime_gw.config import ConfigError, GatewayConfig
from realtime_gw.models.remote import replica as remote_replica
from realtime_gw.models.remote.actor import EXPIRED_KEEP_LEASES, StageActor
from realtime_gw.models.remote.client import POLLS, RemoteStage
from realtime_gw.models.remote.replica import Entry
from realtime_gw.models.remote.settings import SECRETS, actor_config, stage_settings
from realtime_gw.models.remote.wire import Batch, Load
from realtime_gw.models.runtime import (
    END_OF_INPUT,
    NoFreeSlot,
    RequestRefused,
    StageWorker,
    Stream,
    WorkerFault,
)
from tests.models.remote_fakes import Cluster, LocalActor, toy_stage
from tests.models.toy_backends import Req, Toy
from tests.models.waiting import wait_for

CONFIG = GatewayConfig(policy="none", ray_lease_s=0.3)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    made = Cluster(CONFIG)
    yield made
    await made.close()


async def test_streams_run_remotely_as_locally(cluster: Cluster) -> None:
    stage, _ = await cluster.serve()
    assert stage.ready and stage.describe().voices == ("toy-voice",) and stage.max_active == 4
    counted = stage.submit(Req(n=3))
    echoed = stage.submit(Req(n=None))
    echoed.push("a")
    echoed.push("b")
    echoed.close_input()
    assert await counted.collect() == [1, 2, 3]
    assert await echoed.collect() == ["a", "b", END_OF_INPUT]


async def test_two_frontends_share_one_actor(cluster: Cluster) -> None:
    shared = cluster.replicas(1)
    one, two = await cluster.frontend(shared), await cluster.frontend(shared)
    a, b = one.submit(Req(n=2)), two.submit(Req(n=3))
    assert await asyncio.gather(a.collect(), b.collect()) == [[1, 2], [1, 2, 3]]
    assert shared[0].target.load().frontends == 2


async def test_new_streams_go_to_the_replica_with_most_free_slots(cluster: Cluster) -> None:
    stage, replicas = await cluster.serve(2)
    endless = [stage.submit(Req(n=None)) for _ in range(4)]
    # opened, and both replicas' loads reported back
    await wait_for(lambda: sum(r.target.load().active for r in replicas) == 4, 5)
    assert [r.target.load().active for r in replicas] == [2, 2]
    for s in endless:
        s.cancel()


async def test_a_full_replica_passes_the_stream_to_the_next(cluster: Cluster) -> None:
    replicas = cluster.replicas(2, max_active=1)
    other, stage = await cluster.frontend(replicas), await cluster.frontend(replicas)
    held = other.submit(Req(n=None))
    await wait_for(lambda: sum(r.target.load().active for r in replicas) == 1, 5)
    # ``stage`` still believes both replicas are free: the first it tries may refuse; it goes on.
    mine = stage.submit(Req(n=None))
    outputs = aiter(mine)
    assert [await anext(outputs), await anext(outputs)] == [1, 2]
    with pytest.raises(NoFreeSlot):  # refused by both, or at once once their loads are known
        await stage.submit(Req(n=None)).collect()
    held.cancel()
    mine.cancel()


async def test_a_dead_replica_fails_its_streams_and_new_ones_go_to_the_live_one(cluster: Cluster) -> None:
    stage, replicas = await cluster.serve(2)
    streams = [stage.submit(Req(n=None)) for _ in range(2)]
    await wait_for(lambda: sum(r.target.load().active for r in replicas) == 2, 5)
    await replicas[0].kill(restart=False)
    with pytest.raises(WorkerFault, match="replica 0 died"):
        await asyncio.wait_for(streams[0].collect(), 5)
    assert not stage.replicas[0].ready
    assert await stage.submit(Req(n=2)).collect() == [1, 2]
    assert replicas[1].target.load().active == 1  # the survivor of the two endless streams
    streams[1].cancel()


async def test_a_restarted_replica_fails_the_old_streams_and_serves_again(cluster: Cluster) -> None:
    stage, replicas = await cluster.serve()
    old = stage.submit(Req(n=None))
    await wait_for(lambda: replicas[0].target.load().active == 1, 5)
    await replicas[0].kill(restart=True)
    with pytest.raises(WorkerFault):
        await asyncio.wait_for(old.collect(), 5)
    await wait_for(lambda: stage.ready, 5)  # back once its result stream is open again
    assert await stage.submit(Req(n=1)).collect() == [1]


async def test_a_restarted_replica_is_routed_to_once_up_not_after_the_grace_for_calls_made_meanwhile(
    cluster: Cluster,
) -> None:
    stage, replicas = await cluster.serve()
    old = stage.submit(Req(n=None))
    await wait_for(lambda: replicas[0].target.load().active == 1, 5)
    await replicas[0].kill(restart=True, restarting_s=0.3, grace_s=5.0)
    killed_at = time.monotonic()
    with pytest.raises(WorkerFault):
        await asyncio.wait_for(old.collect(), 5)
    while not stage.ready:
        # The polls made during the restart fail only after 5 s; pings find the actor up at ~1 s.
        assert time.monotonic() - killed_at < 4.5, (
            "the restarted replica was not used until the grace ran out"
        )
        await asyncio.sleep(0.05)
    assert await stage.submit(Req(n=1)).collect() == [1]


async def test_a_restarted_replica_too_slow_to_answer_pings_is_polled_all_the_same(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote_replica, "PINGS", 2)
    stage, replicas = await cluster.serve()
    await replicas[0].kill(restart=True, restarting_s=0.3)  # calls made meanwhile fail: polls too

    async def never() -> str:
        await asyncio.sleep(60)
        return ""

    replicas[0].target.ping = never  # alive and polled, but no ping answers in time
    killed_at = time.monotonic()
    while stage.ready:  # until a poll has failed
        assert time.monotonic() - killed_at < 2.0, "the kill was not noticed"
        await asyncio.sleep(0.01)
    while not stage.ready:
        assert time.monotonic() - killed_at < 5.0, "polls never resumed while pings went unanswered"
        await asyncio.sleep(0.05)
    assert await stage.submit(Req(n=1)).collect() == [1]


async def test_a_silent_frontend_loses_its_streams_within_its_lease(cluster: Cluster) -> None:
    shared = cluster.replicas(1)
    gone = await cluster.frontend(shared)
    for _ in range(3):
        gone.submit(Req(n=None))
    await wait_for(lambda: shared[0].target.streams_of(gone.frontend_id) == 3, 5)
    for task in gone._tasks:  # dies without a word: no more heartbeats, no leave
        task.cancel()
    await wait_for(lambda: shared[0].target.load().active == 0, CONFIG.ray_lease_s * 1.5)
    assert shared[0].target.streams_of(gone.frontend_id) == 0
    assert shared[0].target.load().active == 0


@pytest.mark.parametrize("forgotten", [False, True])
async def test_a_frontend_back_after_its_lease_expired_fails_its_streams_and_serves_again(
    cluster: Cluster, forgotten: bool
) -> None:
    """``forgotten``: back after the actor stopped remembering its expiry (no ``lost``): the new record
    it is answered from tells it all the same."""
    stage, replicas = await cluster.serve()
    stalled = stage.submit(Req(n=None))
    await wait_for(lambda: replicas[0].target.load().active == 1, 5)
    for task in stage._tasks:  # a stall past the lease: no call reaches the actor
        task.cancel()
    await wait_for(lambda: replicas[0].target.load().active == 0, CONFIG.ray_lease_s * 1.5)
    assert replicas[0].target.load().active == 0
    if forgotten:
        replicas[0].target.expired.clear()
    stage._tasks = [asyncio.create_task(stage._send_loop())]  # it speaks again
    stage._tasks += [asyncio.create_task(stage._poll_loop(stage.replicas[0])) for _ in range(POLLS)]
    with pytest.raises(WorkerFault, match="lease on replica 0 expired"):
        await asyncio.wait_for(stalled.collect(), 5)
    assert await asyncio.wait_for(stage.submit(Req(n=2)).collect(), 5) == [1, 2]


async def test_the_actor_runs_a_stream_only_a_window_ahead_of_its_reader(cluster: Cluster) -> None:
    stage, replicas = await cluster.serve()
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


async def test_a_frontend_with_other_stage_settings_refuses_to_start(cluster: Cluster) -> None:
    replicas = cluster.replicas(1)
    other = msgspec.structs.replace(CONFIG, tts_max_batch=CONFIG.tts_max_batch + 1, api_key="secret")
    with pytest.raises(ConfigError, match=f"tts_max_batch={CONFIG.tts_max_batch + 1} here"):
        await cluster.frontend(replicas, settings=stage_settings("tts", other))
    # front-end-only fields (port, API keys, limits) may differ
    same = msgspec.structs.replace(CONFIG, port=9999, api_key="secret", max_sessions=3)
    stage = await cluster.frontend(replicas, settings=stage_settings("tts", same))
    assert await stage.submit(Req(n=1)).collect() == [1]


def test_only_the_roles_own_test_faults_are_stage_settings() -> None:
    config = msgspec.structs.replace(CONFIG, fault_injection=["asr:raise@2", "tts:hang@3:5"])
    assert stage_settings("tts", config)["fault_injection"] == ["tts:hang@3:5"]
    assert stage_settings("policy", config)["fault_injection"] == []


def test_actors_get_no_secrets_and_settings_hold_none() -> None:
    config = msgspec.structs.replace(CONFIG, api_key="k1", api_keys=["k2"], responder_api_key="k3")
    sent = actor_config(config)
    assert (sent.api_key, sent.api_keys, sent.responder_api_key) == (None, [], None)
    assert sent.tts == config.tts and sent.policy_device == config.policy_device
    for role in ("tts", "asr", "vad", "turn", "policy"):
        settings = stage_settings(role, config)
        assert not set(SECRETS) & set(settings)
        assert not {"k1", "k2", "k3"} & {str(v) for v in settings.values()}


async def test_crossing_poll_answers_are_applied_in_the_actors_order() -> None:
    stage = RemoteStage("toy", [object()])  # never started: answers are handed in directly
    replica = stage.replicas[0]
    s: Stream[Any] = Stream(stage, Req(), 64)  # type: ignore[arg-type]
    stage._entries[1] = Entry(1, s, replica, opened=True, confirmed=True)
    load = Load(ready=True, free_slots=1, max_active=1)

    def answer(seq: int, outputs: list[int], done: bool = False, record: int = 1) -> Batch:
        return Batch("inc", record, seq, load, [(1, outputs, done, None, 0.0)])

    stage._receive(replica, answer(2, [3, 4]))  # crossed the answer before it: waits
    assert s.backlog == 0
    stage._receive(replica, answer(1, [1, 2]))
    # The actor's next record of this front-end: it dropped the front-end (lease) and its streams.
    stage._receive(replica, answer(1, [5], record=2))
    stage._receive(replica, answer(3, [99], record=1))  # a late answer of the old record: dropped
    got = []
    with pytest.raises(WorkerFault, match="lease on replica 0 expired"):
        async for x in s:
            got.append(x)
    assert got == [1, 2, 3, 4]


async def test_a_stream_opened_while_the_lease_loss_is_on_its_way_leaves_no_slot_behind(
    cluster: Cluster,
) -> None:
    """The actor has answered a poll with ``lost``, the answer is still travelling, and the front-end
    opens a stream meanwhile: the front-end fails that stream too when the answer lands (it cannot tell
    which of its streams the loss covers), so the actor must end it as well, not hold its slot."""
    stage, replicas = await cluster.serve()
    stalled = stage.submit(Req(n=None))
    await wait_for(lambda: replicas[0].target.load().active == 1, 5)
    for task in stage._tasks:  # a stall past the lease
        task.cancel()
    await wait_for(lambda: stage.frontend_id in replicas[0].target.expired, CONFIG.ray_lease_s * 1.5)
    stage._tasks = [asyncio.create_task(stage._send_loop())]  # it speaks again, its polls not yet back
    lost_poll = asyncio.ensure_future(stage.replicas[0].actor.next_batch.remote(stage.frontend_id, 1.0))
    await asyncio.sleep(0.05)  # the actor has taken the expiry; its answer waits for a result
    late = stage.submit(Req(n=None))
    batch = await asyncio.wait_for(lost_poll, 5)
    assert batch.lost and batch.results  # the late stream's first results ride on the loss
    stage._receive(stage.replicas[0], batch)
    for stream in (stalled, late):
        with pytest.raises(WorkerFault, match="lease on replica 0 expired"):
            await asyncio.wait_for(stream.collect(), 5)
    stage._tasks += [asyncio.create_task(stage._poll_loop(stage.replicas[0])) for _ in range(POLLS)]
    for _ in range(50):
        if replicas[0].target.load().active == 0:
            break
        await asyncio.sleep(0.05)
    assert replicas[0].target.streams_of(stage.frontend_id) == 0
    assert replicas[0].target.load().active == 0
    assert await asyncio.wait_for(stage.submit(Req(n=2)).collect(), 5) == [1, 2]


def test_an_expired_frontend_is_remembered_for_a_bounded_time() -> None:
    """The actor tells a front-end back after its lease ran out that its streams are gone (``lost``),
    but forgets one that never comes back (the client tells a new record from its old one anyway)."""
    actor = StageActor(toy_stage(), "tts", CONFIG)  # never started: the reaper's pass is called directly
    gone, idle = actor._frontend("gone"), actor._frontend("idle")
    held: Stream[Any] = Stream(actor.worker, Req(n=None), 4)
    gone.streams[1] = held  # type: ignore[assignment]
    t = max(gone.seen, idle.seen) + CONFIG.ray_lease_s + 0.01
    actor._reap_once(t)
    assert not actor.frontends and held.cancelled
    assert list(actor.expired) == ["gone"]  # ``idle`` held nothing: nothing to tell it
    keep_s = EXPIRED_KEEP_LEASES * CONFIG.ray_lease_s
    actor._reap_once(t + keep_s)
    assert list(actor.expired) == ["gone"]
    actor._reap_once(t + keep_s + 0.01)
    assert not actor.expired


async def _eventually(check: Any, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    assert check()


async def test_a_restarted_replica_is_described_again(cluster: Cluster) -> None:
    """Ray restarted the actor: the front-end shows the new incarnation's attributes (``/readyz``'s
    warm-up report) once it has them, and streams go to it again."""
    builds = []

    def build(role: str, config: GatewayConfig) -> StageWorker:
        class ReportingToy(Toy):
            warmup_report = {"build": len(builds)}

        builds.append(role)
        return StageWorker(ReportingToy())

    replica = LocalActor(build, CONFIG)
    cluster.actors.append(replica)
    stage = await cluster.frontend([replica], settings=stage_settings("tts", CONFIG))
    assert stage.describe().warmup_report == {"build": 0}
    await replica.kill(restart=True)
    await _eventually(lambda: stage.ready and stage.describe().warmup_report == {"build": 1})
    assert stage.replicas[0].described == replica.target.incarnation
    assert await asyncio.wait_for(stage.submit(Req(n=2)).collect(), 5) == [1, 2]


async def test_a_replica_restarted_with_other_settings_is_left_out_not_fatal(cluster: Cluster) -> None:
    replicas = cluster.replicas(2)
    stage = await cluster.frontend(replicas, settings=stage_settings("tts", CONFIG))
    other = msgspec.structs.replace(CONFIG, tts_max_batch=CONFIG.tts_max_batch + 1)
    replicas[0]._make = lambda: StageActor(toy_stage(), "tts", other)
    await replicas[0].kill(restart=True)
    await _eventually(lambda: stage.replicas[0].mismatch is not None)
    assert "tts_max_batch" in str(stage.replicas[0].mismatch)
    await asyncio.sleep(0.3)  # its polls go on: it stays out
    assert not stage.replicas[0].ready and stage.replicas[1].ready and stage.ready
    assert await asyncio.wait_for(stage.submit(Req(n=2)).collect(), 5) == [1, 2]
    assert replicas[0].target.load().active == 0


async def test_a_remote_backends_warmup_report_reaches_the_front_end(cluster: Cluster) -> None:
    """``/readyz`` lists what a backend's warm-up built (the policy's compiled buckets) from
    ``describe().warmup_report``: a remote stage's front-end has the actor's."""

    class ReportingToy(Toy):
        warmup_report = {"buckets_compiled": [1, 2], "buckets_uncompiled": [4]}

    replica = LocalActor(lambda role, config: StageWorker(ReportingToy()), CONFIG)
    cluster.actors.append(replica)
    stage = await cluster.frontend([replica])
    assert stage.describe().warmup_report == ReportingToy.warmup_report


async def test_a_request_the_remote_worker_refuses_is_a_refusal_at_the_front_end(cluster: Cluster) -> None:
    """The actor's worker refuses at submit (its ``admit``): the front-end's stream raises
    ``RequestRefused`` (the client's to change, e.g. HTTP 400), as a local worker's would."""
    replicas = cluster.replicas(1, admit=lambda r: "too long" if r.n is not None and r.n > 5 else None)
    stage = await cluster.frontend(replicas)
    with pytest.raises(RequestRefused, match="too long"):
        await stage.submit(Req(n=6)).collect()
    assert await stage.submit(Req(n=2)).collect() == [1, 2]
