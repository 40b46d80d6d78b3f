"""Start embedded PostgreSQL and Valkey on free ports before Django is set up for the tests.

Loaded with `-p tests.services_plugin`. Set ROUNDHOUSE_TEST_EXTERNAL=1 to use the servers named
by DATABASE_URL and REDIS_URL instead (their data is changed by the tests).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from embedded.servers import ServiceConfig, services_start, services_stop

_config: ServiceConfig | None = None
_root: Path | None = None


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: Any, parser: Any, args: Any) -> Generator[None]:
    global _config, _root
    if os.environ.get("ROUNDHOUSE_TEST_EXTERNAL") != "1":
        _root = Path(tempfile.mkdtemp(prefix="roundhouse-test-"))
        _config = ServiceConfig(data_dir=_root / "services", pg_port=0, redis_port=0, fast=True)
        endpoints = services_start(_config)
        os.environ["DATABASE_URL"] = endpoints.database_url
        os.environ["REDIS_URL"] = endpoints.redis_url
        os.environ["ROUNDHOUSE_DATA_DIR"] = str(_root)
        os.environ["ROUNDHOUSE_ARTIFACT_ROOT"] = str(_root / "artifacts")
    return (yield)


def pytest_unconfigure(config: Any) -> None:
    if _config is not None:
        services_stop(_config)
    if _root is not None:
        shutil.rmtree(_root, ignore_errors=True)
