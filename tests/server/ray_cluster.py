"""A local Ray cluster started by the test process, and gateway front-ends (separate processes) that
serve some stages from its actors. Kept small for a 2-core box: no dashboard, a 100 MB object store."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from realtime_gw.testing.gateway import LiveServer, start_server, stop_server

NAMESPACE = "realtime_gw_test"

FRONT_END_FLAGS = (
    "--tts", "tone", "--policy", "noop", "--s2s", "moshi", "--s2s-slots", "2",
    "--remote-stages", "tts,policy,s2s", "--ray-namespace", NAMESPACE,
    "--ray-num-cpus", "0.5", "--cpu-backends-in-process", "--openpi-idle-timeout-s", "60",
    "--s2s-reply-end-ms", "80", "--s2s-silence-dbfs", "0",
)  # fmt: skip
"""Tone TTS, the no-op policy and a tiny random Moshi (two slots) in actors; a Moshi reply ends at its
first padding step (as in tests/server/test_s2s_live.py)."""


@contextlib.contextmanager
def local_ray() -> Iterator[str]:
    """A Ray cluster on this machine for the test's duration; yields its address for front-ends."""
    import ray

    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    ray.init(
        num_cpus=4,  # logical: the actors ask for 0.5 each; the box has 2 real cores
        include_dashboard=False,
        object_store_memory=100 * 1024 * 1024,
        namespace=NAMESPACE,
        log_to_driver=False,
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def start_front_ends(address: str, n: int, *extra: str) -> list[LiveServer]:
    """``n`` gateway processes joining the cluster at ``address``, started together, each ready (its
    remote stages too) when this returns."""
    flags = (*FRONT_END_FLAGS, "--ray-address", address, *extra)
    with ThreadPoolExecutor(n) as pool:
        futures = [
            pool.submit(start_server, *flags, name=f"ray-front-end-{i}", timeout=180) for i in range(n)
        ]
        return [f.result() for f in futures]


def stop_front_ends(servers: list[LiveServer]) -> None:
    for server in servers:
        if server.proc.poll() is None:
            stop_server(server)


def stage_actor(role: str, replica: int = 0) -> Any:
    import ray

    return ray.get_actor(f"{role}-{replica}", namespace=NAMESPACE)
