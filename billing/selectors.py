"""Read-only queries over usage; every one takes the tenant explicitly."""

from __future__ import annotations

from django.db.models import QuerySet

from billing.models import UsageRecord
from tenants.models import Tenant


def usage_list(*, tenant: Tenant) -> QuerySet[UsageRecord]:
    """Return a tenant's usage records, newest first."""
    return UsageRecord.objects.filter(tenant=tenant).order_by("-finished_at")
