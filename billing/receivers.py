"""billing's part when a tenant is deleted (tenants.signals): the keys its records name stay."""

from __future__ import annotations

from typing import Any

from billing.models import UsageRecord
from tenants.models import Tenant
from tenants.signals import TenantDeletion, tenant_deleting


def _tenant_deleting(*, deletion: TenantDeletion, **_: Any) -> None:
    # Invoices resolve usage records' keys by public id: those keys are scrubbed, not deleted.
    deletion.keys_kept |= set(
        UsageRecord.objects.filter(api_key__in=deletion.keys)
        .values_list("api_key_id", flat=True)
        .distinct()
    )


def receivers_connect() -> None:
    """Connect billing's receivers (BillingConfig.ready)."""
    tenant_deleting.connect(_tenant_deleting, sender=Tenant, dispatch_uid="billing.tenant_deleting")
