"""Celery control jobs of billing: the monthly invoice run."""

from __future__ import annotations

import datetime as dt

from celery import shared_task
from django.utils import timezone

from billing.budgets import budget_alerts_check as _budget_alerts_check
from billing.invoices import invoices_build


@shared_task
def invoices_build_last_month() -> int:
    """Build every active tenant's draft invoice for the month that just ended (UTC)."""
    last_month = timezone.now().date().replace(day=1) - dt.timedelta(days=1)
    return len(invoices_build(month=last_month))


@shared_task
def budget_alerts_check() -> int:
    """Send the 50 / 80 / 100 % budget alerts tenants have crossed since the last run."""
    return len(_budget_alerts_check())
