"""`manage.py embedded {start,stop,status}`: control the embedded PostgreSQL and Valkey."""

from __future__ import annotations

import os
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from embedded.servers import (
    Endpoints,
    ServiceConfig,
    ServiceError,
    services_start,
    services_status,
    services_stop,
)

DEFAULT_DATA_DIR = ".data"
DEFAULT_PG_PORT = 54329
DEFAULT_REDIS_PORT = 63799
STATUS_COLUMNS = ("service", "running", "pid", "port", "url", "data_dir")


class Command(BaseCommand):
    """Start, stop or inspect the embedded PostgreSQL and Valkey servers."""

    help = (
        "Start, stop or show the status of the embedded PostgreSQL and Valkey servers "
        "used for local development, the demo and tests."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        """Declare the action and the data-dir/port/env-file options."""
        parser.add_argument(
            "action",
            choices=("start", "stop", "status"),
            help="start: init (first time) and start both servers, or reuse running ones; "
            "stop: stop both servers; status: show what is running.",
        )
        parser.add_argument(
            "--data-dir",
            type=Path,
            default=None,
            help="Directory holding both servers' data "
            f"(default: $ROUNDHOUSE_DATA_DIR or {DEFAULT_DATA_DIR}).",
        )
        parser.add_argument(
            "--pg-port",
            type=int,
            default=None,
            help="PostgreSQL port on 127.0.0.1, 0 picks a free one "
            f"(default: $ROUNDHOUSE_PG_PORT or {DEFAULT_PG_PORT}).",
        )
        parser.add_argument(
            "--redis-port",
            type=int,
            default=None,
            help="Valkey port on 127.0.0.1, 0 picks a free one "
            f"(default: $ROUNDHOUSE_REDIS_PORT or {DEFAULT_REDIS_PORT}).",
        )
        parser.add_argument(
            "--env-file",
            type=Path,
            default=None,
            help="With start: write DATABASE_URL=... and REDIS_URL=... into this file, "
            "replacing earlier values and keeping other lines.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the requested action, turning expected failures into CommandError."""
        config = _config_from(options)
        try:
            if options["action"] == "start":
                self._start(config, options["env_file"])
            elif options["action"] == "stop":
                services_stop(config)
                self.stdout.write(self.style.SUCCESS(f"Stopped services in {config.data_dir}"))
            else:
                self.stdout.write(_status_table(services_status(config)))
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        except OSError as exc:
            raise CommandError(f"{type(exc).__name__}: {exc}") from exc

    def _start(self, config: ServiceConfig, env_file: Path | None) -> None:
        """Start the services, print their URLs and optionally write the env file."""
        endpoints = services_start(config)
        self.stdout.write(f"DATABASE_URL={endpoints.database_url}")
        self.stdout.write(f"REDIS_URL={endpoints.redis_url}")
        if env_file is not None:
            _write_env_file(env_file, endpoints)
            self.stdout.write(self.style.SUCCESS(f"Wrote {env_file}"))


def _config_from(options: dict[str, Any]) -> ServiceConfig:
    """Combine command-line options with ROUNDHOUSE_* environment defaults."""
    data_dir = options["data_dir"] or Path(os.environ.get("ROUNDHOUSE_DATA_DIR", DEFAULT_DATA_DIR))
    pg_port = _port(options["pg_port"], "ROUNDHOUSE_PG_PORT", DEFAULT_PG_PORT, "--pg-port")
    redis_port = _port(
        options["redis_port"], "ROUNDHOUSE_REDIS_PORT", DEFAULT_REDIS_PORT, "--redis-port"
    )
    return ServiceConfig(data_dir=data_dir, pg_port=pg_port, redis_port=redis_port)


def _port(value: int | None, env_var: str, default: int, flag: str) -> int:
    """Validate a port from the command line, else the environment, else the default."""
    source = flag
    if value is None:
        raw = os.environ.get(env_var)
        source = env_var
        try:
            value = int(raw) if raw else default
        except ValueError:
            raise CommandError(f"{env_var}={raw!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise CommandError(f"{source}={value} is outside 0-65535")
    return value


def _write_env_file(path: Path, endpoints: Endpoints) -> None:
    """Set DATABASE_URL and REDIS_URL in a dotenv file, keeping its other lines."""
    values = {"DATABASE_URL": endpoints.database_url, "REDIS_URL": endpoints.redis_url}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        lines = []
    kept = [line for line in lines if line.split("=", 1)[0].strip() not in values]
    kept += [f"{key}={value}" for key, value in values.items()]
    path.write_text("\n".join(kept) + "\n")


def _status_table(status: dict[str, object]) -> str:
    """Render services_status() as an aligned text table."""
    rows = [[column.upper().replace("_", " ") for column in STATUS_COLUMNS]]
    for service, info in status.items():
        fields = info if isinstance(info, dict) else {}
        running = "yes" if fields.get("running") else "no"
        rows.append(
            [service, running] + [_cell(fields.get(column)) for column in STATUS_COLUMNS[2:]]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(STATUS_COLUMNS))]
    return "\n".join(_table_line(row, widths) for row in rows)


def _table_line(cells: list[str], widths: list[int]) -> str:
    """Pad cells to their column widths."""
    return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()


def _cell(value: object) -> str:
    """Format one table cell, showing missing values as a dash."""
    return "-" if value is None else str(value)
