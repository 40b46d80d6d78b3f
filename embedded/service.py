"""What the embedded PostgreSQL and Valkey servers share: a service's configuration, the data
dir's layout, and the checks on its process, port and log.

This module must not import Django: a pytest plugin uses it before Django is configured.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0


class ServiceError(RuntimeError):
    """An embedded service could not be started, stopped or inspected."""


@dataclass(frozen=True)
class ServiceConfig:
    """Where the services keep their data and which loopback ports they use."""

    data_dir: Path
    pg_port: int = 54329  # 0 = pick a free loopback port
    redis_port: int = 63799  # 0 = pick a free loopback port
    host: str = "127.0.0.1"
    fast: bool = False  # tests: trade durability for speed


@dataclass(frozen=True)
class Layout:
    """Filesystem layout under one data dir."""

    root: Path

    @property
    def pgdata(self) -> Path:
        return self.root / "postgres"

    @property
    def pg_log(self) -> Path:
        return self.root / "postgres.log"

    @property
    def pg_pidfile(self) -> Path:
        return self.pgdata / "postmaster.pid"

    @property
    def valkey_dir(self) -> Path:
        return self.root / "valkey"

    @property
    def valkey_log(self) -> Path:
        return self.valkey_dir / "valkey.log"

    @property
    def valkey_pidfile(self) -> Path:
        return self.valkey_dir / "valkey.pid"

    @property
    def state(self) -> Path:
        return self.root / "services.json"

    @property
    def lock(self) -> Path:
        return self.root / ".services.lock"


def package_dir(name: str) -> Path:
    """Locate an installed package without importing it (imports have side effects)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError(f"Python package {name!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def pid_alive(pid: int, program: str) -> bool:
    """Tell whether pid is a live, non-zombie process running program."""
    if pid <= 0:  # kill(0) would signal our own process group
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, just owned by another user
    proc = Path("/proc") / str(pid)
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        comm = (proc / "comm").read_text().strip()
    except (OSError, IndexError):
        return True  # no procfs (macOS): trust kill(0)
    # Zombies linger when the container's pid 1 does not reap; a reused pid runs something else.
    return state != "Z" and comm == program[:15]


def read_pid(path: Path) -> int | None:
    """Read the pid on the first line of a pid file."""
    try:
        return int(path.read_text().split("\n", 1)[0].strip())
    except (OSError, ValueError):
        return None


def port_answers(host: str, port: int) -> bool:
    """Tell whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def port_free(host: str, port: int) -> bool:
    """Tell whether a server could bind host:port right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR too, so TIME_WAIT leftovers must not count as busy.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(service: str, host: str, requested: int) -> int:
    """Return the requested port if free, or a free one when 0 was requested."""
    if requested == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    if not port_free(host, requested):
        raise ServiceError(
            f"{service} port {requested} on {host} is already in use by another process; "
            "stop that process or choose a different port"
        )
    return requested


def wait_for(check: Callable[[], bool], timeout: float) -> bool:
    """Poll check until it returns True or timeout seconds pass."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def log_tail(path: Path, lines: int = 20) -> str:
    """Return the last lines of a log file for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
