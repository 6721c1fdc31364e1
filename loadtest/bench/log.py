"""Where the benches record their runs: appended to docs/benchmarks-log.md (newest last)."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS_LOG = Path(__file__).resolve().parents[2] / "docs" / "benchmarks-log.md"


def append_run(text: str) -> Path:
    """Append one run's text (its heading, hardware, command and table) to the log; returns the log's path."""
    with BENCHMARKS_LOG.open("a") as f:
        f.write(text)
    return BENCHMARKS_LOG
