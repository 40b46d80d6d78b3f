"""The processes `manage.py demo` starts: Celery's two queues each have a worker of their own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from embedded.management.commands import demo


class _Supervisor:
    """Records what the demo would start instead of starting it."""

    def __init__(self, **_: Any) -> None:
        self.started: dict[str, list[str]] = {}

    def start(self, name: str, args: list[str]) -> None:
        self.started[name] = args


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _celery_workers(*, celery: bool) -> dict[str, list[str]]:
    """The Celery workers the demo starts, by name."""
    started = demo.Command()._start(8000, celery=celery).started  # type: ignore[attr-defined]
    return {name: args for name, args in started.items() if args[1:3] == ["-m", "celery"]}


def test_control_jobs_and_batch_steps_run_on_workers_of_their_own(monkeypatch):
    """Finding 5 of the hardening review: the demo's one Celery worker (concurrency 1) ran the
    periodic control jobs behind every tenant's batch steps."""
    monkeypatch.setattr(demo, "Supervisor", _Supervisor)
    workers = _celery_workers(celery=True)
    assert set(workers) == {"control", "batches"}
    control, batches = workers["control"], workers["batches"]
    assert (_option(control, "-Q"), _option(batches, "-Q")) == ("control", "batches")
    # Beat runs once, beside the control jobs.
    assert "--beat" in control and "--beat" not in batches
    assert int(_option(batches, "--concurrency")) <= settings.ROUNDHOUSE_BATCH_RUNNERS
    assert Path(_option(control, "--schedule")).parent == Path(settings.DATA_DIR)
    assert _celery_workers(celery=False) == {}
