"""Keep one client's bad frames from filling the server log.

uvicorn answers a text frame with invalid UTF-8 correctly (close 1007) but logs it as an ERROR with a
traceback, from inside its protocol, before the app sees anything: one line per offending connection is
enough (the access log already has a line per connection)."""

from __future__ import annotations

import logging

CLIENT_FAULTS = frozenset({"Invalid UTF-8 sequence received from client."})
"""uvicorn messages about what a client sent, not about the server."""


class ClientFaultFilter(logging.Filter):
    """Turns uvicorn's client-fault ERRORs into one INFO line without a traceback (dropped where the
    logger is set above INFO)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in CLIENT_FAULTS:
            return True
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


def install() -> None:
    """Idempotent: attach the filter to uvicorn's error logger (after uvicorn configured logging)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, ClientFaultFilter) for f in logger.filters):
        logger.addFilter(ClientFaultFilter())
