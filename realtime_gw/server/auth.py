"""API-key checks shared by every endpoint (constant-time)."""

from __future__ import annotations

import hmac


def bearer_key(header: str | None, scheme: str = "Bearer") -> str | None:
    """The key from ``Authorization: <scheme> <key>`` (scheme case-insensitive), else None."""
    if not header:
        return None
    got_scheme, _, key = header.partition(" ")
    if got_scheme.lower() != scheme.lower() or not key.strip():
        return None
    return key.strip()


def key_matches(given: str | None, expected: str) -> bool:
    if given is None:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())
