"""``Access``: per-key session slots and session-start rate, fed with explicit times; the Host allowlist
and origins judged against it."""

from __future__ import annotations

from realtime_gw.server.auth import Access, HostPolicy


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


def test_hosts_served_are_local_names_the_bind_address_configured_names_and_ip_literals() -> None:
    hosts = HostPolicy(["gw.example", "*.corp.example"], bind_host="gw-internal")
    for host in ("localhost", "localhost:8000", "127.0.0.1:8000", "[::1]:8000", "gw-internal", "GW.example:443",
                 "a.corp.example", "10.0.0.7:8000", "[fe80::1]", None):  # fmt: skip
        assert hosts.allows(host), host
    for host in (
        "evil.example",
        "evil.example:8000",
        "corp.example",
        "gw.example.evil",
        "localhost:notaport",
        "",
    ):
        assert not hosts.allows(host), host
    assert HostPolicy(["*"]).allows("anything.example")
    assert not HostPolicy([], bind_host="0.0.0.0").allows("0.0.0.0.nip.io")


def test_origins_are_judged_by_served_names_not_by_the_host_header() -> None:
    access = Access([], allowed_origins=["https://app.example"], hosts=HostPolicy(["gw.example"]))
    assert access.origin_allowed(None, "evil.example")  # no Origin: not a browser
    assert access.origin_allowed("https://app.example", "127.0.0.1:8000")
    assert access.origin_allowed("http://localhost:3000", "127.0.0.1:8000")
    assert access.origin_allowed("https://gw.example", "gw.example")
    assert access.origin_allowed("http://192.168.1.5:8000", "192.168.1.5:8000")  # own page at an address
    # A rebinding page: Origin and Host both name the attacker's domain.
    assert not access.origin_allowed("http://evil.example:8000", "evil.example:8000")
    assert not access.origin_allowed("http://192.168.1.5:8000", "127.0.0.1:8000")
    assert not access.origin_allowed("null", "127.0.0.1:8000")
    # Any Host served ("*"): the gateway's own page is still its origin, others are not.
    open_hosts = Access([], hosts=HostPolicy(["*"]))
    assert open_hosts.origin_allowed("https://gw.other", "gw.other")
    assert not open_hosts.origin_allowed("https://evil.example", "gw.other")
