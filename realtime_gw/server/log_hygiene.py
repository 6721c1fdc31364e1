"""Keep one client's bad frames from filling the server log, and keys out of it.

uvicorn writes every request's path *with its query string* to the log (HTTP in ``uvicorn.access``,
WebSocket handshakes in ``uvicorn.error``): a key a client put in the URL (``?api_key=``) would be
kept there. ``KeyRedactor`` replaces such values (and any ``Bearer``/``Api-Key`` credential or
``openai-insecure-api-key.`` subprotocol that reaches a log line) with ``[redacted]``.

uvicorn answers a text frame with invalid UTF-8 correctly (close 1007) but logs it as an ERROR with a
traceback, from inside its protocol, before the app sees anything: one line per offending connection is
enough (the access log already has a line per connection)."""

from __future__ import annotations

import logging
import re

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


REDACTED = "[redacted]"
_SECRETS = re.compile(
    r"(?P<query>[?&;](?:api[_-]?key|key|token|access[_-]?token|auth|authorization|password|secret)=)[^&;#\s\"']*"
    r"|(?P<subprotocol>openai-insecure-api-key\.)[^\s,;\"']+"
    r"|(?P<scheme>\b(?:Bearer|Api-Key)\s+)[^\s,;\"']+"
    r"|(?P<ephemeral>\bek_)[A-Za-z0-9_-]+",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with every credential-looking value replaced by ``[redacted]``."""
    return _SECRETS.sub(
        lambda m: (m.group("query") or m.group("subprotocol") or m.group("scheme") or m.group("ephemeral")) + REDACTED, text
    )


class KeyRedactor(logging.Filter):
    """Redacts keys in a record's message and string arguments (uvicorn passes the path as one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
        return True


def install() -> None:
    """Idempotent: attach the filters to uvicorn's loggers (after uvicorn configured logging)."""
    error = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, ClientFaultFilter) for f in error.filters):
        error.addFilter(ClientFaultFilter())
    for name in ("uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, KeyRedactor) for f in logger.filters):
            logger.addFilter(KeyRedactor())
