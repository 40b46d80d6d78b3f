"""Celery jobs that drive batches: the batch runners' turns, resuming them, purging files."""

from __future__ import annotations

import logging

from celery import shared_task

from batches import scheduler, services

log = logging.getLogger(__name__)


@shared_task(name="batches.tasks.batches_turn", ignore_result=True)
def batches_turn(slot: int, ticket: str) -> str:
    """Take one turn of a batch runner: one step of the batch served next, then the next turn.

    Steps are short, so a Celery worker's warm shutdown waits seconds, not hours
    (batches.scheduler says which batch a turn takes).
    """
    return scheduler.turn_take(slot=slot, ticket=ticket)


@shared_task(name="batches.tasks.batches_resume", ignore_result=True)
def batches_resume() -> int:
    """Give the batch runners new turns (after a Celery worker starts, and every minute).

    A runner whose turn was lost with a worker that died goes on; one whose turn is queued
    or under way is not doubled, and a batch whose step's runner died is taken over once
    its lease lapses.
    """
    count = scheduler.runners_resume()
    if count:
        log.info("resumed %d batch runners", count)
    return count


@shared_task(name="batches.tasks.files_purge", ignore_result=True)
def files_purge() -> int:
    """Delete the files past their expiry, but those a running batch still reads (hourly)."""
    deleted = services.files_purge()
    if deleted:
        log.info("deleted %d expired files", deleted)
    return deleted
