"""Keep, shorten and delete the prompt and completion text tenants asked us to retain.

Nothing here logs the text, and it is only ever stored sealed (privacy.crypto).
"""

from __future__ import annotations

import datetime as dt
import json
import logging

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from privacy.crypto import content_seal
from privacy.models import RetainedContent
from tenants.models import Tenant

log = logging.getLogger(__name__)

# Advisory lock keys: this + the tenant id. content_retain holds it shared, content_delete
# exclusively, so no text is written for a tenant while (or after) its content is deleted.
_TENANT_CONTENT_LOCK = 0x5359_5052_0000_0000


def _tenant_content_lock(tenant_id: int, *, exclusive: bool) -> None:
    function = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}(%s)", [_TENANT_CONTENT_LOCK + tenant_id])


def content_retain(
    *,
    tenant_id: int,
    request_id: str,
    prompt: str,
    completion: str,
    retention_days: int,
    now: dt.datetime | None = None,
) -> bool:
    """Store a request's text encrypted for the tenant's retention period; return if it did.

    Stores nothing when retention is off (0 days) or the tenant is deleted or unknown, and
    nothing new for a request id already stored (a replay). The caller passes the tenant's
    retention_days it already holds, so a tenant with retention off costs no query.
    """
    if retention_days <= 0:
        return False
    now = now or timezone.now()
    sealed = content_seal(json.dumps({"prompt": prompt, "completion": completion}).encode())
    with transaction.atomic():
        # Taken before reading deleted_at: a tenant_delete in progress is waited for and seen.
        _tenant_content_lock(tenant_id, exclusive=False)
        if not Tenant.objects.filter(pk=tenant_id, deleted_at__isnull=True).exists():
            return False
        _, created = RetainedContent.objects.get_or_create(
            request_id=request_id,
            defaults={
                "tenant_id": tenant_id,
                "created_at": now,
                "expires_at": now + dt.timedelta(days=retention_days),
                "ciphertext": sealed,
            },
        )
    return created


def content_expiry_shorten(*, tenant: Tenant, retention_days: int) -> int:
    """Bring the expiry of a tenant's stored text within a new, shorter retention period.

    Returns how many rows now expire sooner; text past the new period is hidden at once and
    deleted by the next purge.
    """
    limit = F("created_at") + dt.timedelta(days=retention_days)
    return RetainedContent.objects.filter(tenant=tenant, expires_at__gt=limit).update(
        expires_at=limit
    )


def content_purge(*, now: dt.datetime | None = None) -> int:
    """Delete every tenant's text whose retention period has ended; return how many rows."""
    now = now or timezone.now()
    deleted, _ = RetainedContent.objects.filter(expires_at__lte=now).delete()
    if deleted:
        log.info("purged %d expired retained texts", deleted)
    return deleted


def content_delete(*, tenant: Tenant) -> int:
    """Delete all of a tenant's retained text; return how many rows.

    Call it in the transaction that marks the tenant deleted: it holds the tenant's content
    lock until commit, so a content_retain racing with it stores nothing.
    """
    with transaction.atomic():
        _tenant_content_lock(tenant.pk, exclusive=True)
        deleted, _ = RetainedContent.objects.filter(tenant=tenant).delete()
    return deleted
