"""``streaming/layers.py``'s TF32 flags under concurrent stage threads (``tf32_flags``, what ``fp32_mode`` uses
on CUDA): restored when the last user leaves, off while any user wants strict float32. The flags are
process-wide on CPU builds too, so threads exercise the real torch switches here."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest
import torch

from realtime_gw.models.speech.streaming.layers import fp32_mode, tf32_flags


def flags() -> tuple[bool, bool, bool]:
    cudnn = torch.backends.cudnn
    return cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, cudnn.benchmark


def set_flags(conv: bool, mm: bool, bench: bool) -> None:
    cudnn = torch.backends.cudnn
    cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, cudnn.benchmark = conv, mm, bench


@pytest.fixture(autouse=True)
def baseline() -> Iterator[tuple[bool, bool, bool]]:
    """A process setting of TF32 on for matmuls, off for convs, no benchmark (any leak shows); restored after."""
    before = flags()
    set_flags(False, True, False)
    yield flags()
    set_flags(*before)


def test_nested_modes_in_one_thread_restore_the_process_setting(baseline: tuple[bool, bool, bool]) -> None:
    with tf32_flags(True, cudnn_benchmark=True):
        assert flags() == (True, True, True)
        with tf32_flags(False):
            assert flags() == (False, False, True)
        assert flags() == (True, True, True)
    assert flags() == baseline


def test_fp32_mode_leaves_the_flags_alone_off_cuda(baseline: tuple[bool, bool, bool]) -> None:
    with fp32_mode(torch.device("cpu"), False, cudnn_benchmark=True):
        assert flags() == baseline


def step_in_order(script: list[tuple[str, str]], modes: dict[str, bool]) -> list[tuple[bool, bool, bool]]:
    """Threads entering and leaving ``tf32_flags`` in exactly ``script``'s order ((thread, "in"/"out")
    steps); the flags seen after each step."""
    turn = [threading.Event() for _ in script]
    done = [threading.Event() for _ in script]
    seen: list[tuple[bool, bool, bool]] = [flags()] * len(script)

    def user(name: str) -> None:
        mine = [i for i, (who, _) in enumerate(script) if who == name]
        enter, leave = mine
        turn[enter].wait()
        with tf32_flags(modes[name]):
            seen[enter] = flags()
            done[enter].set()
            turn[leave].wait()
        seen[leave] = flags()
        done[leave].set()

    threads = [threading.Thread(target=user, args=(name,)) for name in modes]
    for t in threads:
        t.start()
    for i in range(len(script)):
        turn[i].set()
        assert done[i].wait(10)
    for t in threads:
        t.join(10)
    return seen


def test_interleaved_users_restore_the_process_setting_when_the_last_leaves(
    baseline: tuple[bool, bool, bool],
) -> None:
    """The order that left TF32 flipped with a save/restore per user: strict in, TF32 in, strict out
    (restored the process setting under the TF32 user), TF32 out (restored strict's off for good)."""
    script = [("strict", "in"), ("fast", "in"), ("strict", "out"), ("fast", "out")]
    seen = step_in_order(script, {"strict": False, "fast": True})
    off, on = (False, False, False), (True, True, False)
    assert seen == [off, off, on, baseline]  # strict wins while it is in; the TF32 user alone has TF32


def test_a_strict_user_entering_under_a_tf32_user_turns_tf32_off_until_it_leaves(
    baseline: tuple[bool, bool, bool],
) -> None:
    script = [("fast", "in"), ("strict", "in"), ("fast", "out"), ("strict", "out")]
    seen = step_in_order(script, {"strict": False, "fast": True})
    assert seen == [(True, True, False), (False, False, False), (False, False, False), baseline]


def test_many_threads_strict_users_never_see_tf32_and_the_setting_survives(
    baseline: tuple[bool, bool, bool],
) -> None:
    errors: list[str] = []
    start = threading.Barrier(6)

    def user(seed: int) -> None:
        rng = random.Random(seed)
        start.wait()
        for _ in range(300):
            tf32 = rng.random() < 0.5
            with tf32_flags(tf32, cudnn_benchmark=rng.random() < 0.3):
                if not tf32 and flags()[:2] != (False, False):
                    errors.append("TF32 on inside a strict user")
                if rng.random() < 0.3:
                    with tf32_flags(not tf32):
                        pass
                    if not tf32 and flags()[:2] != (False, False):
                        errors.append("TF32 on inside a strict user after a nested TF32 user")

    threads = [threading.Thread(target=user, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    assert flags() == baseline
