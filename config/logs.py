"""How a process applies the LOGGING setting (Django's LOGGING_CONFIG).

uvicorn configures its loggers before it imports the application; Django configures logging
when the application is imported, and its LOGGING routes uvicorn's loggers through the
redacting handler. uvicorn's `--no-access-log` works by leaving its access logger without a
handler, and its protocol logs a request line whenever that logger has one: a handler added
afterwards would switch the access log back on, whatever the command line said. So the
access logger keeps uvicorn's choice: it is configured here only where uvicorn left it on
(or where no uvicorn runs at all).
"""

from __future__ import annotations

import logging
import logging.config
from typing import Any

ACCESS_LOGGER = "uvicorn.access"


def access_log_switched_off() -> bool:
    """Whether uvicorn was told not to log requests (`--no-access-log`) in this process.

    uvicorn's own configuration gives its access logger a handler and stops it propagating;
    `--no-access-log` then takes the handler away. A logger no uvicorn configured propagates.
    """
    existing = logging.root.manager.loggerDict.get(ACCESS_LOGGER)
    if not isinstance(existing, logging.Logger):
        return False
    return not existing.handlers and not existing.propagate


def logging_configure(config: dict[str, Any]) -> None:
    """Apply `config` as dictConfig does, leaving uvicorn's access log off if it was."""
    if access_log_switched_off():
        loggers = {k: v for k, v in config.get("loggers", {}).items() if k != ACCESS_LOGGER}
        config = {**config, "loggers": loggers}
    logging.config.dictConfig(config)
