"""Shared fixtures: live gateway servers started on free loopback ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

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
    *args: str, name: str = "server", timeout: float = 120.0, code_root: Path = ROOT
) -> LiveServer:
    """``code_root``: the checkout whose ``realtime_gw`` runs (e.g. a worktree of an older commit)."""
    port = free_port()
    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / f"{name}-{port}.log"
    log = log_path.open("wb")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if code_root != ROOT:
        env["PYTHONPATH"] = str(code_root)
    proc = subprocess.Popen(
        [sys.executable, "-m", "realtime_gw", "serve", "--port", str(port), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=code_root,
    )
    server = LiveServer(port, proc, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.logs()}")
        try:
            if httpx.get(server.http + "/readyz", timeout=1.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise RuntimeError(f"server not ready after {timeout}s:\n{server.logs()}")


def stop_server(server: LiveServer) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.proc.kill()


@pytest.fixture(scope="session")
def voice_server() -> Iterator[LiveServer]:
    """The embedded CPU models (Piper, pocketsphinx, Silero) with the echo responder."""
    server = start_server(
        "--policy", "none", "--api-key", "test-key", "--max-input-buffer-bytes", "2000000",
        "--tts-deterministic", name="voice",
    )  # fmt: skip
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def tone_server() -> Iterator[LiveServer]:
    """Cheap sine TTS and a session limit of 2, for gateway-level behaviour."""
    server = start_server("--policy", "none", "--tts", "tone", "--max-sessions", "2", name="tone")
    yield server
    stop_server(server)
