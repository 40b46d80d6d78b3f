"""Celery's queues: periodic control jobs and batch steps never share one."""

from __future__ import annotations

import pytest
from django.conf import settings

from config.celery import app


def _queue(task: str) -> str:
    """The queue Celery sends a task to, by name, as beat and `delay()` do."""
    return str(app.amqp.router.route({}, task)["queue"].name)


@pytest.mark.parametrize("entry", sorted(settings.CELERY_BEAT_SCHEDULE))
def test_every_periodic_job_goes_to_the_control_queue(entry):
    """Finding 5 of the hardening review: rollout fail-fast, purges and sweeps waited in one
    queue behind every tenant's batch steps."""
    assert _queue(settings.CELERY_BEAT_SCHEDULE[entry]["task"]) == "control"


def test_batch_turns_go_to_the_batches_queue_and_nothing_else_does():
    from batches.tasks import batches_turn

    assert _queue(batches_turn.name) == "batches"
    app.loader.import_default_modules()
    others = {name for name in app.tasks if not name.startswith("celery.")} - {batches_turn.name}
    assert others, "no task was found"
    assert {name: _queue(name) for name in others} == dict.fromkeys(others, "control")
