"""A gateway subprocess for the load scripts: ``realtime_gw serve`` on a free loopback port, its output in
a log file of the caller's choosing, up once ``/readyz`` answers 200, and stopped (terminate, then kill).

The handle is the tests' ``LiveServer`` (``.http``, ``.ws``, ``.metric()``, ``.logs()``), so whatever takes
a server from ``tests.conftest.start_server`` takes one from here too. Unlike that fixture helper, a
failed start ends the script (``SystemExit`` with the log's tail) and the log goes where the caller says.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import LiveServer, free_port  # noqa: E402

__all__ = ["LiveServer", "free_port", "start_gateway", "stop_gateway", "wait_ready"]


def start_gateway(
    flags: Sequence[str],
    log_path: Path,
    *,
    port: int | None = None,
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
) -> tuple[LiveServer, float]:
    """``realtime_gw serve --port P *flags`` from this checkout; returns it once ready, and how long
    that took (seconds)."""
    port = port or free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "realtime_gw", "serve", "--port", str(port), *flags],
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    server = LiveServer(port, proc, log_path)
    return server, wait_ready(server, timeout)


def wait_ready(server: LiveServer, timeout: float, poll_s: float = 0.25) -> float:
    """Seconds until ``/readyz`` answered 200; a gateway that exits or is not ready by ``timeout``
    ends the script (killed first)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if server.proc.poll() is not None:
            raise SystemExit(
                f"gateway exited with {server.proc.returncode}; see {server.log_path}:\n{_tail(server)}"
            )
        try:
            if httpx.get(server.http + "/readyz", timeout=1).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    server.proc.kill()
    raise SystemExit(f"gateway not ready after {timeout:.0f} s; see {server.log_path}:\n{_tail(server)}")


def stop_gateway(server: LiveServer, timeout: float = 15.0) -> int | None:
    """Terminate (kill after ``timeout``); returns the exit status it had before it was asked to stop
    (None: it was still running)."""
    before = server.proc.poll()
    server.proc.terminate()
    try:
        server.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        server.proc.kill()
    return before


def _tail(server: LiveServer, chars: int = 4000) -> str:
    return server.logs()[-chars:]
