"""A ``StageActor`` behind Ray's call syntax in this process (``handle.method.remote(...)`` awaitable),
with every argument and answer pickled as Ray would, and a ``kill`` that behaves like a Ray actor dying
and being restarted: calls in flight fail, the next calls reach a fresh instance."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable
from typing import Any

from realtime_gw.config import GatewayConfig
from realtime_gw.models.remote.actor import StageActor
from realtime_gw.models.runtime import StageWorker
from tests.models.toy_backends import Toy


class ActorDied(RuntimeError):
    """What a call to a dead actor raises here (Ray raises ``RayActorError``)."""


def toy_stage(max_active: int = 4) -> Callable[[str, GatewayConfig], StageWorker]:
    def build(role: str, config: GatewayConfig) -> StageWorker:
        return StageWorker(Toy(), max_active=max_active, max_backlog=4)

    return build


class LocalActor:
    def __init__(self, build: Callable[[str, GatewayConfig], StageWorker], config: GatewayConfig) -> None:
        self._make = lambda: StageActor(build, "toy", config)
        self.target = self._make()
        self._in_flight: set[asyncio.Future[Any]] = set()
        self._killed: set[asyncio.Future[Any]] = set()

    def __getattr__(self, method: str) -> _Method:
        return _Method(self, method)

    async def kill(self, restart: bool = True) -> None:
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
