"""The device clock's runner: stage workers that share a device take turns on it, and a hung stage
holds it only until its own supervisor gives up."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from realtime_gw.models.device_clock import STAGE_FRAMES, DeviceClock, clocked, share_clocks
from realtime_gw.models.faults import FaultSpec, FaultyBackend
from realtime_gw.models.runtime import StageWorker, WorkerFault
from tests.models.toy_backends import Req, TimedToy


def test_the_setting_names_devices() -> None:
    assert clocked("cuda", ["cuda"]) and clocked("cuda:1", ["cuda"]) and clocked("cuda:0", ["cuda"])
    assert clocked("cuda", ["cuda:0"]) and not clocked("cuda:1", ["cuda:0"])
    assert not clocked("cpu", ["cuda"]) and clocked("cpu", ["cuda", "cpu"])
    assert not clocked("cuda", [])


def test_one_clock_per_device() -> None:
    def worker(device: str) -> StageWorker:
        return StageWorker(TimedToy(f"toy-{device}", []), device=device)

    ws = [worker("cuda"), worker("cuda:0"), worker("cuda:1"), worker("cpu")]
    clocks = share_clocks(ws, ["cuda"])
    assert sorted(clocks) == ["cuda:0", "cuda:1"]
    assert ws[0].clock is ws[1].clock is clocks["cuda:0"] and ws[2].clock is clocks["cuda:1"]
    assert ws[3].clock is None


def test_the_device_goes_to_the_earliest_deadline_when_it_is_freed() -> None:
    clock = DeviceClock("cpu")
    first = clock.enter("vad", due=5.0, awaited=False)  # the device is free: granted at once
    assert first.granted.is_set()
    late = clock.enter("asr", due=2.0, awaited=False)
    urgent = clock.enter("tts", due=1.0, awaited=False)
    assert not late.granted.is_set() and not urgent.granted.is_set()
    clock.leave(first)
    assert urgent.granted.is_set() and not late.granted.is_set()
    clock.leave(urgent)
    clock.leave(urgent)  # idempotent
    assert late.granted.is_set()
    clock.leave(late)
    assert not clock.busy and clock.granted_order == ["vad", "tts", "asr"]


def test_a_withdrawn_step_frees_a_waiting_thread_and_is_never_granted() -> None:
    clock = DeviceClock("cpu")
    holder = clock.enter("tts", due=1.0, awaited=False)
    waiting = clock.enter("asr", due=2.0, awaited=False)
    woke = threading.Event()
    t = threading.Thread(target=lambda: (clock.hold(waiting), woke.set()))
    t.start()
    clock.leave(waiting)
    t.join(2.0)
    assert woke.is_set() and not waiting.held
    clock.leave(holder)
    assert not clock.busy


async def _serve(workers: list[StageWorker], streams: int, steps: int) -> None:
    for w in workers:
        await w.start(warmup=False)
    try:
        outs = await asyncio.gather(
            *(w.submit(Req(n=steps)).collect() for w in workers for _ in range(streams))
        )
        assert outs == [list(range(1, steps + 1))] * (streams * len(workers))
    finally:
        for w in workers:
            await w.stop()


def overlaps(log: list[tuple[str, float, float]]) -> int:
    spans = sorted((start, end) for _, start, end in log)
    return sum(1 for (_, end), (start, _) in zip(spans, spans[1:], strict=False) if start < end)


async def test_stages_sharing_a_clock_step_one_at_a_time_and_count_deadlines() -> None:
    log: list[tuple[str, float, float]] = []
    asr = StageWorker(TimedToy("clock-asr", log), max_batch=4)
    tts = StageWorker(TimedToy("clock-tts", log), max_batch=4)
    share_clocks([asr, tts], ["cpu"])
    before = STAGE_FRAMES.labels("clock-tts", "cpu")._value.get()
    await _serve([asr, tts], streams=3, steps=6)
    assert {name for name, _, _ in log} == {"clock-asr", "clock-tts"}
    assert overlaps(log) == 0
    assert STAGE_FRAMES.labels("clock-tts", "cpu")._value.get() - before == 3 * 6
    assert asr.clock is not None and set(asr.clock.granted_order) == {"clock-asr", "clock-tts"}


async def test_without_a_clock_the_same_stages_overlap() -> None:
    log: list[tuple[str, float, float]] = []
    asr = StageWorker(TimedToy("free-asr", log, delay_s=0.02), max_batch=4)
    tts = StageWorker(TimedToy("free-tts", log, delay_s=0.02), max_batch=4)
    await _serve([asr, tts], streams=2, steps=6)
    assert overlaps(log) > 0  # each on its own thread: they run side by side (time-slicing a GPU)


async def test_a_hung_stage_holds_the_device_only_until_its_supervisor_gives_up() -> None:
    """A's step hangs past its deadline; B waits for the device meanwhile without timing out itself
    (its deadline runs from when it gets the device), and runs once A's supervisor abandons the step."""
    log: list[tuple[str, float, float]] = []
    hung = StageWorker(
        FaultyBackend(TimedToy("toy", log), FaultSpec.parse("toy:hang@1:1.0")), step_timeout_s=0.3
    )
    other = StageWorker(TimedToy("clock-other", log), step_timeout_s=0.3)
    share_clocks([hung, other], ["cpu"])
    for w in (hung, other):
        await w.start(warmup=False)
    try:
        stuck = hung.submit(Req(n=None))
        await asyncio.sleep(0.05)  # its first step holds the device
        served: Any = other.submit(Req(n=2)).collect()
        with pytest.raises(WorkerFault, match="exceeded"):
            await stuck.collect()
        assert await asyncio.wait_for(served, 2.0) == [1, 2]
        assert other.restarts == 0 and hung.restarts == 1
    finally:
        for w in (hung, other):
            await w.stop()


async def test_a_worker_stopped_while_its_step_waits_gives_the_device_back() -> None:
    """Stopping a worker whose step is waiting for the device (or granted but not yet begun) must not
    leave the device held: the other stage's next step still runs."""
    log: list[tuple[str, float, float]] = []
    slow = StageWorker(TimedToy("clock-slow", log, delay_s=0.2))
    stopped = StageWorker(TimedToy("clock-stopped", log))
    share_clocks([slow, stopped], ["cpu"])
    for w in (slow, stopped):
        await w.start(warmup=False)
    try:
        first = slow.submit(Req(n=2))
        await asyncio.sleep(0.05)  # the slow stage holds the device
        stopped.submit(Req(n=1))
        await asyncio.sleep(0.05)  # its step waits for the device
        await asyncio.wait_for(stopped.stop(), 2.0)
        assert await asyncio.wait_for(first.collect(), 2.0) == [1, 2]
        assert slow.clock is not None and not slow.clock.busy
    finally:
        await slow.stop()


async def test_a_step_longer_than_a_frame_misses_every_stream_deadline() -> None:
    """Counted with or without a clock: each stream a 100 ms step advances is due 80 ms after it was
    ready, so every one of its frames is missed."""
    from realtime_gw.models.device_clock import STAGE_MISSES

    def counts(stage: str) -> tuple[float, float]:
        return (
            STAGE_FRAMES.labels(stage, "cpu")._value.get(),
            STAGE_MISSES.labels(stage, "cpu")._value.get(),
        )

    slow = StageWorker(TimedToy("miss-slow", [], delay_s=0.1), max_batch=4)
    before = counts("miss-slow")
    await _serve([slow], streams=2, steps=3)
    frames, missed = (a - b for a, b in zip(counts("miss-slow"), before, strict=True))
    assert frames == 6 and missed == 6
