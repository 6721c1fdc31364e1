"""The listening part of the realtime transport reports what it could not do; the session decides."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from realtime_gw.models.runtime import NoFreeSlot
from realtime_gw.server.listen_effects import Listening
from realtime_gw.sessions.events import AsrUnavailable, FeedAsr, StartAsr


class _FullAsr:
    """An ASR worker with every decoder taken."""

    def submit(self, request: Any) -> Any:
        raise NoFreeSlot("asr: no free slot (4 in use)")


async def test_no_free_decoder_is_reported_to_the_session() -> None:
    posted: list[Any] = []
    tasks: list[asyncio.Task[Any]] = []

    async def post(event: Any) -> None:
        posted.append(event)

    def spawn(coro: Any, name: str) -> asyncio.Task[Any]:
        tasks.append(asyncio.create_task(coro, name=name))
        return tasks[-1]

    listening = Listening(cast(Any, _FullAsr()), None, post, spawn)
    listening.run(StartAsr("item_1", 24000))
    listening.run(FeedAsr("item_1", b"\0\0"))  # no stream: nothing to feed, nothing fails
    await asyncio.gather(*tasks)
    assert posted == [AsrUnavailable("item_1", "asr: no free slot (4 in use)")]
    assert await listening.end("item_1") is None  # a commit before the session heard: one shot
