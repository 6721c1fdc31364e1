"""A front-end that starts a local Ray cluster (``ray_address`` empty) hands its actors no secret
through the environment they inherit: live Ray, in a child process so this one stays Ray-free."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")

PROBE = """
import os, ray
from realtime_gw.config import GatewayConfig
from realtime_gw.models.remote.routing import connect

connect(GatewayConfig(ray_num_cpus=1))
assert os.environ["REALTIME_GW_API_KEY"] == "front-end-key"  # the front-end keeps its own

@ray.remote
def seen() -> list[str]:
    return sorted(k for k in ("REALTIME_GW_API_KEY", "REALTIME_GW_RESPONDER_API_KEY", "REALTIME_GW_PORT")
                  if k in os.environ)

print("SEEN", ray.get(seen.remote()))
ray.shutdown()
"""


def test_a_local_cluster_inherits_no_secret_from_the_front_ends_environment() -> None:
    env = dict(os.environ, REALTIME_GW_API_KEY="front-end-key", REALTIME_GW_RESPONDER_API_KEY="llm-key")
    env["REALTIME_GW_PORT"] = "8123"  # not a secret: still inherited (the probe sees the environment)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "SEEN ['REALTIME_GW_PORT']" in out.stdout
