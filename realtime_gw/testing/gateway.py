"""A gateway in a subprocess, for tests and load scripts: ``realtime_gw serve`` on a free loopback port,
its output in a log file, handed back once ``/readyz`` answers 200, and stopped (terminate, then kill).

The one launcher of the checkout: pytest fixtures and the load scripts both start gateways here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

CODE_ROOT = Path(__file__).resolve().parents[2]
"""The directory that holds the ``realtime_gw`` running this code (a checkout, or site-packages)."""
ARTIFACTS = CODE_ROOT / "test-artifacts"
"""Where gateway logs go unless the caller says otherwise."""


class GatewayFailed(RuntimeError):
    """The gateway exited, or was not ready in time; the message ends with its log's tail."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    ready_s: float = 0.0
    """Seconds from launch until ``/readyz`` first answered 200."""

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def metric(self, name: str, labels: str = "") -> float:
        """Sum of a Prometheus sample (``labels`` is a substring of the label set, e.g. 'worker="piper"')."""
        total = 0.0
        for line in httpx.get(self.http + "/metrics").text.splitlines():
            if line.startswith(name) and not line.startswith("#") and labels in line:
                key = line.split(" ")[0]
                if key.split("{")[0] == name:
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(
    *flags: str,
    name: str = "server",
    timeout: float = 120.0,
    code_root: Path | None = None,
    log_path: Path | None = None,
    port: int | None = None,
    env: dict[str, str] | None = None,
) -> LiveServer:
    """``realtime_gw serve --port P *flags``, returned once ready.

    ``code_root``: the checkout whose ``realtime_gw`` runs (e.g. a worktree of an older commit; default:
    this one). ``log_path``: default ``test-artifacts/<name>-<port>.log``. ``env``: added to ours.
    Raises ``GatewayFailed`` (the gateway killed first) if it exits or is not ready by ``timeout``."""
    port = port or free_port()
    root = code_root or CODE_ROOT
    log_path = log_path or ARTIFACTS / f"{name}-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if root != CODE_ROOT:
        full_env["PYTHONPATH"] = str(root)
    with log_path.open("wb") as log:  # the child holds its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "realtime_gw", "serve", "--port", str(port), *flags],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=root,
        )
    server = LiveServer(port, proc, log_path)
    server.ready_s = wait_ready(server, timeout)
    return server


def wait_ready(server: LiveServer, timeout: float, poll_s: float = 0.25) -> float:
    """Seconds until ``/readyz`` answered 200 (counted from now)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if server.proc.poll() is not None:
            raise GatewayFailed(f"gateway exited with {server.proc.returncode}:\n{_tail(server)}")
        try:
            if httpx.get(server.http + "/readyz", timeout=1.0).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    server.proc.kill()
    raise GatewayFailed(f"gateway not ready after {timeout:.0f} s; see {server.log_path}:\n{_tail(server)}")


def stop_server(server: LiveServer, timeout: float = 10.0) -> int | None:
    """Terminate (kill after ``timeout``); returns the exit status it had before it was asked to stop
    (None: it was still running)."""
    before = server.proc.poll()
    server.proc.terminate()
    try:
        server.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
    return before


def _tail(server: LiveServer, chars: int = 20000) -> str:
    return server.logs()[-chars:]
