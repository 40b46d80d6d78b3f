"""Tests for embedded.servers: real PostgreSQL and Valkey processes, no Django."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
import redis

from embedded.servers import (
    Endpoints,
    ServiceConfig,
    ServiceError,
    services_start,
    services_status,
    services_stop,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _config(data_dir: Path) -> ServiceConfig:
    """Build a test config: free ports, durability off."""
    return ServiceConfig(data_dir=data_dir, pg_port=0, redis_port=0, fast=True)


def _port_of(url: str) -> int:
    """Return the port in a service URL."""
    port = urlsplit(url).port
    assert port is not None
    return port


def _port_open(port: int) -> bool:
    """Tell whether something listens on 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _select_one(database_url: str) -> object:
    """Run `select 1` against the database."""
    with psycopg.connect(database_url, connect_timeout=5) as conn:
        row = conn.execute("select 1").fetchone()
    assert row is not None
    return row[0]


def _ping(redis_url: str) -> bool:
    """PING Valkey through redis-py."""
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        return bool(client.ping())
    finally:
        client.close()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceConfig, Endpoints]]:
    """Start one pair of services for the read-only tests of this module."""
    config = _config(tmp_path_factory.mktemp("services") / "data")
    endpoints = services_start(config)
    yield config, endpoints
    services_stop(config)


def test_postgres_answers_select_one(running: tuple[ServiceConfig, Endpoints]) -> None:
    _, endpoints = running
    assert endpoints.database_url.endswith("/roundhouse")
    assert _select_one(endpoints.database_url) == 1


def test_valkey_answers_ping(running: tuple[ServiceConfig, Endpoints]) -> None:
    _, endpoints = running
    assert endpoints.redis_url.startswith("redis://127.0.0.1:")
    assert _ping(endpoints.redis_url)


def test_start_is_idempotent(running: tuple[ServiceConfig, Endpoints]) -> None:
    config, endpoints = running
    assert services_start(config) == endpoints


def test_status_reports_running(running: tuple[ServiceConfig, Endpoints]) -> None:
    config, endpoints = running
    status = services_status(config)
    postgres, valkey = status["postgres"], status["valkey"]
    assert isinstance(postgres, dict)
    assert isinstance(valkey, dict)
    assert postgres["running"] is True
    assert valkey["running"] is True
    assert postgres["url"] == endpoints.database_url
    assert valkey["url"] == endpoints.redis_url
    assert isinstance(postgres["pid"], int)
    assert isinstance(valkey["pid"], int)


def test_state_file_records_urls(running: tuple[ServiceConfig, Endpoints]) -> None:
    config, endpoints = running
    text = (config.data_dir / "services.json").read_text()
    assert endpoints.database_url in text
    assert endpoints.redis_url in text


def test_stop_closes_ports_and_second_stop_is_noop(tmp_path: Path) -> None:
    config = _config(tmp_path / "data")
    endpoints = services_start(config)
    ports = [_port_of(endpoints.database_url), _port_of(endpoints.redis_url)]
    assert all(_port_open(port) for port in ports)

    services_stop(config)
    assert not any(_port_open(port) for port in ports)
    status = services_status(config)
    assert all(isinstance(info, dict) and info["running"] is False for info in status.values())
    services_stop(config)  # second stop: no error


def test_restart_keeps_data(tmp_path: Path) -> None:
    config = _config(tmp_path / "data")
    first = services_start(config)
    with psycopg.connect(first.database_url, autocommit=True) as conn:
        conn.execute("create table kept (id int)")
    services_stop(config)

    second = services_start(config)
    try:
        with psycopg.connect(second.database_url) as conn:
            assert conn.execute("select count(*) from kept").fetchone() == (0,)
        assert _ping(second.redis_url)
    finally:
        services_stop(config)


def test_stop_without_start_is_noop(tmp_path: Path) -> None:
    services_stop(_config(tmp_path / "never-started"))
    status = services_status(_config(tmp_path / "never-started"))
    assert all(isinstance(info, dict) and info["running"] is False for info in status.values())


def test_services_outlive_starting_process(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    code = (
        "import sys; from pathlib import Path; "
        "from embedded.servers import ServiceConfig, services_start; "
        "e = services_start(ServiceConfig(Path(sys.argv[1]), pg_port=0, redis_port=0, fast=True)); "
        "print(e.database_url); print(e.redis_url)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code, str(data_dir)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    database_url, redis_url = result.stdout.split()
    try:
        assert _select_one(database_url) == 1
        assert _ping(redis_url)
        assert services_start(_config(data_dir)) == Endpoints(database_url, redis_url)
    finally:
        services_stop(_config(data_dir))


def test_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        busy = blocker.getsockname()[1]
        config = ServiceConfig(data_dir=tmp_path / "data", pg_port=busy, redis_port=0, fast=True)
        with pytest.raises(ServiceError, match=f"port {busy}.*already in use"):
            services_start(config)
    services_stop(config)


def test_long_data_dir_uses_short_socket_dir(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    config = _config(deep)
    try:
        endpoints = services_start(config)
        assert _select_one(endpoints.database_url) == 1
    finally:
        services_stop(config)
