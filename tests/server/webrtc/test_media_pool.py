"""Media worker processes as the gateway's pool sees them."""

from __future__ import annotations

import asyncio

import pytest

from realtime_gw.server.webrtc.ice import HostCandidates
from realtime_gw.server.webrtc.media_pool import MediaPool


async def test_an_offer_a_media_worker_refuses_leaves_nothing_behind() -> None:
    """The worker answers an offer it cannot take with an error and drops the call: the gateway's side
    ends it too (no wait for a close that never comes, no entry left to count as load)."""
    pool = MediaPool(1)
    try:
        for i in range(2):
            with pytest.raises(RuntimeError):
                offer = pool.open(f"rtc_bad{i}", "v=0\r\nnot an offer\r\n", True, HostCandidates("127.0.0.1", None), 1)
                await asyncio.wait_for(offer, 4.0)
        assert pool.workers[0].alive and pool.workers[0].calls == {}
    finally:
        await pool.stop()
