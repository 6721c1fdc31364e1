"""The contract kit: every registered backend (``models/families.py``), at a small CPU config, through
the same checks: it describes itself in a record that crosses processes as it is, its warm-up really
infers and fills the report, a request runs to its end in outputs of its kind (TTS: frames of the
declared size), every opened state is released exactly once, a full backend's slot comes back when a
stream is cancelled, and a bad request is refused with a message that says what is wrong."""

from __future__ import annotations

import asyncio
import pickle
import re
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from realtime_gw.models.contract import BackendInfo, NoFreeSlot, WorkerFault
from realtime_gw.models.families import FAMILIES, StagePlan, chosen
from realtime_gw.models.runtime import END_OF_INPUT, StageWorker, Stream
from realtime_gw.models.speech.streaming.frame_engine import FrameEngine
from realtime_gw.models.speech.tts_base import FrameTtsLoop
from realtime_gw.records.voice import FRAME_SAMPLES, OUTPUT_RATE
from tests.models.contract_kit import CASES, OUTPUTS, Counting, KitCase, run_to_end
from tests.models.waiting import wait_for


@dataclass
class Kit:
    case: KitCase
    plan: StagePlan
    backend: Any
    before: BackendInfo
    """Its description before the warm-up."""

    @property
    def info(self) -> BackendInfo:
        return self.backend.describe()  # type: ignore[no-any-return]

    def good(self) -> tuple[Any, list[Any]]:
        return self.case.good(self.info)

    def worker(self, backend: Any) -> StageWorker:
        room = self.info.slots or 4
        return StageWorker(backend, max_batch=room, max_active=room, admit=self.plan.admit)


@pytest.fixture(scope="module", params=CASES, ids=[c.id for c in CASES])
def kit(request: pytest.FixtureRequest) -> Kit:
    case: KitCase = request.param
    config = case.config()
    family = chosen(case.role, config)
    assert (family.role, family.name) == (case.role, case.family)
    plan = family.from_config(config)
    backend = plan.build_backend()
    before = backend.describe()
    backend.warmup()
    return Kit(case, plan, backend, before)


def test_every_registered_family_is_in_the_kit() -> None:
    assert {(f.role, f.name) for f in FAMILIES} == {(c.role, c.family) for c in CASES}


def test_the_description_is_a_plain_record_that_round_trips(kit: Kit) -> None:
    info = kit.info
    assert info.name == kit.backend.name
    assert pickle.loads(pickle.dumps(info)) == info  # a child process's pipe, Ray
    plain = msgspec.structs.replace(info, policy_spec=None)  # the spec is a dataclass of its own: pickled
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(plain), type=BackendInfo)
    assert msgspec.to_builtins(wire) == msgspec.to_builtins(plain)
    if kit.case.role == "tts":
        assert info.voices and info.default_voice and info.native_rate
        assert (info.output_rate, info.frame_samples) == (OUTPUT_RATE, FRAME_SAMPLES)
    elif kit.case.role == "policy":
        assert info.policy_spec is not None and info.policy_spec.action_horizon > 0
    else:
        assert info.native_rate and info.native_rate > 0


def test_the_warmup_infers_and_fills_the_report(kit: Kit) -> None:
    assert kit.before.warmup_report == {}
    report = kit.info.warmup_report
    assert report and report["seconds"] >= 0
    evidence = {
        "tts": "audio_ms",
        "asr": "slots",
        "vad": "windows",
        "turn": "probability",
        "policy": "seconds",
        "s2s": "frames",
    }
    assert evidence[kit.case.role] in report
    if kit.case.role == "tts":
        assert report["audio_ms"] > 0  # it spoke


def test_a_request_runs_to_its_end_in_outputs_of_its_kind(kit: Kit) -> None:
    outputs = run_to_end(kit.backend, *kit.good())
    assert outputs and all(isinstance(o, OUTPUTS[kit.case.role]) for o in outputs)
    if isinstance(kit.backend, FrameTtsLoop):  # the codec-LM families: their engine is the typed one
        assert isinstance(kit.backend.engine, FrameEngine)
    if kit.case.role == "tts":
        size = 2 * (kit.info.frame_samples or 0)
        *frames, last = outputs
        assert (
            all(len(f.pcm) == size and not f.final for f in frames) and last.final and len(last.pcm) <= size
        )
        assert sum(len(f.pcm) for f in outputs) > 0
    if kit.case.role == "s2s":  # one frame per 80 ms of input, in order, each 80 ms of voice
        assert kit.info.s2s is not None and kit.info.frame_samples
        assert [f.index for f in outputs] == list(range(3))
        assert all(len(f.pcm) == 2 * kit.info.frame_samples for f in outputs)


def _push(stream: Stream[Any], inputs: list[Any]) -> None:
    for item in inputs:
        if item is END_OF_INPUT:
            stream.close_input()
        else:
            stream.push(item)


async def test_every_open_is_released_exactly_once(kit: Kit) -> None:
    """Through a stage worker: a stream run to its end, one cancelled at once, one cancelled after its
    first output."""
    counting = Counting(kit.backend)
    worker = kit.worker(counting)
    await worker.start(warmup=False)
    try:
        request, inputs = kit.good()
        done = worker.submit(request)
        _push(done, inputs)
        assert await asyncio.wait_for(done.collect(), 30)
        at_once = worker.submit(request)
        _push(at_once, inputs)
        at_once.cancel()
        later = worker.submit(request)
        _push(later, inputs)
        async for _ in later:
            break
        later.cancel()
        await wait_for(
            lambda: worker.active_count == 0 and len(counting.released) >= len(counting.opened), 30
        )
        await asyncio.sleep(0.05)  # nothing is released twice later
    finally:
        await worker.stop()
    assert counting.opened and counting.releases_per_open() == [1] * len(counting.opened)


def test_a_cancelled_stream_gives_its_slot_back(kit: Kit) -> None:
    backend, slots = kit.backend, kit.info.slots
    request, _ = kit.good()
    opened: list[Any] = []
    try:
        if slots is None:  # no fixed pool: opens never run out
            opened += [backend.open(request) for _ in range(8)]
            return
        with pytest.raises(NoFreeSlot, match="no free slot"):
            for _ in range(slots + 1):
                opened.append(backend.open(request))
        assert len(opened) == slots, "the description's slots are what open hands out"
        backend.release(opened.pop())
        opened.append(backend.open(request))
    finally:
        for state in opened:
            backend.release(state)


async def test_a_bad_request_is_refused_clearly(kit: Kit) -> None:
    case = kit.case
    with pytest.raises((ValueError, TypeError), match=re.escape(case.refusal)):
        kit.backend.open(case.bad)
    worker = kit.worker(kit.backend)
    await worker.start(warmup=False)
    try:
        why = rf"{re.escape(kit.backend.name)}: .*{re.escape(case.refusal)}"
        with pytest.raises(WorkerFault, match=why):
            await asyncio.wait_for(worker.submit(case.bad).collect(), 30)
    finally:
        await worker.stop()
