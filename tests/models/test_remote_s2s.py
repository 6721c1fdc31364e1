"""The speech-to-speech stage as a stage actor shared by front-ends (``remote_stages = "s2s"``), without
Ray: ``remote_fakes.LocalActor`` calls the real ``StageActor`` hosting a tiny random Moshi (or
PersonaPlex) on its 80 ms lockstep, pickling every message as Ray would. The real Ray cluster with two
gateway front-ends is tests/server/test_ray_frontends.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np
import pytest

from realtime_gw.config import GatewayConfig
from realtime_gw.models.registry import build_stage
from realtime_gw.models.remote.client import RemoteStage
from realtime_gw.models.remote.metrics import REMOTE_DELIVERY
from realtime_gw.models.remote.settings import stage_settings
from realtime_gw.models.runtime import NoFreeSlot, Stream
from realtime_gw.protocols import realtime as rt
from realtime_gw.protocols.voices import prompt_sample
from realtime_gw.records.s2s import S2sFrame, S2sOpen, S2sSilence, VoiceCodes
from realtime_gw.records.voice import VoiceAdded, VoiceRegistration
from realtime_gw.server import s2s_link
from realtime_gw.server.client_secret_endpoint import config_settings
from realtime_gw.server.s2s_link import S2sLink
from realtime_gw.sessions.events import OpenS2s, S2sOpened, S2sRefused
from realtime_gw.sessions.settings import SessionError
from tests.models.remote_fakes import Cluster, LocalActor
from tests.models.waiting import wait_for

MOSHI = GatewayConfig(policy="none", s2s="moshi", s2s_slots=2, s2s_seed=5)
PERSONAPLEX = msgspec.structs.replace(MOSHI, s2s="personaplex")
STEPS = 6


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    made = Cluster(MOSHI)
    yield made
    await made.close()


def s2s_actor(cluster: Cluster, config: GatewayConfig = MOSHI) -> LocalActor:
    actor = LocalActor(build_stage, config, role="s2s")
    cluster.actors.append(actor)
    return actor


async def front_end(cluster: Cluster, actor: LocalActor, config: GatewayConfig = MOSHI) -> RemoteStage:
    stage = RemoteStage("s2s", [actor], stage_settings("s2s", config))
    await stage.start()
    cluster.stages.append(stage)
    return stage


async def steps(stream: Stream[Any], n: int = STEPS) -> list[tuple[S2sFrame, float]]:
    """The stream's first ``n`` steps (nothing pushed: the lockstep hears silence), each with when it
    arrived."""
    got: list[tuple[S2sFrame, float]] = []
    async for frame in stream:
        got.append((frame, time.monotonic()))
        if len(got) == n:
            return got
    raise AssertionError(f"the stream ended after {len(got)} steps")


def said(frames: list[tuple[S2sFrame, float]]) -> list[tuple[int, int, bytes]]:
    return [(f.index, f.text_token, f.pcm) for f, _ in frames]


def same_steps(a: list[tuple[int, int, bytes]], b: list[tuple[int, int, bytes]]) -> bool:
    """The same steps and tokens, and the same voice but for float rounding (a batch of another size
    rounds the decoder's sums otherwise: 1 LSB of PCM16)."""
    if [x[:2] for x in a] != [x[:2] for x in b]:
        return False
    pcm = [np.frombuffer(x[2], "<i2").astype(np.int32) for x in (*a, *b)]
    return all(int(np.abs(p - q).max()) <= 2 for p, q in zip(pcm[: len(a)], pcm[len(a) :], strict=True))


async def test_two_front_ends_step_their_conversations_on_one_actor_as_a_local_stage_does(
    cluster: Cluster,
) -> None:
    local = build_stage("s2s", MOSHI)
    await local.start()
    try:
        alone = [said(await steps(local.submit(S2sOpen(seed=seed)))) for seed in (7, 8)]
    finally:
        await local.stop()
    actor = s2s_actor(cluster)
    one, two = await front_end(cluster, actor), await front_end(cluster, actor)
    assert one.describe().s2s == two.describe().s2s == local.describe().s2s  # the session binds to it
    delivery = REMOTE_DELIVERY.labels("remote-s2s")
    before = (delivery._sum.get(), sum(b.get() for b in delivery._buckets))
    a, b = await one.open_stream(S2sOpen(seed=7)), await two.open_stream(S2sOpen(seed=8))
    got = await asyncio.gather(steps(a), steps(b))
    assert all(same_steps(said(g), a) for g, a in zip(got, alone, strict=True))  # the seeds, every frame
    assert actor.target.load().active == 2 and actor.target.load().frontends == 2
    for frames in got:  # one step per 80 ms tick, each relayed as its tick ends: no bunching
        span = frames[-1][1] - frames[1][1]
        assert 0.5 * (STEPS - 2) * 0.08 < span < 2.5 * (STEPS - 2) * 0.08
    hops = sum(b.get() for b in delivery._buckets) - before[1]
    assert hops >= 2 * STEPS and (delivery._sum.get() - before[0]) / hops < 0.02  # mean actor -> stream
    a.cancel()
    b.cancel()
    await wait_for(lambda: actor.target.load().active == 0, 2)  # their slots are free again


async def test_a_full_actor_refuses_a_new_conversation_at_once_and_a_freed_slot_is_taken(
    cluster: Cluster,
) -> None:
    actor = s2s_actor(cluster)
    holder, late = await front_end(cluster, actor), await front_end(cluster, actor)
    held = [await holder.open_stream(S2sOpen(seed=s)) for s in (1, 2)]
    for reported in (False, True):  # the actor refuses it, or this front-end already knows it is full
        if reported:
            await wait_for(
                lambda: late.replicas[0].load is not None and late.replicas[0].load.free_slots == 0, 2
            )
        start = time.monotonic()
        with pytest.raises(NoFreeSlot, match="no free slot"):
            await late.open_stream(S2sOpen(seed=3))
        assert time.monotonic() - start < 0.5  # never queued into lateness
    held[0].cancel()
    for _ in range(40):  # the slot frees at the actor's next tick; this front-end hears of it by its poll
        try:
            taken = await late.open_stream(S2sOpen(seed=3))
            break
        except NoFreeSlot:
            await late.slot_freed(0.2)
    else:
        raise AssertionError("the freed slot was never offered")
    assert len(await steps(taken, 2)) == 2


async def test_a_silence_switch_reaches_the_conversation_in_order_with_its_frames(cluster: Cluster) -> None:
    stage = await front_end(cluster, s2s_actor(cluster))
    free = said(await steps(await stage.open_stream(S2sOpen(seed=3)), 12))
    assert any(token not in (0, 3) for _, token, _ in free[4:])  # seed 3 speaks in these steps
    stream = await stage.open_stream(S2sOpen(seed=3))
    first = await steps(stream, 2)
    stream.push(S2sSilence(True))
    rest = await steps(stream, 10)
    assert same_steps(said(first), free[:2])
    assert all(f.padding for f, _ in rest[2:])  # forced silent from the step after it arrived


async def test_a_dead_front_ends_conversations_are_ended_within_its_lease(cluster: Cluster) -> None:
    actor = s2s_actor(cluster)
    gone, other = await front_end(cluster, actor), await front_end(cluster, actor)
    for seed in (1, 2):
        await gone.open_stream(S2sOpen(seed=seed))
    for task in gone._tasks:  # dies without a word: no heartbeat, no leave
        task.cancel()
    await wait_for(lambda: actor.target.load().active == 0, MOSHI.ray_lease_s * 3)
    assert actor.target.streams_of(gone.frontend_id) == 0
    await wait_for(lambda: (other.replicas[0].load or actor.target.load()).free_slots == 2, 2)
    assert len(await steps(await other.open_stream(S2sOpen(seed=4)), 2)) == 2


class Session:
    """A session's ``S2sLink`` on a remote stage, with what it posts to the session collected."""

    def __init__(self, stage: RemoteStage) -> None:
        self.posted: asyncio.Queue[Any] = asyncio.Queue()
        room = asyncio.Event()
        room.set()
        self.tasks: list[asyncio.Task[Any]] = []
        self.link = S2sLink(stage, self.posted.put, self.posted.put_nowait, self._spawn, room, -45.0)

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self.tasks.append(task)
        return task

    async def answer(self) -> Any:
        """The next thing posted that is not a step of the model."""
        while isinstance(item := await asyncio.wait_for(self.posted.get(), 5), S2sFrame):
            pass
        return item

    async def next_step(self) -> S2sFrame:
        while not isinstance(item := await asyncio.wait_for(self.posted.get(), 5), S2sFrame):
            pass
        return item

    def open(self, request: S2sOpen, reopen: bool = False) -> None:
        self.link.run(OpenS2s(request, "personaplex", reopen=reopen))


async def test_a_persona_crosses_the_wire_and_one_that_does_not_fit_keeps_the_open_conversation(
    cluster: Cluster,
) -> None:
    cluster.config = PERSONAPLEX
    actor = s2s_actor(cluster, PERSONAPLEX)
    stage = await front_end(cluster, actor, PERSONAPLEX)
    assert stage.admits and "persona" in (stage.describe().s2s or msgspec.UNSET).capabilities
    session = Session(stage)
    session.open(S2sOpen(seed=1, persona="You are Bo."))
    assert isinstance(await session.answer(), S2sOpened)
    first = session.link.stream
    session.open(S2sOpen(seed=1, persona="Extraordinary " * 10), reopen=True)
    refused = await session.answer()
    assert isinstance(refused, S2sRefused) and refused.prompt and "context holds" in refused.reason
    assert session.link.stream is first and not first.cancelled  # the open conversation goes on
    await session.next_step()
    session.open(S2sOpen(seed=2, persona="You are a pirate."), reopen=True)
    assert isinstance(await session.answer(), S2sOpened)
    assert session.link.stream is not first and first.cancelled
    await session.next_step()
    other = Session(stage)
    other.open(S2sOpen(seed=3))
    assert isinstance(await other.answer(), S2sOpened)
    gateway = SimpleNamespace(
        config=PERSONAPLEX, workers=SimpleNamespace(s2s=stage), s2s_voices_of=lambda key: lambda model: {}
    )
    long = rt.SessionParams(model="personaplex", instructions="Extraordinary " * 10)
    with pytest.raises(SessionError, match="context holds"):  # a client secret's too: refused at mint
        await config_settings(gateway, long)
    full = Session(stage)  # two slots, both held
    full.open(S2sOpen(seed=4))
    busy = await full.answer()
    assert isinstance(busy, S2sRefused) and not busy.prompt and "no free slot" in busy.reason
    for s in (session, other, full):
        s.link.close()
    await wait_for(lambda: actor.target.load().active == 0, 2)
    for s in (session, other, full):
        for task in s.tasks:
            task.cancel()


async def test_an_open_no_replica_answers_is_refused_in_time(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s2s_link, "OPEN_ANSWER_S", 0.3)
    actor = s2s_actor(cluster)
    stage = await front_end(cluster, actor)

    async def hung(frontend_id: str, msg: Any) -> None:
        await asyncio.Event().wait()

    actor.target.send = hung  # type: ignore[method-assign]  # the actor takes the call and never answers
    session = Session(stage)
    session.open(S2sOpen(seed=1))
    refused = await session.answer()
    assert isinstance(refused, S2sRefused) and not refused.prompt and "no replica answered" in refused.reason
    assert session.link.stream is None


async def test_a_custom_voice_made_on_one_replica_opens_on_another_and_after_a_restart(cluster: Cluster) -> None:
    """The stage keeps no custom voice: a registration only encodes, and the opening that names the voice
    carries its codes, so a replica that never saw it (or one restarted) opens it, checked by its own
    ``admit`` (``RemoteStage.check`` asks any ready replica)."""
    cluster.config = PERSONAPLEX
    maker, other = s2s_actor(cluster, PERSONAPLEX), s2s_actor(cluster, PERSONAPLEX)
    t = np.arange(24000) / 24000
    sample = prompt_sample((0.2 * np.sin(2 * np.pi * 170 * t)).astype(np.float32))
    made = (await front_end(cluster, maker, PERSONAPLEX)).submit(VoiceRegistration("voice_ann", "audio_sample", sample=sample))
    [added] = [x async for x in made]
    assert isinstance(added, VoiceAdded) and len(added.codes) == 13
    request = S2sOpen(seed=1, voice="voice_ann", custom_voice=VoiceCodes(added.codes, added.card))
    stage = await front_end(cluster, other, PERSONAPLEX)
    assert "unknown voice" in (await stage.check(S2sOpen(voice="voice_ann")) or "")  # nothing kept by name
    first = said(await steps(await stage.open_stream(request), 3))
    foreign = msgspec.structs.replace(request, custom_voice=VoiceCodes(added.codes, added.card + 1))
    assert "made by another codec" in (await stage.check(foreign) or "")
    await other.kill()  # restarted: a fresh stage, the same voice
    await wait_for(lambda: all(r.ready for r in stage.replicas), 10)
    assert await stage.check(request) is None
    assert same_steps(said(await steps(await stage.open_stream(request), 3)), first)
