"""Waiting on a test client's event log: the first event a predicate accepts, woken by each new event."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any


async def first_event(
    events: list[tuple[float, Any]],
    new: asyncio.Event,
    pred: Callable[[Any], bool],
    timeout: float = 60.0,
    after: int = 0,
) -> Any:
    """The first of ``events[after:]`` (``(time, event)`` pairs the client appends, setting ``new``) that
    ``pred`` accepts, waiting up to ``timeout`` seconds for it."""
    deadline = time.monotonic() + timeout
    while True:
        for _, ev in events[after:]:
            if pred(ev):
                return ev
        new.clear()
        left = deadline - time.monotonic()
        assert left > 0, f"timed out; last events: {[e.type for _, e in events[-10:]]}"
        with suppress(asyncio.TimeoutError):
            await asyncio.wait_for(new.wait(), left)
