"""Read the text tenants asked us to retain; every query takes the tenant."""

from __future__ import annotations

import json

from django.utils import timezone

from privacy.crypto import content_open
from privacy.models import RetainedContent
from privacy.types import RetainedText
from tenants.models import Tenant


def content_get(*, tenant: Tenant, request_id: str) -> RetainedText | None:
    """Return a tenant's retained text of a request, decrypted, or None.

    None too for another tenant's request and for text past its expiry that the purge has not
    reached yet. A row no configured key opens raises InvalidToken: a dropped key is an
    operator's mistake, not missing text.
    """
    row = (
        RetainedContent.objects.filter(
            tenant=tenant, request_id=request_id, expires_at__gt=timezone.now()
        )
        .only("request_id", "created_at", "expires_at", "ciphertext")
        .first()
    )
    if row is None:
        return None
    text = json.loads(content_open(bytes(row.ciphertext)))
    return RetainedText(
        request_id=row.request_id,
        prompt=text["prompt"],
        completion=text["completion"],
        created_at=row.created_at,
        expires_at=row.expires_at,
    )
