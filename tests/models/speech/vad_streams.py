"""Driving Silero VAD backends directly (no worker) and through a worker, for the VAD tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from realtime_gw.models.runtime import END_OF_INPUT, NoFreeSlot
from realtime_gw.models.speech.vad_silero import WINDOW_MS
from realtime_gw.records.voice import VadProbs, VadRequest


async def run_vad(worker: Any, pcm: bytes, rate: int, chunk_bytes: int = 1600) -> list[float]:
    """Push ``pcm`` in chunks, close, and check the windows come back contiguous from 0 ms."""
    s = worker.submit(VadRequest(sample_rate=rate))
    for i in range(0, len(pcm), chunk_bytes):
        s.push(pcm[i : i + chunk_bytes])
        await asyncio.sleep(0)  # let the worker take chunks as they come, like a live session
    s.close_input()
    probs: list[float] = []
    for out in await s.collect():
        assert isinstance(out, VadProbs) and out.window_ms == WINDOW_MS
        assert out.start_ms == pytest.approx(len(probs) * WINDOW_MS)
        probs += out.probs
    return probs


def drain(vad: Any, states: list[Any]) -> list[list[float]]:
    """Step states with no new input while they have a backlog (the worker does this via has_work)."""
    out: list[list[float]] = [[] for _ in states]
    while any(vad.has_work(s) for s in states):
        for acc, r in zip(out, vad.step([(s, []) for s in states]), strict=True):
            acc += [p for o in r.outputs for p in o.probs]
    return out


def drive_alone(vad: Any, chunks: list[bytes]) -> list[float]:
    state = vad.open(VadRequest(sample_rate=16000))
    probs: list[float] = []
    for c in chunks:
        [r] = vad.step([(state, [c])])
        probs += [p for out in r.outputs for p in out.probs]
    probs += drain(vad, [state])[0]
    vad.release(state)
    return probs


@dataclass
class Scheduled:
    """One stream of a schedule: opened at step ``start`` (or the first step after that with a free
    slot), then one chunk pushed per step, then ``END_OF_INPUT``; released once done."""

    rate: int
    chunks: list[bytes]
    start: int = 0
    probs: list[float] = field(default_factory=list)
    slots_held: list[int] = field(default_factory=list)


def run_schedule(vad: Any, streams: list[Scheduled]) -> None:
    """Step ``streams`` together as a worker would: they join and leave at different steps, each step
    batches every open one, and a stream waits for a slot while the backend is full. Checks each
    stream's windows come back contiguous from 0 ms; fills ``probs`` (and ``slots_held``)."""
    open_: dict[int, tuple[Any, int]] = {}  # stream index -> (state, chunks pushed)
    done: set[int] = set()
    step = 0
    while len(done) < len(streams):
        for i, st in enumerate(streams):
            if i in done or i in open_ or step < st.start:
                continue
            try:
                state = vad.open(VadRequest(sample_rate=st.rate))
            except NoFreeSlot:
                continue
            open_[i] = (state, 0)
            st.slots_held.append(getattr(state, "slot", -1))
        work, order = [], []
        for i, (state, pushed) in open_.items():
            chunks = streams[i].chunks
            inputs: list[Any] = [chunks[pushed]] if pushed < len(chunks) else []
            if pushed + 1 == len(chunks):
                inputs.append(END_OF_INPUT)
            open_[i] = (state, pushed + 1)
            work.append((state, inputs))
            order.append(i)
        for i, result in zip(order, vad.step(work), strict=True):
            assert result.error is None, result.error
            for out in result.outputs:
                assert out.start_ms == pytest.approx(len(streams[i].probs) * WINDOW_MS)
                streams[i].probs += out.probs
            if result.done:
                vad.release(open_.pop(i)[0])
                done.add(i)
        step += 1
        assert step < 10_000, "schedule does not finish"
