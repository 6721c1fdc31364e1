"""Waiting, inside a test's event loop, for a worker's state to reach what the test expects next."""

from __future__ import annotations

import asyncio
from typing import Any


async def wait_for(cond: Any, timeout: float = 1.0) -> None:
    """Poll ``cond`` every 5 ms without blocking the loop; fail the test if it is still false after ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)
