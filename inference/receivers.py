"""What the API's processes do when a tenant is deleted (tenants.signals.tenant_deleted)."""

from __future__ import annotations

import logging
from typing import Any

from dataplane.redis_client import redis_sync_client
from dataplane.tenancy import tenant_keys_forget
from inference.response_cache import tenant_answers_forget
from tenants.models import Tenant
from tenants.signals import tenant_deleted

log = logging.getLogger(__name__)


def _answers_forget(*, tenant_id: int, slug: str, **_: Any) -> None:
    try:
        tenant_answers_forget(redis_sync_client(), tenant_id=tenant_id)
    except Exception:
        # Unreachable Redis: the answers still expire with the tenant's cache time.
        log.warning("could not drop the response cache of %s", slug, exc_info=True)


def receivers_connect() -> None:
    """Connect the data plane's and the response cache's receivers (InferenceConfig.ready).

    dataplane imports no app, so its receiver takes plain values and is connected here.
    """
    tenant_deleted.connect(tenant_keys_forget, sender=Tenant, dispatch_uid="dataplane.keys_forget")
    tenant_deleted.connect(
        _answers_forget, sender=Tenant, dispatch_uid="inference.response_cache_forget"
    )
