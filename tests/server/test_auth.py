"""``Access``: per-key session slots and session-start rate, fed with explicit times."""

from __future__ import annotations

from realtime_gw.server.auth import Access


def test_start_rate_is_a_sliding_minute_per_key() -> None:
    access = Access(["a", "b"], session_starts_per_key_per_min=2)
    assert access.acquire("a", now=0.0) is None
    access.release("a")
    assert access.acquire("a", now=10.0) is None
    access.release("a")
    refusal = access.acquire("a", now=30.0)
    assert refusal is not None and refusal.code == "rate_limit_exceeded"
    assert "2 per minute" in refusal.message and "retry in 30 s" in refusal.message
    assert access.acquire("b", now=30.0) is None  # another key has its own window
    assert access.acquire("a", now=60.5) is None  # the start at 0 has left the window
    assert access.sessions == {"a": 1, "b": 1}  # refused starts took no slot


def test_slot_refusals_do_not_spend_the_rate() -> None:
    access = Access(["a"], max_sessions_per_key=1, session_starts_per_key_per_min=2)
    assert access.acquire("a", now=0.0) is None
    for t in (1.0, 2.0, 3.0):
        refusal = access.acquire("a", now=t)
        assert refusal is not None and refusal.code == "session_limit_reached"
    access.release("a")
    assert access.acquire("a", now=4.0) is None  # second start of the minute: still allowed
    access.release("a")
    refusal = access.acquire("a", now=5.0)  # third: the rate, not the slot
    assert refusal is not None and refusal.code == "rate_limit_exceeded"


def test_no_limits_by_default() -> None:
    access = Access([])
    for t in range(100):
        assert access.acquire("", now=float(t)) is None
    assert access.sessions[""] == 100
