"""``SlotPool``: lowest free slot first, double frees refused, particular slots taken for exchanges."""

from __future__ import annotations

import random

import pytest

from realtime_gw.models.slot_pool import SlotPool


def test_hands_out_the_lowest_free_slot_until_empty() -> None:
    pool = SlotPool(3)
    assert len(pool) == 3 and pool.lowest() == 0
    assert [pool.take(), pool.take(), pool.take()] == [0, 1, 2]
    assert len(pool) == 0 and pool.take() is None and pool.lowest() is None
    pool.give(2)
    pool.give(0)
    assert pool.free_slots() == [0, 2] and pool.lowest() == 0
    assert pool.take() == 0 and pool.take() == 2


def test_a_slot_given_back_twice_or_out_of_range_raises_and_changes_nothing() -> None:
    pool = SlotPool(2, "policy")
    slot = pool.take()
    assert slot == 0
    pool.give(slot)
    with pytest.raises(ValueError, match="policy slot 0 freed twice"):
        pool.give(slot)
    with pytest.raises(ValueError, match="out of range"):
        pool.give(2)
    with pytest.raises(ValueError, match="out of range"):
        pool.give(-1)
    assert pool.free_slots() == [0, 1] and [pool.take(), pool.take(), pool.take()] == [0, 1, None]


def test_take_slot_takes_that_slot_and_only_a_free_one() -> None:
    pool = SlotPool(4)
    pool.take_slot(1)
    assert not pool.is_free(1) and pool.free_slots() == [0, 2, 3]
    with pytest.raises(ValueError, match="slot 1 is not free"):
        pool.take_slot(1)
    pool.take_slot(0)  # the heap's top: the next take is the next lowest
    assert pool.take() == 2 and pool.take() == 3 and pool.take() is None


def test_reset_frees_every_slot() -> None:
    pool = SlotPool(3)
    pool.take()
    pool.take_slot(2)
    pool.reset()
    assert len(pool) == 3 and pool.free_slots() == [0, 1, 2] and pool.take() == 0


def test_random_use_matches_a_plain_set() -> None:
    """Against the obvious reference (a set, ``min`` for the lowest): every answer agrees."""
    rng = random.Random(0)
    capacity = 16
    pool, free = SlotPool(capacity), set(range(capacity))
    for _ in range(2000):
        op = rng.choice(["take", "give", "take_slot"])
        if op == "take":
            expected = min(free) if free else None
            assert pool.take() == expected
            free.discard(expected)  # type: ignore[arg-type]
        elif op == "give" and len(free) < capacity:
            slot = rng.choice(sorted(set(range(capacity)) - free))
            pool.give(slot)
            free.add(slot)
        elif op == "take_slot" and free:
            slot = rng.choice(sorted(free))
            pool.take_slot(slot)
            free.remove(slot)
        assert len(pool) == len(free) and pool.free_slots() == sorted(free)
        assert pool.lowest() == (min(free) if free else None)
        assert all(pool.is_free(s) == (s in free) for s in range(capacity))
