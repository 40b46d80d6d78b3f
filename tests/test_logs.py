"""A frontend logs its requests only when uvicorn is told to (config.logs)."""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from config.logs import ACCESS_LOGGER, access_log_switched_off, logging_configure
from tests.conftest import _free_port, _http_ok, _spawn, _wait_for


@pytest.fixture
def access_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger(ACCESS_LOGGER)
    handlers, propagate, level = logger.handlers[:], logger.propagate, logger.level
    yield logger
    logger.handlers, logger.propagate = handlers, propagate
    logger.setLevel(level)


def _config(handler: str) -> dict[str, object]:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {handler: {"class": "logging.NullHandler"}},
        "loggers": {ACCESS_LOGGER: {"handlers": [handler], "propagate": False}},
    }


def test_a_switched_off_access_log_stays_off(access_logger: logging.Logger) -> None:
    # What uvicorn's --no-access-log leaves behind.
    access_logger.handlers = []
    access_logger.propagate = False
    assert access_log_switched_off()
    logging_configure(_config("null"))
    assert not access_logger.hasHandlers()


def test_an_access_log_that_is_on_goes_through_the_configured_handler(
    access_logger: logging.Logger,
) -> None:
    # uvicorn's own configuration: a handler, not propagating.
    access_logger.handlers = [logging.NullHandler()]
    access_logger.propagate = False
    assert not access_log_switched_off()
    logging_configure(_config("ours"))
    assert [h.name for h in access_logger.handlers] == ["ours"]


def test_a_frontend_run_with_no_access_log_logs_no_request_lines(
    django_db_setup: None, tmp_path: Path
) -> None:
    port = _free_port()
    command = ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
               "--port", str(port), "--no-access-log"]  # fmt: skip
    frontend = _spawn(
        "frontend-quiet",
        command,
        tmp_path,
        env_extra={"ROUNDHOUSE_LOG_FORMAT": "plain"},
    )
    try:
        _wait_for(frontend, lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"), timeout=120)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 401
        frontend.popen.send_signal(signal.SIGTERM)
        frontend.popen.wait(timeout=30)
        log = frontend.log.read_text(errors="replace")
    finally:
        if frontend.popen.poll() is None:
            frontend.popen.kill()
            frontend.popen.wait()
    assert "Application startup complete" in log, log  # uvicorn's own lines still come
    assert "GET /healthz" not in log, log
    assert "GET /v1/models" not in log, log
