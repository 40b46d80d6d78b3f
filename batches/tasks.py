"""Celery jobs that drive batches: one time-boxed step per task, then the next step."""

from __future__ import annotations

import asyncio
import logging

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from batches import services
from batches.models import Batch, BatchStatus
from batches.runner import batch_step, batch_step_failed

log = logging.getLogger(__name__)
# Steps of a batch that may fail in a row before it ends failed: a step that fails that often
# fails for the batch itself, not for a passing fault.
STEP_ATTEMPTS = 5
# A database or Redis that cannot be reached fails every batch alike: the step waits for it.
_OUTAGES = (OperationalError, InterfaceError, RedisConnectionError, RedisTimeoutError)


@shared_task(name="batches.tasks.batch_run", ignore_result=True)
def batch_run(batch_id: str, retry_if_busy: bool = True, failures: int = 0) -> str:
    """Run one step of a batch and queue the next, until the batch has ended.

    Steps are short, so a Celery worker's warm shutdown waits seconds, not hours. If another
    runner holds the batch's lease, look once more after the lease could have lapsed: a
    runner that died leaves a lease that expires, and this task then takes the batch over.
    `failures` counts the steps before this one that failed in a row.
    """
    try:
        ended = asyncio.run(batch_step(batch_id))
    except Exception as exc:
        failures += 0 if isinstance(exc, _OUTAGES) else 1
        log.exception("batch %s: step failed (%d in a row)", batch_id, failures)
        give_up = failures >= STEP_ATTEMPTS
        try:
            if asyncio.run(batch_step_failed(batch_id, give_up=give_up)):
                return "ended"
        except Exception:
            log.exception("batch %s: could not end it after a failed step", batch_id)
            if give_up:
                # No chain of retries that never ends: the periodic resume looks at it again.
                return "abandoned"
        # Tried again after the lease could have lapsed; its lines are safe meanwhile.
        batch_run.apply_async(
            (batch_id,),
            {"failures": failures},
            countdown=settings.ROUNDHOUSE_BATCH_LEASE_SECONDS + 1,
        )
        return "retrying"
    if ended is None:
        if retry_if_busy:
            batch_run.apply_async(
                (batch_id,),
                {"retry_if_busy": False},
                countdown=settings.ROUNDHOUSE_BATCH_LEASE_SECONDS + 1,
            )
        return "busy"
    if not ended:
        batch_run.delay(batch_id)
        return "continuing"
    return "ended"


@shared_task(name="batches.tasks.batches_resume", ignore_result=True)
def batches_resume() -> int:
    """Queue a step for every unfinished batch (after a Celery worker starts, and periodically).

    A batch whose runner is alive is left to it; one whose runner died is taken over.
    """
    unfinished = Batch.objects.filter(
        status__in=[BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING]
    ).values_list("pk", flat=True)
    count = 0
    for batch_id in unfinished:
        batch_run.delay(batch_id)
        count += 1
    if count:
        log.info("resuming %d unfinished batches", count)
    return count


@shared_task(name="batches.tasks.files_purge", ignore_result=True)
def files_purge() -> int:
    """Delete the files past their expiry, but those a running batch still reads (hourly)."""
    deleted = services.files_purge()
    if deleted:
        log.info("deleted %d expired files", deleted)
    return deleted
