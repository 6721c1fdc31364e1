"""Files the gateway keeps for an operator (voices, consents, their prompts' codes): written whole or not at
all, readable by the gateway's user only."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, data: bytes) -> None:
    """``data`` to ``path``, mode 0600: written to a temporary name, synced, then renamed into place (a
    crash leaves the old file or the new one, never half of one)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
