"""A few seconds of coverage-guided fuzzing of each decoder (``loadtest/abuse/fuzz_decoders.py``) with atheris.

Cheap (about 5 s per target) and deterministic in what it requires: the harness starts, loads its seed
corpus, runs to its time limit without a crash (open bugs it already knows are counted, not fatal).
Skipped where atheris is not installed (it is in the ``dev`` extra for Linux x86-64)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from realtime_gw.testing.gateway import ARTIFACTS
from tests.conftest import ROOT

pytest.importorskip("atheris")


@pytest.mark.parametrize("target", ["realtime", "openpi"])
def test_decoder_fuzzing_smoke(target: str, tmp_path: object) -> None:
    proc = subprocess.run(
        [
            sys.executable, "-m", "loadtest.abuse.fuzz_decoders", target, "--seconds", "5", "--seed", "1",
            "--allow-known-bugs", "--corpus", str(tmp_path), "--artifacts", str(ARTIFACTS / "fuzz-decoders"),
        ],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Done " in out and " runs in " in out, out[-4000:]
