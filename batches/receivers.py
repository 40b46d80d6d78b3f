"""batches' part when a tenant is deleted (tenants.signals): its batches and files go."""

from __future__ import annotations

from typing import Any

from batches.models import Batch, File
from tenants.models import Tenant
from tenants.signals import TenantDeletion, tenant_deleting


def _tenant_deleting(*, deletion: TenantDeletion, **_: Any) -> None:
    # Batches first: they hold their key (PROTECT), which tenant_delete deletes after every
    # receiver has run.
    by_model = Batch.objects.filter(tenant=deletion.tenant).delete()[1]
    deletion.batches_deleted = by_model.get(Batch._meta.label, 0)
    # Counted by model: the total would count each file's chunks too.
    by_model = File.objects.filter(tenant=deletion.tenant).delete()[1]
    deletion.files_deleted = by_model.get(File._meta.label, 0)


def receivers_connect() -> None:
    """Connect batches' receivers (BatchesConfig.ready)."""
    tenant_deleting.connect(_tenant_deleting, sender=Tenant, dispatch_uid="batches.tenant_deleting")
