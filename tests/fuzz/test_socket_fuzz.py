"""A short live-socket fuzz run (``loadtest/abuse/fuzz_sockets.py``): ~3k mutated frames per socket against a
server it starts (tone TTS, no-op policy), with good voice and robot sessions running meanwhile."""

from __future__ import annotations

import json
import subprocess
import sys

from realtime_gw.testing.gateway import ARTIFACTS
from tests.conftest import ROOT


def test_short_socket_fuzz_run() -> None:
    report_path = ARTIFACTS / "fuzz-sockets-short.json"
    proc = subprocess.run(
        [
            sys.executable, "-m", "loadtest.abuse.fuzz_sockets",
            "--frames", "3000", "--concurrency", "4", "--duration", "90", "--seed", "20261202",
            "--allow-known-bugs", "--report", str(report_path),
        ],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )  # fmt: skip
    assert report_path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert proc.returncode == 0, json.dumps({k: report[k] for k in report if k != "mutations"}, indent=1)[:6000]
    assert report["frames"]["realtime"] >= 3000 and report["frames"]["openpi"] >= 3000
    assert report["violations"] == 0
    assert not report["server_crashed"] and report["healthz_after"]
    assert sum(report["sessions_after"].values()) == 0
    assert report["good_sessions"]["robot_steps"] > 0 and not report["good_failures"]
    assert report["good_sessions"].get("text_turns", 0) + report["good_sessions"].get("audio_turns", 0) > 0
