"""Celery control jobs of billing: the monthly invoice run."""

from __future__ import annotations

import datetime as dt

from celery import shared_task
from django.utils import timezone

from billing.invoices import invoices_build


@shared_task
def invoices_build_last_month() -> int:
    """Build every active tenant's draft invoice for the month that just ended (UTC)."""
    last_month = timezone.now().date().replace(day=1) - dt.timedelta(days=1)
    return len(invoices_build(month=last_month))
