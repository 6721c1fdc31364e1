"""A client secret's bytes and back, for tests that look inside (or tamper with) the sealed format."""

from __future__ import annotations

import base64


def blob_of(value: str) -> bytes:
    """The bytes an ``ek_…`` value encodes."""
    return base64.urlsafe_b64decode(value[3:] + "=" * (-len(value[3:]) % 4))


def value_of(blob: bytes) -> str:
    """The ``ek_…`` value of ``blob``."""
    return "ek_" + base64.urlsafe_b64encode(blob).decode().rstrip("=")
