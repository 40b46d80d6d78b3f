"""Read-only queries over usage; every one takes the tenant explicitly."""

from __future__ import annotations

import math
from decimal import Decimal

from django.db.models import Sum
from django.utils import timezone

from billing.models import UsageRecord


def tenant_month_spend_micros(*, tenant_id: int) -> int:
    """Return what a tenant's usage records cost this calendar month (UTC), in micros."""
    now = timezone.now()
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    total = UsageRecord.objects.filter(tenant_id=tenant_id, finished_at__gte=month_start).aggregate(
        total=Sum("cost")
    )["total"]
    return math.ceil((total or Decimal(0)) * 1_000_000)
