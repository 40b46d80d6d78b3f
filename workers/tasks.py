"""Celery control jobs for workers and deployments."""

from __future__ import annotations

from celery import shared_task

from workers.services import deployments_mark_stale as _deployments_mark_stale


@shared_task
def deployments_mark_stale() -> int:
    """Mark deployments whose workers went silent as stopped."""
    return _deployments_mark_stale()
