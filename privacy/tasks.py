"""Celery control jobs of the privacy app: the hourly purge of expired text."""

from __future__ import annotations

from celery import shared_task

from privacy.services import content_purge as _content_purge


@shared_task
def content_purge() -> int:
    """Delete retained text past its tenant's retention period."""
    return _content_purge()
