"""Robots overlapped: PI0 and π0.5 chunks in fixed slots, advanced in phases (the prefix, then denoising steps
every robot shares whatever step it is at), on the tiny config (CPU).

A phased chunk must be the one-shot chunk (same seed and noise, same actions), a robot joining
mid-chunk must neither wait for the others' chunks nor change their actions, and a cancelled chunk
must give its slot back."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import pytest

from realtime_gw.config import GatewayConfig
from realtime_gw.models.policy.backend import PolicyBackend
from realtime_gw.models.policy.chunk_slots import HostEvent
from realtime_gw.models.policy.factory import build_policy_backend, worker_max_wait_ms
from tests.models.policy.robots import MODELS, TOL, drive, eager_runner, fast_runner, robot, tiny_model


@pytest.fixture(scope="module", params=MODELS)
def tiny(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    return tiny_model(request.param)


def test_phased_chunks_equal_one_shot_chunks(tiny: tuple[Any, Any]) -> None:
    """The same robots opened together: one step per worker step, three, or all (one-shot) give the
    same bits; the step count is what phasing changes."""
    reqs = [robot(0), robot(1, rtc=True), robot(2, num_steps=3), robot(3)]
    one_shot, done_at = drive(PolicyBackend(fast_runner(tiny), phase_steps=0), {0: reqs})
    assert done_at == [0, 0, 0, 0]
    for k, expect in ((1, [9, 9, 2, 9]), (3, [3, 3, 0, 3])):
        phased, done_at = drive(PolicyBackend(fast_runner(tiny), phase_steps=k), {0: reqs})
        assert done_at == expect  # ceil(steps / k) worker steps, the prefix in the first
        for a, b in zip(phased, one_shot, strict=True):
            np.testing.assert_array_equal(a, b)
    # And one-shot is still transformers' sampler (the guided robot: the functional one, run alone).
    eager = eager_runner(tiny)
    for r, got in zip(reqs, one_shot, strict=True):
        (ref,) = eager.run([eager.prepare(r)], r.num_steps)
        assert got is not None and np.abs(got - ref).max() <= TOL


def test_robots_joining_mid_chunk_wait_one_step_and_change_nothing(tiny: tuple[Any, Any]) -> None:
    alone = [drive(PolicyBackend(fast_runner(tiny)), {0: [robot(i, rtc=i == 6)]})[0][0] for i in (4, 5, 6)]
    arrivals = {0: [robot(4)], 3: [robot(5)], 5: [robot(6, rtc=True)]}
    together, done_at = drive(PolicyBackend(fast_runner(tiny), phase_steps=1), arrivals)
    # Each finishes ten worker steps after it arrived: its prefix ran in the step it arrived for.
    assert done_at == [9, 12, 14]
    for a, b in zip(together, alone, strict=True):
        assert a is not None and b is not None and np.abs(a - b).max() <= TOL
    # One-shot, the late robots wait for the running chunk to end first.
    _, one_shot_done = drive(PolicyBackend(fast_runner(tiny), phase_steps=0), arrivals)
    assert one_shot_done == [0, 3, 5]  # (each worker step there is a whole chunk long)


def test_cancel_frees_the_slot_and_a_full_runner_queues(tiny: tuple[Any, Any]) -> None:
    runner = fast_runner(tiny, buckets=(1, 2))  # two slots
    backend = PolicyBackend(runner, phase_steps=1)
    alone = [drive(PolicyBackend(fast_runner(tiny)), {0: [robot(i)]})[0][0] for i in (7, 8, 9)]
    # Robot 7 is cancelled after two steps; 9 arrives while both slots are busy and takes 7's.
    got, done_at = drive(backend, {0: [robot(7), robot(8)], 1: [robot(9)]}, cancel={2: [0]})
    assert got[0] is None and done_at[0] == -1
    assert done_at[1] == 9 and done_at[2] == 11  # 9 waited (no error) until step 2 freed a slot
    for a, b in zip(got[1:], alone[1:], strict=True):
        assert a is not None and b is not None and np.abs(a - b).max() <= TOL
    assert runner.slots.free_slots == 2 and not runner._prepared
    state = backend.open(robot(7))
    backend.step([(state, [])])
    assert state.slot == 0  # lowest slot first: the active rows stay packed
    backend.release(state)
    assert runner.slots.free_slots == 2
    with pytest.raises(ValueError, match="freed twice"):
        runner.slots.free(0)


def test_a_failed_prefix_gives_its_slots_back(tiny: tuple[Any, Any]) -> None:
    """A prefix that raises (e.g. out of memory) returns the slots it took: nobody holds them, and a
    leaked slot would never be freed (requests wait for slots, so a leak stalls robots for good)."""
    runner = fast_runner(tiny, buckets=(1, 2))
    good = runner.prepare(robot(1))
    broken = dataclasses.replace(good, noise=good.noise[:1])  # a chunk of the wrong length
    with pytest.raises(RuntimeError):
        runner.admit([(good, 10), (broken, 10)])
    assert runner.slots.free_slots == 2 and not runner.slots.pending and not runner._prepared
    assert runner.admit([(good, 10), (good, 10)]) == [0, 1]


def test_warmup_runs_a_whole_phased_chunk(tiny: tuple[Any, Any]) -> None:
    runner = fast_runner(tiny, buckets=(1, 2))
    backend = PolicyBackend(runner, phase_steps=1)
    runner.slots.admit([(runner.prepare(robot(1)), 10)])  # a slot a dropped state never gave back
    backend.warmup()
    assert runner.slots.free_slots == 2 and backend._used == 0


async def test_worker_serves_robots_arriving_mid_chunk(tiny: tuple[Any, Any], start_worker: Any) -> None:
    """Through a real StageWorker: a robot submitted while another's chunk runs joins it step by step."""
    reqs = [robot(10), robot(11), robot(12, rtc=True)]
    alone = [drive(PolicyBackend(fast_runner(tiny)), {0: [r]})[0][0] for r in reqs]
    worker = await start_worker(PolicyBackend(fast_runner(tiny), phase_steps=1), max_batch=16)
    first = worker.submit(reqs[0])
    while first.steps < 3:
        await asyncio.sleep(0.001)
    rest = [worker.submit(r) for r in reqs[1:]]
    outs = await asyncio.gather(*(s.collect() for s in [first, *rest]))
    assert first.steps == 10 and all(s.steps == 10 for s in rest)
    for (got,), ref in zip(outs, alone, strict=True):
        assert ref is not None and np.abs(got - ref).max() <= TOL


def test_the_config_picks_phases_and_drops_the_batching_window() -> None:
    phased = build_policy_backend(GatewayConfig(policy_impl="fast", policy_phase_steps=2))
    assert phased.phased and phased.phase_steps == 2 and not phased.one_shot
    assert worker_max_wait_ms(GatewayConfig(policy_impl="fast", policy_phase_steps=1)) == 0.0  # a step away
    one_shot = GatewayConfig(policy_impl="fast", policy_phase_steps=0, policy_max_wait_ms=3.0)
    assert build_policy_backend(one_shot).one_shot and worker_max_wait_ms(one_shot) == 3.0
    eager = build_policy_backend(GatewayConfig())  # transformers' sampler: one-shot only
    assert not eager.phased and eager.one_shot and worker_max_wait_ms(GatewayConfig()) == 2.0


def test_a_prefix_in_flight_leaves_the_admitted_robots_stepping(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The overlap's schedule (on CUDA the prefix runs on a stream of its own): until a new robot's
    prefix reports done, the robots already admitted keep stepping and robots arriving meanwhile wait
    for the next prefix batch; nobody's actions change."""
    alone = [drive(PolicyBackend(fast_runner(tiny)), {0: [robot(i)]})[0][0] for i in (13, 14, 15)]
    runner = fast_runner(tiny)
    runner.slots.overlap = True  # commits deferred to the prefix's event; without streams it ran at launch
    done = iter([False, False, False])  # robot 14's prefix reports done at the fourth look
    monkeypatch.setattr(HostEvent, "query", lambda self: next(done, True))
    got, done_at = drive(
        PolicyBackend(runner, phase_steps=1), {0: [robot(13)], 3: [robot(14)], 4: [robot(15)]}
    )
    # 13 steps on while 14's prefix is in flight (steps 3-4) and 15 waits for a slot; both start at 5.
    assert done_at == [9, 14, 14]
    for a, b in zip(got, alone, strict=True):
        assert a is not None and b is not None and np.abs(a - b).max() <= TOL
    assert runner.slots.free_slots == runner.capacity and not runner.slots.pending


def test_reset_waits_for_the_prefix_in_flight(tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A supervisor's reset drops the slots' states, but not before the prefix in flight is done: its
    copies may still read the pinned staging rows that the next prefix writes."""
    runner = fast_runner(tiny)
    runner.slots.overlap = True
    monkeypatch.setattr(HostEvent, "query", lambda self: False)  # the prefix stays in flight
    waited: list[HostEvent] = []
    monkeypatch.setattr(HostEvent, "synchronize", lambda self: waited.append(self))
    r = robot(16)
    (slot,) = runner.slots.admit([(runner.prepare(r), r.num_steps)])
    assert slot is not None and runner.slots.pending and not waited
    runner.slots.reset()
    assert len(waited) == 1 and not runner.slots.pending
    assert runner.slots.free_slots == runner.capacity
