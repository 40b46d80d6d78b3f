"""privacy's part when a tenant is deleted or keeps its text for less time (tenants.signals)."""

from __future__ import annotations

from typing import Any

from privacy.services import content_delete, content_expiry_shorten
from tenants.models import Tenant
from tenants.signals import TenantDeletion, retention_shortened, tenant_deleting


def _tenant_deleting(*, deletion: TenantDeletion, **_: Any) -> None:
    # Holds the tenant's content lock until commit: a content_retain racing with it stores nothing.
    deletion.retained_texts_deleted = content_delete(tenant=deletion.tenant)


def _retention_shortened(*, tenant: Tenant, retention_days: int, **_: Any) -> None:
    content_expiry_shorten(tenant=tenant, retention_days=retention_days)


def receivers_connect() -> None:
    """Connect privacy's receivers (PrivacyConfig.ready)."""
    tenant_deleting.connect(_tenant_deleting, sender=Tenant, dispatch_uid="privacy.tenant_deleting")
    retention_shortened.connect(
        _retention_shortened, sender=Tenant, dispatch_uid="privacy.retention_shortened"
    )
