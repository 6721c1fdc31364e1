"""A short soak in `make test`: 45 s, 20 voice users + 4 robots (robots only where the socket answers).

`loadtest/load/soak.py` starts its own server, runs locust headless and fails on memory growth, leaked
sessions, or a lost/duplicated frame; this test runs it and checks its verdict and report.
"""

from __future__ import annotations

import json
import subprocess
import sys

from realtime_gw.testing.gateway import ARTIFACTS
from tests.conftest import ROOT


def test_short_soak_passes() -> None:
    out = ARTIFACTS / "soak-short"
    proc = subprocess.run(
        [
            sys.executable, "-m", "loadtest.load.soak",
            "--duration", "45", "--users", "20", "--robots", "4", "--spawn-rate", "10",
            "--out-dir", str(out),
        ],
        capture_output=True, text=True, timeout=280, cwd=ROOT,
    )  # fmt: skip
    report = json.loads((out / "soak-report.json").read_text())
    assert proc.returncode == 0, f"{report['failures']}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert report["passed"] and not report["failures"]
    assert report["responses"] >= 20, "every voice user got at least one reply"
    assert report["frames_lost"] == 0 and report["frames_duplicated"] == 0
    assert sum(report["sessions_after"].values()) == 0
    if report["robots"]:
        assert report["robot_steps"] >= 100 and report["robot_errors"] == 0
