"""No client can hurt another. Each attack of ``loadtest/abuse/attack_kinds.py`` at a CI size, run
from 127.0.0.2 in its own process, while the bystander of ``realtime_gw/testing/bystander.py`` (realtime text->audio
turns, /healthz every 50 ms, a robot) is measured first alone and then through the attack, on the same
gateway in the same test. Then: the attack got its documented answer, and /readyz is 200 again.

The full-size runs and the before/after table are ``loadtest/abuse/attacks.py`` (docs/reliability.md).

Thresholds. The targets are: bystander TTFA p95 <= 2x its baseline, no audio frame more than
100 ms late, /healthz within 100 ms. This machine (and CI) is shared and has 2 cores that the attacker,
the gateway, its worker processes and the bystander all use (with other test runs beside them, load
averages of 10 were seen while writing these), so a baseline TTFA of 5 ms, or one /healthz answer,
can take 300-400 ms from scheduling alone; TTFA and /healthz bounds therefore have a floor of
``NOISE_MS``: TTFA p95 <= max(2x baseline, baseline + NOISE_MS), /healthz max <= max(100 ms, 2x
baseline's max) + NOISE_MS. Lateness
keeps the target's 100 ms over the baseline's worst: the gateway sends audio 400 ms ahead of real time,
which absorbs scheduling noise, so a frame only comes late when the gateway stalls for ~0.5 s. The
attacks these tests guard against cost seconds (10-47 s stalls before the fixes; docs/reliability.md
has the before figures), far above every floor: the floors hide scheduling noise, not regressions.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import websockets

from loadtest.abuse.attack_kinds import Sizes
from loadtest.abuse.attacks import attack_row, seconds_until_ready
from realtime_gw.testing.bystander import Bystander
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server

NOISE_MS = 500.0
"""The scheduling-noise floor of the bounds (module docstring)."""
SIZES = Sizes(hold_s=6.0)  # the CI sizes, held 6 s
# Shorter than the defaults (10 s each) so that the unread speech stream and the silent sockets are given
# up on within the 6 s the attack holds them.
SERVER_ARGS = ("--policy", "noop", "--tts", "tone", "--send-timeout-s", "2", "--handshake-timeout-s", "2")


@pytest.fixture(scope="module")
def gateway() -> Iterator[LiveServer]:
    server = start_server(*SERVER_ARGS, name="isolation")
    wait_for_spare(server)
    yield server
    stop_server(server)


def wait_for_spare(server: LiveServer, timeout: float = 90.0) -> None:
    """A stuck ASR step is recovered at once by swapping in the warm spare child (cpu_backend_spare); on a
    busy box the spare finishes warming after /readyz first says 200, so attacks wait for it."""
    deadline = time.monotonic() + timeout
    while server.metric("realtime_gw_backend_spare_ready", 'worker="asr-pocketsphinx"') < 1:
        assert time.monotonic() < deadline, "the ASR's spare child never became ready"
        time.sleep(0.5)


def check_bystander(row: dict[str, Any]) -> None:
    """The bounds of the module docstring, with the numbers in every message."""
    base, hit = row["baseline"], row["under_attack"]
    assert row["server_alive"], "the gateway died"
    assert hit["errors"] == 0, f"bystander errors under {row['attack']}: {hit['first_errors']}"
    assert hit["turns"] >= 1 and hit["frames"] >= 1, f"the bystander got no audio: {hit}"
    ttfa_limit = max(2 * base["ttfa_p95_ms"], base["ttfa_p95_ms"] + NOISE_MS)
    assert hit["ttfa_p95_ms"] <= ttfa_limit, (
        f"TTFA p95 {hit['ttfa_p95_ms']:.0f} ms > {ttfa_limit:.0f} ({base})"
    )
    late_limit = base["late_max_ms"] + 100
    assert hit["late_max_ms"] <= late_limit, f"a frame {hit['late_max_ms']:.0f} ms late > {late_limit:.0f}"
    health_limit = max(100, 2 * base["healthz_max_ms"]) + NOISE_MS
    assert hit["healthz_max_ms"] <= health_limit, (
        f"/healthz took {hit['healthz_max_ms']:.0f} ms > {health_limit:.0f}"
    )
    if base["robot_steps"]:
        assert hit["robot_steps"] >= 1, "the robot got no reply"
    assert row["ready_after_s"] is not None and row["ready_after_s"] < 5.0, "not ready again within 5 s"


def noisy_commit(d: dict[str, Any]) -> None:
    # a clear answer: transcribed (slowly, in the ASR process) or refused as too long; never a hang
    assert d["status"] in ("completed", "failed"), d["outcome"]


def deflate_bombs(d: dict[str, Any]) -> None:
    assert not d["deflate_negotiated"], "permessage-deflate is off by default"


def speech_floods(d: dict[str, Any]) -> None:
    assert d["unread_stream"] == "closed", f"a speech stream that never reads is closed: {d['outcome']}"


def idle_streams(d: dict[str, Any]) -> None:
    assert d["speech_post_status"] == 200, f"POST /v1/audio/speech still served: {d['outcome']}"


def slow_sockets(d: dict[str, Any]) -> None:
    assert d["silent_open"] == 0 and d["half_open"] == 0, d["outcome"]
    assert "taken" not in d["header"] and "taken" not in d["url"], (
        f"an endless header is cut off: {d['outcome']}"
    )


def bursts(d: dict[str, Any]) -> None:
    assert not any(e.startswith("closed") for e in d["endings"]), (
        f"a reading client is not closed: {d['outcome']}"
    )


def amplification(d: dict[str, Any]) -> None:
    assert d["ratio"] < 2.0, f"bytes back per byte sent: {d['outcome']}"


def rebinding(d: dict[str, Any]) -> None:
    assert d["accepted"] == [], d["outcome"]
    assert d["http_status"] in (400, 403, 421), d["outcome"]
    assert "key in server log: no" in d["outcome"], d["outcome"]


OUTCOMES: dict[str, Callable[[dict[str, Any]], None]] = {
    f.__name__: f
    for f in (
        noisy_commit,
        deflate_bombs,
        speech_floods,
        idle_streams,
        slow_sockets,
        bursts,
        amplification,
        rebinding,
    )
}


@pytest.mark.parametrize("attack", list(OUTCOMES))
async def test_attack_does_not_reach_the_bystander(gateway: LiveServer, attack: str) -> None:
    row = await attack_row(
        gateway,
        attack,
        SIZES,
        baseline_s=3.0,
        tail_s=1.0,
        robot=True,
        attack_timeout_s=60.0,
        turn_timeout_s=10.0,
    )
    check_bystander(row)
    OUTCOMES[attack](row["details"])


# -- a stuck model step ----------------------------------------------------------------------------------


@pytest.fixture(params=["hang", "spin"])
def stuck_asr(request: pytest.FixtureRequest) -> Iterator[tuple[str, LiveServer]]:
    """The first transcription step (warm-up is not a step) hangs 30 s, or holds the GIL busy for 4 s."""
    fault = "asr:hang@1:30" if request.param == "hang" else "asr:spin@1:4"
    server = start_server(
        *SERVER_ARGS,
        "--worker-step-timeout-s",
        "2",
        "--fault-injection",
        json.dumps([fault]),
        name=f"stuck-{request.param}",
    )
    yield request.param, server
    stop_server(server)


async def transcribe_once(server: LiveServer, timeout: float) -> list[str]:
    """One manual commit of 1 s of a tone, with a response: the event types up to its response.done."""
    pcm = b"".join(
        int(3000 * ((i // 27) % 2 * 2 - 1)).to_bytes(2, "little", signed=True) for i in range(24000)
    )
    async with websockets.connect(server.ws + "/v1/realtime", compression=None) as ws:
        manual = {"turn_detection": None, "transcription": {"model": "whisper-1"}}
        await ws.recv()
        await ws.send(
            json.dumps(
                {"type": "session.update", "session": {"type": "realtime", "audio": {"input": manual}}}
            )
        )
        await ws.send(
            json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        )
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send(json.dumps({"type": "response.create"}))
        kinds: list[str] = []
        async with asyncio.timeout(timeout):
            while True:
                ev = json.loads(await ws.recv())
                kinds.append(ev["type"])
                if ev["type"] == "response.done":
                    kinds.append("response " + ev["response"]["status"])
                    return kinds


async def test_stuck_asr_step_recovers_without_a_restart(stuck_asr: tuple[str, LiveServer]) -> None:
    kind, server = stuck_asr
    wait_for_spare(server)
    async with Bystander(server.port, robot=True, turn_timeout_s=10.0) as alone:
        await asyncio.sleep(3.0)
    async with Bystander(server.port, robot=True, turn_timeout_s=10.0) as through:
        stuck = await transcribe_once(server, 15.0)  # the step that hangs (or spins)
        t0 = time.monotonic()
        ready_s = await seconds_until_ready(server, 5.0)
        assert ready_s is not None, f"/readyz not 200 within 5 s after the stuck step ({kind})"
        again = await transcribe_once(server, 15.0)
        back_s = time.monotonic() - t0
    row = {
        "attack": f"asr {kind}",
        "baseline": alone.report.summary(),
        "under_attack": through.report.summary(),
        "server_alive": server.proc.poll() is None,
        "ready_after_s": ready_s,
    }
    check_bystander(row)
    if kind == "hang":
        assert "conversation.item.input_audio_transcription.failed" in stuck, stuck
        assert server.metric("realtime_gw_worker_restarts_total", 'worker="asr-pocketsphinx"') >= 1
    assert "conversation.item.input_audio_transcription.completed" in again, again
    assert back_s < 5.0, f"the ASR serves again {back_s:.1f} s after the stuck step"
