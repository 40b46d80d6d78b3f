"""What a client asks the platform to keep, a stored response or a conversation: how long it
lives, and how much of it a tenant may keep.

It lives for the tenant's retention period when it sets one, else OpenAI's 30 days. A
tenant's stored responses and conversations (their items included) hold together at most
ROUNDHOUSE_TENANT_STORED_BYTES of PostgreSQL, which keeps them for every tenant: one tenant's
writes cannot fill it for the others.
"""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import transaction
from django.db.models import Sum

from inference.errors import ApiError
from inference.models import Conversation, ConversationItem, StoredResponse
from tenants.models import Tenant

DEFAULT_DAYS = 30


def kept_for(retention_days: int) -> dt.timedelta:
    """The lifetime of a kept object of a tenant with this retention period (0: none set)."""
    return dt.timedelta(days=retention_days if retention_days > 0 else DEFAULT_DAYS)


def kept_bytes(*, tenant_id: int) -> int:
    """The bytes a tenant's stored responses and conversations hold, expired ones not yet
    purged included (they take their room until the hourly purge)."""
    total = 0
    for rows in (
        StoredResponse.objects.filter(tenant_id=tenant_id),
        Conversation.objects.filter(tenant_id=tenant_id),
        ConversationItem.objects.filter(conversation__tenant_id=tenant_id),
    ):
        total += rows.aggregate(total=Sum("size"))["total"] or 0
    return total


def kept_room_check(*, tenant_id: int, size: int, param: str | None) -> None:
    """Refuse a write of `size` bytes that would take what the tenant keeps past its bound.

    Holds the tenant's row to the end of the caller's transaction (one of its own when there
    is none), so two writes at once cannot both find the same room: the caller writes in the
    same transaction. `param` names the field the 400 points at.
    """
    with transaction.atomic():
        if not Tenant.objects.select_for_update().filter(pk=tenant_id).exists():
            raise ApiError(401, "invalid_api_key", "The key's tenant no longer exists.")
        limit = settings.ROUNDHOUSE_TENANT_STORED_BYTES
        used = kept_bytes(tenant_id=tenant_id)
        if used + size > limit:
            raise ApiError(
                400,
                "storage_limit_exceeded",
                f"The tenant's stored responses and conversations hold {used} bytes and this "
                f"would add {size}; together they may hold {limit}. Delete stored responses "
                "(DELETE /v1/responses/{response_id}) or conversations (DELETE "
                "/v1/conversations/{conversation_id}) to make room, or let them expire.",
                param=param,
            )
