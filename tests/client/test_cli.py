"""``realtime-gw say | talk | robot`` against live servers; replies are checked by ear (pocketsphinx)."""

from __future__ import annotations

import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
from websockets.sync.client import connect

from realtime_gw.client.audio import silence, write_wav
from realtime_gw.config import GatewayConfig
from realtime_gw.protocols.openpi import unpackb
from realtime_gw.testing.audio import synthesize, transcribe, wer
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.conftest import ROOT


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "realtime_gw", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def heard(path: Path) -> str:
    pcm, rate = sf.read(str(path), dtype="int16")
    assert rate == 24000
    return transcribe(np.ascontiguousarray(pcm).tobytes(), rate)


def test_say_writes_speech_of_the_text(voice_server: LiveServer, tmp_path: Path) -> None:
    text = "I would like a cup of coffee."
    out = tmp_path / "say.wav"
    r = cli("say", text, "-o", str(out), "--url", voice_server.http, "--api-key", "test-key")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == text
    assert "first audio" in r.stderr and "completed" in r.stderr
    assert wer(text, heard(out)) <= 0.25, heard(out)


def test_talk_streams_a_wav_and_saves_the_reply(voice_server: LiveServer, tmp_path: Path) -> None:
    text = "Please open the door for me."
    wav = tmp_path / "in.wav"
    write_wav(wav, silence(300, 16000) + synthesize(text, 16000), 16000)
    out = tmp_path / "reply.wav"
    r = cli(
        "talk", str(wav), "-o", str(out), "--url", voice_server.http, "--api-key", "test-key", "--speed", "2"
    )
    assert r.returncode == 0, r.stderr
    for step in ("speech started", "speech stopped", "heard:", "first reply audio", "response completed"):
        assert step in r.stderr, (step, r.stderr)
    # The echo responder speaks back what the server heard: ASR -> TTS -> our ASR again.
    assert wer(text, r.stdout) <= 0.25, r.stdout
    assert wer(text, heard(out)) <= 0.34, heard(out)


def test_wrong_key_fails_cleanly(voice_server: LiveServer, tmp_path: Path) -> None:
    r = cli("say", "hello", "-o", str(tmp_path / "x.wav"), "--url", voice_server.http, "--api-key", "nope")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "403" in r.stderr, r.stderr


def test_robot_without_a_robot_socket_says_so(voice_server: LiveServer) -> None:
    r = cli("robot", "--obs", "sample", "--url", voice_server.http, "--api-key", "test-key")
    assert r.returncode == 2
    assert "did not answer" in r.stderr


HAS_NOOP = "noop" in typing.get_args(typing.get_type_hints(GatewayConfig)["policy"])


@pytest.fixture(scope="module")
def robot_server() -> Iterator[LiveServer]:
    if not HAS_NOOP:
        pytest.skip("this server has no noop policy to run a robot socket cheaply")
    server = start_server(
        "--policy", "noop", "--tts", "tone", "--no-cpu-backend-spare", "--no-warmup", name="robot-cli"
    )
    yield server
    stop_server(server)


def test_robot_prints_actions(robot_server: LiveServer) -> None:
    r = cli("robot", "--obs", "sample", "--steps", "3", "--url", robot_server.http)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("actions")]
    assert len(lines) == 3, r.stdout
    assert "(10, 8) float32" in lines[0]
    assert "round trip" in r.stderr and "median" in r.stderr


def test_page_and_openpi_share_the_root_path(robot_server: LiveServer) -> None:
    """GET / is the browser page; a WebSocket upgrade at / is still the OpenPI socket."""
    page = httpx.get(robot_server.http + "/")
    assert page.status_code == 200 and "realtime_gw" in page.text and "/web/app.js" in page.text
    for asset in ("app.js", "audio-worklets.js"):
        got = httpx.get(f"{robot_server.http}/web/{asset}")
        assert got.status_code == 200 and "javascript" in got.headers["content-type"]
    with connect(robot_server.ws + "/", max_size=None) as ws:
        metadata = unpackb(ws.recv(10))
    assert "policy_server_config" in metadata
