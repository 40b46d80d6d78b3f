"""Celery control jobs for workers and deployments."""

from __future__ import annotations

from celery import shared_task

from workers.services import deployments_reconcile as _deployments_reconcile


@shared_task
def deployments_reconcile() -> int:
    """Align deployment states with the workers that are actually alive."""
    return _deployments_reconcile()
