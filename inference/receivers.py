"""What the API's processes do when a tenant is deleted (tenants.signals.tenant_deleted)."""

from __future__ import annotations

import logging
from typing import Any

from dataplane.redis_client import redis_sync_client
from dataplane.tenancy import tenant_keys_forget
from inference.pipeline.answer_cache import tenant_answers_forget
from inference.responses.store import (
    conversations_delete,
    conversations_expiry_shorten,
    responses_delete,
    responses_expiry_shorten,
)
from tenants.models import Tenant
from tenants.signals import TenantDeletion, retention_shortened, tenant_deleted, tenant_deleting

log = logging.getLogger(__name__)


def _answers_forget(*, tenant_id: int, slug: str, **_: Any) -> None:
    try:
        tenant_answers_forget(redis_sync_client(), tenant_id=tenant_id)
    except Exception:
        # Unreachable Redis: the answers still expire with the tenant's cache time.
        log.warning("could not drop the response cache of %s", slug, exc_info=True)


def _responses_delete(*, deletion: TenantDeletion, **_: Any) -> None:
    # Stored responses and conversations are the tenant's kept text: counted with the rest.
    deletion.retained_texts_deleted += responses_delete(tenant_id=deletion.tenant.pk)
    deletion.retained_texts_deleted += conversations_delete(tenant_id=deletion.tenant.pk)


def _responses_shorten(*, tenant: Tenant, retention_days: int, **_: Any) -> None:
    responses_expiry_shorten(tenant_id=tenant.pk, retention_days=retention_days)
    conversations_expiry_shorten(tenant_id=tenant.pk, retention_days=retention_days)


def receivers_connect() -> None:
    """Connect the data plane's and the response cache's receivers (InferenceConfig.ready).

    dataplane imports no app, so its receiver takes plain values and is connected here.
    """
    tenant_deleted.connect(tenant_keys_forget, sender=Tenant, dispatch_uid="dataplane.keys_forget")
    tenant_deleted.connect(
        _answers_forget, sender=Tenant, dispatch_uid="inference.response_cache_forget"
    )
    tenant_deleting.connect(
        _responses_delete, sender=Tenant, dispatch_uid="inference.responses_delete"
    )
    retention_shortened.connect(
        _responses_shorten, sender=Tenant, dispatch_uid="inference.responses_shorten"
    )
