"""The pure per-session bounds (server/limits.py) and the per-address connection count, with explicit
times: the input budget, the input gate's hysteresis, idle timeout and maximum duration."""

from __future__ import annotations

import resource

from realtime_gw.server.connections import ConnectionGuard, raise_open_files_limit
from realtime_gw.server.limits import REALTIME_AUDIO_BYTES_PER_S, InputBudget, InputGate, Lifetime


def test_input_budget_allows_a_burst_then_the_rate_and_answers_with_a_wait() -> None:
    budget = InputBudget.for_audio(rate_factor=10.0, burst_s=2.0, now=0.0)
    assert budget is not None
    second = REALTIME_AUDIO_BYTES_PER_S
    assert budget.spend(2 * second, now=0.0) == 0.0  # the burst
    assert budget.spend(second, now=0.0) == 0.1  # one more second of audio: 0.1 s at 10x
    assert budget.spend(second, now=0.1) == 0.1  # refilled exactly what it owed, owes again
    assert budget.spend(0, now=10.0) == 0.0 and budget.level == 2 * second  # refills up to the burst only
    assert InputBudget.for_audio(rate_factor=0.0, burst_s=2.0, now=0.0) is None  # off


def test_input_gate_pauses_at_high_water_until_low_water_and_bounds_pending_events() -> None:
    gate = InputGate(outbox_bound=100, max_pending=3)
    assert (gate.high, gate.low) == (50, 25)
    assert not gate.blocked(49)
    assert gate.blocked(50)
    assert gate.blocked(30) and not gate.may_resume(30)  # hysteresis: still above low water
    assert gate.may_resume(25) and not gate.blocked(25)
    gate.pending = 3
    assert gate.blocked(0)  # three read events not yet handled
    gate.pending = 2
    assert not gate.blocked(0)


def test_lifetime_idle_and_maximum_duration() -> None:
    life = Lifetime(idle_s=10.0, max_s=60.0, started=0.0)
    assert life.expired(9.9) is None
    assert "idle for 10 s" in str(life.expired(10.0))
    life.touch(10.0)
    assert life.expired(19.0) is None
    life.touch(59.0)
    assert "maximum duration of 60 s" in str(life.expired(60.0))
    assert Lifetime(idle_s=0.0, max_s=0.0, started=0.0).expired(1e9) is None  # both off


def test_connection_guard_counts_per_address() -> None:
    guard = ConnectionGuard(max_per_client=2, handshake_timeout_s=10.0)
    assert guard.take("a") and guard.take("a") and guard.take("b")
    assert not guard.take("a")  # a third from "a" is over the cap (and counted while open)
    guard.give("a")
    guard.give("a")
    assert guard.take("a")
    guard.give("a")
    guard.give("a")
    guard.give("b")
    assert not guard.open
    assert all(ConnectionGuard(0, 1.0).take("a") for _ in range(1000))  # 0 = no cap


def test_the_soft_open_files_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = raise_open_files_limit()
    assert (soft, hard) == resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == hard or hard == resource.RLIM_INFINITY
