"""uvicorn's log line for a client's invalid UTF-8 frame: one INFO line, no traceback, nothing else touched."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from realtime_gw.server import log_hygiene


@pytest.fixture
def uvicorn_error() -> Iterator[logging.Logger]:
    logger = logging.getLogger("uvicorn.error")
    level, filters = logger.level, list(logger.filters)
    log_hygiene.install()
    log_hygiene.install()  # idempotent
    yield logger
    logger.setLevel(level)
    logger.filters = filters


def _raise_decode_error(logger: logging.Logger, message: str) -> None:
    try:
        b"\xff".decode()
    except UnicodeDecodeError:
        logger.exception(message)


def test_client_fault_is_one_info_line(
    uvicorn_error: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    assert sum(isinstance(f, log_hygiene.ClientFaultFilter) for f in uvicorn_error.filters) == 1
    uvicorn_error.setLevel(logging.INFO)
    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        _raise_decode_error(uvicorn_error, "Invalid UTF-8 sequence received from client.")
        _raise_decode_error(uvicorn_error, "Exception in ASGI application")  # a server fault stays as is
    fault, server = caplog.records
    assert (fault.levelno, fault.exc_info) == (logging.INFO, None)
    assert "Traceback" not in caplog.text.split("Exception in ASGI application")[0]
    assert server.levelno == logging.ERROR and server.exc_info is not None


def test_client_fault_is_dropped_above_info(
    uvicorn_error: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    uvicorn_error.setLevel(logging.WARNING)
    with caplog.at_level(logging.WARNING, logger="uvicorn.error"):
        _raise_decode_error(uvicorn_error, "Invalid UTF-8 sequence received from client.")
    assert caplog.records == []


def test_keys_are_redacted_wherever_they_appear(caplog: pytest.LogCaptureFixture) -> None:
    access = logging.getLogger("uvicorn.access")
    filters = list(access.filters)
    log_hygiene.install()
    try:
        with caplog.at_level(logging.INFO, logger="uvicorn.access"):
            args = ("127.0.0.1:5", "GET", "/v1/models?api_key=sk-1&model=x;token=t-2", "1.1", 200)
            access.info('%s - "%s %s HTTP/%s" %d', *args)
            access.info("subprotocols %s", "realtime, openai-insecure-api-key.sk-3")
            access.info("Authorization: Bearer sk-4 and Api-Key sk-5")
    finally:
        access.filters = filters
    text = caplog.text
    assert "api_key=[redacted]&model=x;token=[redacted]" in text
    assert "openai-insecure-api-key.[redacted]" in text and "Bearer [redacted]" in text
    assert not any(secret in text for secret in ("sk-1", "t-2", "sk-3", "sk-4", "sk-5"))
    assert log_hygiene.redact("/v1/realtime?monkey=banana&model=m") == "/v1/realtime?monkey=banana&model=m"
