"""The VAD on its window clock (``Lockstep(stop_when_idle=True)``, as ``--vad-step-ms`` builds it) in a real
StageWorker with the onnxruntime Silero backend: windows that several streams complete within one tick go
into one network call, none waits more than a tick, and the first window after a pause is scored at once.
The tick is long here (``FRAME_S``) so that a loaded test box cannot blur which tick a push fell in."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from realtime_gw.config import ConfigError, GatewayConfig
from realtime_gw.models.lockstep import Lockstep
from realtime_gw.models.registry import build_stage
from realtime_gw.models.speech.vad_silero import WINDOW, Round
from realtime_gw.records.voice import VadProbs, VadRequest
from tests.models.waiting import wait_for

FRAME_S = 0.4
STREAMS = 8
PUSH_EVERY_S = 0.01
ONE_WINDOW = bytes(2 * WINDOW)  # 32 ms of 16 kHz PCM16


@pytest.fixture
def network_calls(vad: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows of each network call the backend runs (one per round), in order."""
    calls: list[int] = []
    run_rounds = vad.run_rounds

    def counted(rounds: list[Round]) -> Any:
        calls.extend(len(ready) for ready, _ in rounds)
        return run_rounds(rounds)

    monkeypatch.setattr(vad, "run_rounds", counted)
    return calls


async def first_output(stream: Any) -> float:
    """When ``stream``'s next output (one window's probability) arrived."""
    out = await anext(aiter(stream))
    assert isinstance(out, VadProbs) and len(out.probs) == 1
    return time.monotonic()


async def test_windows_of_one_tick_share_one_call_and_wait_at_most_a_tick(
    vad: Any, start_worker: Any, network_calls: list[int]
) -> None:
    clock = Lockstep(FRAME_S, stop_when_idle=True)
    w = await start_worker(vad, max_batch=64, lockstep=clock)
    streams = [w.submit(VadRequest(sample_rate=16000)) for _ in range(STREAMS)]
    await wait_for(lambda: all(s.state is not None for s in streams) and not clock.running, timeout=5.0)

    # After a pause the clock is stopped: the first window is scored at once, not at a tick.
    pushed = time.monotonic()
    streams[0].push(ONE_WINDOW)
    assert await first_output(streams[0]) - pushed < FRAME_S / 2
    assert network_calls == [1]

    # The clock runs from that step: the others' windows, pushed one by one within the tick, wait for it.
    outputs = [asyncio.create_task(first_output(s)) for s in streams[1:]]
    pushes = []
    for s in streams[1:]:
        pushes.append(time.monotonic())
        s.push(ONE_WINDOW)
        await asyncio.sleep(PUSH_EVERY_S)
    arrived = await asyncio.gather(*outputs)
    assert network_calls == [1, STREAMS - 1]  # one call for all of them, not one each
    waits = [a - p for a, p in zip(arrived, pushes, strict=True)]
    assert max(waits) < FRAME_S + 0.1  # at most one tick (and the step itself)
    assert min(waits) > PUSH_EVERY_S  # none was stepped on arrival: they waited for the tick

    for s in streams:
        s.close_input()
    await wait_for(lambda: w.active_count == 0, timeout=5.0)


async def test_streams_past_the_batch_cap_step_in_the_same_tick_not_the_next(
    vad: Any, start_worker: Any, network_calls: list[int]
) -> None:
    """More streams with a window than ``max_batch``: the rest run right after, in the same tick (before,
    they waited a whole tick per batch: speech onsets and barge-in late by several ticks)."""
    clock = Lockstep(FRAME_S, stop_when_idle=True)
    w = await start_worker(vad, max_batch=2, lockstep=clock)
    streams = [w.submit(VadRequest(sample_rate=16000)) for _ in range(6)]
    await wait_for(lambda: all(s.state is not None for s in streams) and not clock.running, timeout=5.0)
    outputs = [asyncio.create_task(first_output(s)) for s in streams]
    await asyncio.sleep(0)
    pushed = time.monotonic()
    for s in streams:
        s.push(ONE_WINDOW)
    arrived = await asyncio.gather(*outputs)
    assert sorted(network_calls)[-1] <= 2 and sum(network_calls) == 6
    assert max(arrived) - pushed < FRAME_S / 2, [round(a - pushed, 3) for a in arrived]
    for s in streams:
        s.close_input()
    await wait_for(lambda: w.active_count == 0, timeout=5.0)


def test_the_setting_builds_the_clock() -> None:
    default = build_stage("vad", GatewayConfig(warmup=False))
    assert default.lockstep is not None and default.lockstep.stop_when_idle
    assert default.lockstep.frame_s == pytest.approx(0.032)  # one Silero window
    assert build_stage("vad", GatewayConfig(warmup=False, vad_step_ms=0)).lockstep is None  # on every arrival
    for wrong in (-1, 101):  # a window waits up to a step: turn ends and barge-in wait with it
        with pytest.raises(ConfigError, match="vad-step-ms"):
            build_stage("vad", GatewayConfig(warmup=False, vad_step_ms=wrong))
