"""A ``StageActor`` behind Ray's call syntax in this process (``handle.method.remote(...)`` awaitable),
with every argument and answer pickled as Ray would, and a ``kill`` that behaves like a Ray actor dying
and being restarted: calls in flight fail, the next calls reach a fresh instance (or, as Ray does, a call
made while the actor restarts fails only after a grace period); ``Cluster``: a test's replicas and
front-ends."""

from __future__ import annotations

import asyncio
import pickle
import time
from collections.abc import Callable
from typing import Any

from realtime_gw.config import GatewayConfig
from realtime_gw.models.remote.actor import StageActor
from realtime_gw.models.remote.client import RemoteStage
from realtime_gw.models.runtime import StageWorker
from tests.models.toy_backends import Toy


class ActorDied(RuntimeError):
    """What a call to a dead actor raises here (Ray raises ``RayActorError``)."""


def toy_stage(
    max_active: int = 4, admit: Callable[[Any], str | None] | None = None
) -> Callable[[str, GatewayConfig], StageWorker]:
    def build(role: str, config: GatewayConfig) -> StageWorker:
        return StageWorker(Toy(), max_active=max_active, max_backlog=4, admit=admit)

    return build


class LocalActor:
    def __init__(
        self, build: Callable[[str, GatewayConfig], StageWorker], config: GatewayConfig, role: str = "tts"
    ) -> None:
        self._make = lambda: StageActor(build, role, config)  # the toy stage: in the TTS role
        self.target = self._make()
        self._in_flight: set[asyncio.Future[Any]] = set()
        self._killed: set[asyncio.Future[Any]] = set()
        self._restarting_until = 0.0
        self._grace_s = 0.0

    def __getattr__(self, method: str) -> _Method:
        return _Method(self, method)

    async def kill(self, restart: bool = True, restarting_s: float = 0.0, grace_s: float = 0.0) -> None:
        """``restarting_s``: how long the restart takes; a call made meanwhile fails after ``grace_s``
        (Ray holds such calls until it learns the old actor's fate)."""
        self._restarting_until, self._grace_s = time.monotonic() + restarting_s, grace_s
        old = self.target
        for call in list(self._in_flight):
            self._killed.add(call)
            call.cancel()
        if old._reaper is not None:
            old._reaper.cancel()
        await old.worker.stop()
        if restart:
            self.target = self._make()


class _Method:
    def __init__(self, actor: LocalActor, name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        return asyncio.ensure_future(self._call(pickle.loads(pickle.dumps(args))))

    async def _call(self, args: tuple[Any, ...]) -> Any:
        if time.monotonic() < self.actor._restarting_until:
            await asyncio.sleep(self.actor._grace_s)
            raise ActorDied(f"{self.name} was called while the actor restarted")
        call = asyncio.ensure_future(getattr(self.actor.target, self.name)(*args))
        self.actor._in_flight.add(call)
        try:
            answer = await call
        except asyncio.CancelledError:
            if call not in self.actor._killed:
                raise  # the caller gave up, as with Ray's ``ray.cancel``
            raise ActorDied(f"actor died during {self.name}") from None
        finally:
            self.actor._killed.discard(call)
            self.actor._in_flight.discard(call)
        return pickle.loads(pickle.dumps(answer))


class Cluster:
    """Toy-stage replicas (``LocalActor``) and started front-ends (``RemoteStage``) of one test; ``close``
    stops the front-ends and kills the replicas."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.actors: list[LocalActor] = []
        self.stages: list[RemoteStage] = []

    def replicas(
        self, n: int = 1, max_active: int = 4, admit: Callable[[Any], str | None] | None = None
    ) -> list[LocalActor]:
        self.actors += [LocalActor(toy_stage(max_active, admit), self.config) for _ in range(n)]
        return self.actors[-n:]

    async def frontend(
        self, replicas: list[LocalActor], settings: dict[str, Any] | None = None
    ) -> RemoteStage:
        stage = RemoteStage("toy", replicas, settings)
        await stage.start()
        self.stages.append(stage)
        return stage

    async def serve(self, n: int = 1, max_active: int = 4) -> tuple[RemoteStage, list[LocalActor]]:
        """``n`` fresh replicas and one front-end on them."""
        replicas = self.replicas(n, max_active)
        return await self.frontend(replicas), replicas

    async def close(self) -> None:
        for stage in self.stages:
            await stage.stop()
        for actor in self.actors:
            await actor.kill(restart=False)
