"""Kyutai ASR catch-up (tiny config, CPU, float32, random init): ending streams' extra sub-steps, packed into
the low slots, give exactly the tokens and outputs of plain one-frame-per-step flushing (and ``generate``'s),
with streams joining, leaving, several ending in one step and talking streams swapped out of the low slots;
an ending stream's final comes ``ceil(frames left / (1 + sub-steps))`` worker steps after its END_OF_INPUT
instead of ``frames left``; the time budget bounds the sub-steps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from realtime_gw.models.speech.asr_kyutai import KyutaiAsrBackend
from realtime_gw.models.speech.kyutai.checkpoint import KyutaiCheckpoint, random_checkpoint
from realtime_gw.models.speech.kyutai.engine import KyutaiAsrEngine
from tests.models.speech.kyutai_streams import Turn, drive, reference_tokens, speechlike


@pytest.fixture(scope="module")
def ck() -> KyutaiCheckpoint:
    return random_checkpoint("tiny", "cpu", torch.float32)


_REFERENCE: dict[bytes, list[int]] = {}


def _reference(ck: KyutaiCheckpoint, pcm: np.ndarray) -> list[int]:
    """``reference_tokens``, once per clip for the module (the parametrized cases share clips)."""
    key = pcm.tobytes()
    if key not in _REFERENCE:
        _REFERENCE[key] = reference_tokens(ck, pcm)
    return _REFERENCE[key]


def _mixed_turns() -> list[Turn]:
    """Six slots. a talks the whole time from slot 0, swapped out when a stream above it ends; b ends
    first (a partial last frame); c and d end in the same step while b still flushes; e is cancelled
    mid-utterance; f and g join (one in e's slot) and end in the same step."""
    return [
        Turn(speechlike(11, 13)),  # a
        Turn(speechlike(12, 5.5)),  # b
        Turn(speechlike(13, 6), start=1),  # c
        Turn(speechlike(14, 5), start=2),  # d
        Turn(speechlike(15, 8), start=3, cancel_at=6),  # e
        Turn(speechlike(16, 4), start=8),  # f
        Turn(speechlike(17, 3.7), start=8),  # g
    ]


def test_catch_up_gives_the_same_tokens_and_outputs_as_plain_flushing(ck: KyutaiCheckpoint) -> None:
    plain, fast = _mixed_turns(), _mixed_turns()
    drive(KyutaiAsrBackend(checkpoint=ck, slots=6, catchup_steps=0), plain)
    backend = KyutaiAsrBackend(checkpoint=ck, slots=6, catchup_steps=3, catchup_budget_s=None)
    drive(backend, fast)
    assert backend.free_slots == 6 and backend.substeps > 0
    for p, f in zip(plain, fast, strict=True):
        assert f.tokens == p.tokens and f.outputs == p.outputs
    a, _, c, d = fast[:4]
    assert a.slots[0] == 0 and max(a.slots) > 0, "the talking stream was swapped out of the low slots"
    assert c.end_step == d.end_step
    assert len({t.end_step for t in fast[5:]}) == 1
    for p, f in zip(plain, fast, strict=True):
        if f.cancel_at is None:
            assert f.tokens == _reference(ck, f.pcm) and f.outputs[-1].final
            assert f.end_step is not None and f.final_step is not None and f.frames_left_at_end is not None
            assert p.final_step is not None and p.final_step - f.end_step + 1 == f.frames_left_at_end
            assert f.final_step - f.end_step + 1 == math.ceil(f.frames_left_at_end / 4)


@pytest.mark.parametrize("substeps", [0, 1, 3, 7])
def test_end_of_input_to_final_takes_ceil_frames_left_over_catch_up_steps(
    ck: KyutaiCheckpoint, substeps: int
) -> None:
    """Two talking streams hold slots 0 and 1; three streams end in the same step from slots 2-4 (packed
    into slots 0-2 for a batch bucket of 4, not 5): each ends ceil(R / (1 + substeps)) steps after its
    END_OF_INPUT (R = its frames left then, flush included), the talkers continue unchanged."""
    turns = [Turn(speechlike(20 + k, 16 if k < 2 else 5.2 + 0.35 * (k - 2))) for k in range(5)]
    backend = KyutaiAsrBackend(checkpoint=ck, slots=5, catchup_steps=substeps, catchup_budget_s=None)
    drive(backend, turns)
    for t in turns[2:]:
        assert t.end_step == 6 and t.frames_left_at_end is not None and t.final_step is not None
        assert t.frames_left_at_end >= backend.flush_samples // 1920 - 1  # the flush, about
        steps = t.final_step - t.end_step + 1  # the END_OF_INPUT step counts
        assert steps == math.ceil(t.frames_left_at_end / (1 + substeps))
    if substeps:
        assert all(max(t.slots) >= 2 for t in turns[:2]), "the talkers made room"
    for t in turns:
        assert t.tokens == _reference(ck, t.pcm)


def test_time_budget_bounds_the_sub_steps(ck: KyutaiCheckpoint) -> None:
    """A budget the main step alone exceeds starts no sub-step: one frame per worker step, as without."""
    [turn] = turns = [Turn(speechlike(30, 4))]
    drive(KyutaiAsrBackend(checkpoint=ck, slots=2, catchup_steps=7, catchup_budget_s=0.0), turns)
    assert turn.final_step is not None and turn.end_step is not None
    assert turn.final_step - turn.end_step + 1 == turn.frames_left_at_end
    with pytest.raises(ValueError, match="catch-up"):
        KyutaiAsrBackend(checkpoint=ck, slots=2, catchup_steps=-1)


def test_exchange_moves_a_stream_between_slots_mid_utterance(ck: KyutaiCheckpoint) -> None:
    """``exchange`` into a free slot, then back with slots just allocated (reset pending): the stream
    continues with the tokens it has alone, the free list follows, the other slots start fresh."""
    frames = speechlike(40, 9).reshape(-1, 1920)
    other = speechlike(41, 1).reshape(-1, 1920)
    solo = KyutaiAsrEngine(ck.model, 1)
    s = solo.alloc()
    expected = [int(solo.step([s], f[None])[0][0]) for f in frames]
    solo.free(s)
    expected_other = int(solo.step([solo.alloc()], other)[0][0])
    eng = KyutaiAsrEngine(ck.model, 4)
    low, mid, high = eng.alloc(), eng.alloc(), eng.alloc()
    eng.free(low)
    eng.free(mid)
    got = [int(eng.step([high], frames[i][None])[0][0]) for i in range(4)]
    eng.exchange([(high, low)])  # into a free slot: high is the free one now
    assert eng.frames[low] == 4 and eng.frames[high] == 0 and eng.free_slots == 3
    got += [int(eng.step([low], frames[i][None])[0][0]) for i in range(4, 6)]
    assert eng.alloc() == mid and eng.alloc() == high  # both reset at the next step (or exchange)
    eng.exchange([(low, high)])
    got += [int(eng.step([high], frames[i][None])[0][0]) for i in range(6, 9)]
    assert got == expected
    fresh = eng.step([mid, low], np.stack([other[0], frames[0]]))[0].tolist()
    assert fresh == [expected_other, expected[0]]
    with pytest.raises(ValueError, match="overlap"):
        eng.exchange([(0, 1), (1, 2)])


def test_gateway_flags_set_the_catch_up() -> None:
    from realtime_gw.cli import build_parser
    from realtime_gw.config import FIELDS, load_config
    from realtime_gw.models.speech.asr_kyutai import build_kyutai_asr

    def backend(*flags: str) -> KyutaiAsrBackend:
        args = build_parser().parse_args(["serve", "--asr", "kyutai", "--asr-max-batch", "2", *flags])
        return build_kyutai_asr(load_config(env={}, overrides={k: getattr(args, k) for k in FIELDS}))

    default = backend()
    assert (default.catchup_steps, default.catchup_budget_s) == (0, 0.05)  # off unless asked for
    tuned = backend("--asr-catchup-steps", "3", "--asr-catchup-budget-ms", "0")
    assert (tuned.catchup_steps, tuned.catchup_budget_s) == (3, None)
