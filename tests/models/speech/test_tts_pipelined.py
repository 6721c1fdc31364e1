"""The pipelined frame loop (``SlotEngine.launch``: a frame's decoder runs behind the next frame's talker)
gives the same codes, audio and word marks as one whole frame per step, with streams joining, pausing
for text, ending and being cancelled mid-flight (tiny Qwen3-TTS checkpoint, CPU; on CUDA the decoder
runs on a stream of its own, measured in ``loadtest/bench/tts_qwen3_gpu.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from realtime_gw.models.runtime import END_OF_INPUT
from realtime_gw.models.speech.qwen3.checkpoint import Qwen3TtsCheckpoint, load_checkpoint
from realtime_gw.models.speech.qwen3.engine import Qwen3Engine, build_prompt
from realtime_gw.models.speech.qwen3.talker import Sampling
from realtime_gw.models.speech.tts_qwen3 import Qwen3TtsBackend
from realtime_gw.records.voice import FRAME_SAMPLES, TtsRequest

CKPT = Path(__file__).resolve().parents[2] / "fixtures" / "qwen3_tts_tiny"
GREEDY = Sampling(do_sample=False, sub_do_sample=False)

# Which slots step at each step: slot 1 joins late, slot 0 pauses, slot 2 leaves after step 3.
SCHEDULE = [[0, 2], [0, 2], [2], [0, 1, 2], [0, 1], [], [1], [0, 1]]


@pytest.fixture(scope="module")
def ck() -> Qwen3TtsCheckpoint:
    return load_checkpoint(CKPT, "cpu", torch.float32)


def _engine(ck: Qwen3TtsCheckpoint, pipelined: bool) -> tuple[Qwen3Engine, list[int]]:
    eng = Qwen3Engine(ck, 3, max_positions=64, sampling=GREEDY, cuda_graphs=False, pipelined=pipelined)
    prompts = [build_prompt(ck, [1, 2, 3], v, "english") for v in ("ryan", "dylan", "vivian")]
    return eng, [eng.alloc_prompt(p) for p in prompts]


def test_launch_gives_each_frame_once_one_step_later_equal_to_step(ck: Qwen3TtsCheckpoint) -> None:
    sync, slots = _engine(ck, pipelined=False)
    want_codes: dict[int, list[np.ndarray]] = {s: [] for s in slots}
    want_pcm: dict[int, list[np.ndarray]] = {s: [] for s in slots}
    for k, active in enumerate(SCHEDULE):
        if active:
            codes, pcm = sync.step(active, [50 + k] * len(active), [False] * len(active))
            for j, s in enumerate(active):
                want_codes[s].append(codes[j])
                want_pcm[s].append(pcm[j])

    eng, slots = _engine(ck, pipelined=True)
    codes_of: dict[int, list[np.ndarray]] = {s: [] for s in slots}
    pcm_of: dict[int, list[np.ndarray]] = {s: [] for s in slots}
    previous: list[int] = []
    for k, active in enumerate(SCHEDULE):
        if active:
            codes = eng.launch(active, [50 + k] * len(active), [False] * len(active))
            for j, s in enumerate(active):
                codes_of[s].append(codes[j])
        else:
            eng.flush()
        for s in previous:  # the previous step's frames land, and only those
            pcm_of[s].append(eng.take(s))
        assert all(eng.take(s) is None for s in set(active) - set(previous))
        previous = active
    eng.flush()
    for s in previous:
        pcm_of[s].append(eng.take(s))
    for s in slots:
        assert np.array_equal(np.stack(codes_of[s]), np.stack(want_codes[s]))
        assert np.array_equal(np.stack(pcm_of[s]), np.stack(want_pcm[s]))
        assert eng.take(s) is None  # each frame once


def test_a_freed_slots_frame_in_flight_is_dropped(ck: Qwen3TtsCheckpoint) -> None:
    """A stream cancelled while its frame decodes: the frame is never handed to the slot's next stream,
    which speaks as it would have in a fresh engine."""
    fresh, (a, *_) = _engine(ck, pipelined=True)
    want = [fresh.step([a], [60 + k], [False]) for k in range(3)]
    eng, (a, b, _) = _engine(ck, pipelined=True)
    eng.launch([a, b], [9, 9], [False, False])
    eng.free(a)  # cancelled mid-flight
    again = eng.alloc_prompt(build_prompt(ck, [1, 2, 3], "ryan", "english"))
    assert again == a
    got = []
    for k in range(3):
        codes = eng.launch([again], [60 + k], [False])
        assert eng.take(b) is not None or k > 0  # the other stream's frame still lands
        eng.flush()
        got.append((codes, np.stack([eng.take(again)])))
    for (wc, wp), (gc, gp) in zip(want, got, strict=True):
        assert np.array_equal(wc, gc) and np.array_equal(wp, gp)


def _drive(
    backend: Qwen3TtsBackend, scripts: list[dict[int, list[Any]]]
) -> list[list[tuple[bytes, str, bool]]]:
    """Streams fed as a stage worker feeds them: stream i opens at its script's first step and gets that
    step's inputs; a stream steps when it has inputs or work. Returns each stream's frames."""
    frames: list[list[tuple[bytes, str, bool]]] = [[] for _ in scripts]
    states: dict[int, Any] = {}
    done: set[int] = set()
    for k in range(400):
        work, who = [], []
        for i, script in enumerate(scripts):
            if i in done:
                continue
            if i not in states and k == min(script):
                states[i] = backend.open(TtsRequest(voice="ryan"))
            if i in states:
                inputs = script.get(k, [])
                if inputs or backend.has_work(states[i]):
                    work.append((states[i], inputs))
                    who.append(i)
        if not work and len(done) == len(scripts):
            break
        for i, result in zip(who, backend.step(work), strict=True):
            assert result.error is None
            frames[i] += [(f.pcm, f.text, f.final) for f in result.outputs]
            if result.done:
                backend.release(states[i])
                done.add(i)
    assert len(done) == len(scripts)
    return frames


def test_backend_streams_equal_with_and_without_pipelining() -> None:
    """Three streams, text arriving in pieces and pauses, ending on the model's EOS or at their limit:
    every frame (audio, word marks, final flag) the same both ways, audio in whole 80 ms frames."""
    scripts = [
        {0: ["Hello there, how"], 4: [" are you"], 9: [" today?", END_OF_INPUT]},
        {2: ["Short.", END_OF_INPUT]},
        {1: ["A longer sentence that keeps going for a while"], 3: [" and then", END_OF_INPUT]},
    ]
    out = {}
    for pipelined in (False, True):
        torch.manual_seed(0)
        backend = Qwen3TtsBackend(
            path=str(CKPT), slots=3, sampling=GREEDY, pipelined=pipelined, max_frames_per_token=2
        )
        assert backend.engine.pipelined is pipelined
        out[pipelined] = _drive(backend, scripts)
        assert backend.engine.free_slots == 3
    for piped, whole in zip(out[True], out[False], strict=True):
        assert [f[1:] for f in piped] == [f[1:] for f in whole]  # word marks and final flags
        assert [len(f[0]) for f in piped] == [len(f[0]) for f in whole]
        a, b = (
            np.frombuffer(b"".join(f[0] for f in frames), np.int16).astype(int) for frames in (piped, whole)
        )
        # The pipelined loop launches one frame past an utterance's last (dropped), so its batch mates'
        # steps differ from here on by that row, which moves CPU float32 rounding by at most 1 LSB; with
        # the same steps the frames are equal bit for bit (the engine tests above).
        assert np.abs(a - b).max() <= 1
    for frames in out[True]:
        assert frames[-1][2] and not any(final for _, _, final in frames[:-1])
        assert all(len(pcm) == 2 * FRAME_SAMPLES for pcm, _, _ in frames[:-1])


def test_cancelled_stream_mid_flight_leaves_the_others_as_they_were() -> None:
    scripts = [
        {0: ["One two three four five six", END_OF_INPUT]},
        {0: ["Seven eight nine ten", END_OF_INPUT]},
    ]
    torch.manual_seed(0)
    alone = _drive(
        Qwen3TtsBackend(path=str(CKPT), slots=2, sampling=GREEDY, pipelined=True, max_frames_per_token=2),
        scripts[1:],
    )
    backend = Qwen3TtsBackend(
        path=str(CKPT), slots=2, sampling=GREEDY, pipelined=True, max_frames_per_token=2
    )
    doomed = backend.open(TtsRequest(voice="ryan"))
    backend.step([(doomed, scripts[0][0])])
    backend.step([(doomed, [])])  # a frame in flight
    assert doomed.flight is not None
    backend.release(doomed)
    assert _drive(backend, scripts[1:]) == alone
    assert backend.engine.free_slots == 2


def test_first_audio_leaves_in_the_step_that_launched_it() -> None:
    """A stream's first frame is not left in flight: first audio after one talker step and its decoding,
    also for a stream joining a running batch (whose mates' frames then keep their order)."""
    torch.manual_seed(0)
    backend = Qwen3TtsBackend(
        path=str(CKPT), slots=2, sampling=GREEDY, pipelined=True, max_frames_per_token=2
    )
    a = backend.open(TtsRequest(voice="ryan"))
    (first,) = backend.step([(a, ["One two three four five six", END_OF_INPUT])])
    assert [len(f.pcm) for f in first.outputs] == [2 * FRAME_SAMPLES]
    assert a.flight is None
    (second,) = backend.step([(a, [])])
    assert not second.outputs and a.flight is not None  # later frames: one step behind
    b = backend.open(TtsRequest(voice="dylan"))
    mate, joined = backend.step([(a, []), (b, ["Seven eight", END_OF_INPUT])])
    assert [len(f.pcm) for f in joined.outputs] == [2 * FRAME_SAMPLES]
    assert len(mate.outputs) == 1 and a.flight is not None  # its second frame; the third stays queued
    assert a.frames == 2 and b.frames == 1
