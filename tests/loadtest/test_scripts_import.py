"""Every load script imports (its ``main`` not run) on a machine without CUDA: a moved helper, a renamed
function or a GPU-only import at module level shows here, not on the day someone runs the bench."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPTS = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts)
    for p in (ROOT / "loadtest").rglob("*.py")
    if p.name != "__init__.py"
)
# locust patches the standard library (gevent) as it is imported: it goes in a process of its own.
ALONE = {"loadtest.load.locustfile"}

IMPORT_ALL = """
import importlib, json, sys, traceback
failed = {}
for name in sys.argv[1:]:
    try:
        module = importlib.import_module(name)
        assert module.__name__ != "__main__"
    except BaseException:
        failed[name] = traceback.format_exc(limit=3)
print(json.dumps(failed))
"""


@pytest.mark.parametrize("names", [sorted(set(SCRIPTS) - ALONE), sorted(ALONE)], ids=["scripts", "locust"])
def test_every_load_script_imports_without_cuda(names: list[str]) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, *names],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(f"{name}:\n{error}" for name, error in failed.items())


def test_the_import_check_sees_every_folder() -> None:
    folders = {name.split(".")[1] for name in SCRIPTS}
    assert folders == {"abuse", "bench", "load", "probes"}
