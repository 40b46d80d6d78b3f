"""Celery control jobs of the API: the hourly purge of expired stored responses."""

from __future__ import annotations

from celery import shared_task

from inference.responses_store import responses_purge as _responses_purge


@shared_task
def responses_purge() -> int:
    """Delete stored responses (the Responses API's) past their expiry."""
    return _responses_purge()
