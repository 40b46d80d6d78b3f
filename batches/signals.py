"""Resume the batch runners as soon as a Celery worker is up (e.g. after a crash)."""

from __future__ import annotations

from typing import Any

from celery.signals import worker_ready


@worker_ready.connect
def _resume_batches(**_: Any) -> None:
    from batches.tasks import batches_resume

    batches_resume.delay()
