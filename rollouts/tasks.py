"""Celery control jobs of rollouts: the periodic canary analysis."""

from __future__ import annotations

from celery import shared_task

from rollouts.services import rollouts_analyze as _rollouts_analyze
from rollouts.services import rollouts_fail_fast as _rollouts_fail_fast


@shared_task
def rollouts_analyze() -> dict[int, str]:
    """Analyse every running rollout: hold, advance, promote or roll back."""
    return _rollouts_analyze()


@shared_task
def rollouts_fail_fast() -> list[int]:
    """Roll back at once the running rollouts whose canary fails outright."""
    return _rollouts_fail_fast()
