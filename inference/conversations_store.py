"""Conversations (OpenAI's Conversations API): create, read, change and delete them and their
items, always within one tenant.

Every function takes the tenant; another tenant's id reads as absent (a 404 to the caller).
A conversation lives for the tenant's retention period (else 30 days) after its last change,
as a stored response lives after its creation.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from inference.kept import kept_for, kept_room_check
from inference.models import Conversation, ConversationItem
from privacy.crypto import content_open, content_seal
from tenants.models import Tenant

CONVERSATION_ID = re.compile(r"^conv_[0-9a-f]{32}$")
# What an item's id may be: one a path can name (no slash), that PostgreSQL can compare (no
# NUL) and its column holds. An id the API made matches; a client's may not be anything else.
ITEM_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
# The items a conversation may hold (OpenAI sets no number): a response reads all of them, so
# this bounds what one request reads and renders. A response's own turn is always added.
MAX_ITEMS = 4096


def conversation_id_new() -> str:
    return f"conv_{secrets.token_hex(16)}"


def _seal(value: Any) -> bytes:
    return content_seal(json.dumps(value).encode())


def _open(sealed: Any) -> Any:
    return json.loads(content_open(bytes(sealed)))


def _object(row: Conversation) -> dict[str, Any]:
    """A conversation as the API returns it."""
    return {
        "id": row.id,
        "object": "conversation",
        "created_at": int(row.created_at.timestamp()),
        "metadata": _open(row.sealed)["metadata"],
    }


def _live(tenant_id: int, conversation_id: str) -> Any:
    """The tenant's conversation rows by id, not expired (none for an id this API never made:
    a NUL byte, say, which PostgreSQL cannot even compare)."""
    if not CONVERSATION_ID.fullmatch(conversation_id):
        return Conversation.objects.none()
    return Conversation.objects.filter(
        tenant_id=tenant_id, id=conversation_id, expires_at__gt=timezone.now()
    )


def _tenant_hold(tenant_id: int) -> None:
    """Hold the tenant's row to the transaction's end (kept_room_check holds it too)."""
    Tenant.objects.select_for_update().filter(pk=tenant_id).exists()


def _touched(row: Conversation, retention_days: int) -> None:
    row.updated_at = timezone.now()
    row.expires_at = row.updated_at + kept_for(retention_days)


def _sealed_items(items: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    """Each item's id and sealed text, as it is kept."""
    return [(item["id"], _seal(item)) for item in items]


def _append(row: Conversation, sealed: list[tuple[str, bytes]]) -> None:
    """Add sealed items after the conversation's last one (its row locked by the caller)."""
    ConversationItem.objects.bulk_create(
        ConversationItem(
            conversation=row,
            position=row.next_position + offset,
            item_id=item_id,
            sealed=text,
            size=len(text),
        )
        for offset, (item_id, text) in enumerate(sealed)
    )
    row.next_position += len(sealed)


def _room_check(tenant_id: int, sealed: list[bytes], param: str | None) -> None:
    kept_room_check(tenant_id=tenant_id, size=sum(len(s) for s in sealed), param=param)


def conversation_create(
    *, tenant_id: int, items: list[dict[str, Any]], metadata: dict[str, str], retention_days: int
) -> dict[str, Any]:
    """Start a conversation with its first items (ids unique among them).

    Refused (400 storage_limit_exceeded) where it would take the tenant past its bound.
    """
    now = timezone.now()
    meta = _seal({"metadata": metadata})
    sealed = _sealed_items(items)
    with transaction.atomic():
        _room_check(tenant_id, [meta, *(s for _, s in sealed)], "items" if items else None)
        row = Conversation.objects.create(
            id=conversation_id_new(),
            tenant_id=tenant_id,
            created_at=now,
            updated_at=now,
            expires_at=now + kept_for(retention_days),
            sealed=meta,
            size=len(meta),
        )
        _append(row, sealed)
        row.save(update_fields=["next_position"])
    return _object(row)


def conversation_get(*, tenant_id: int, conversation_id: str) -> dict[str, Any] | None:
    """The tenant's conversation, or None (unknown, deleted, expired or another tenant's)."""
    row = _live(tenant_id, conversation_id).first()
    return None if row is None else _object(row)


def conversation_update(
    *, tenant_id: int, conversation_id: str, metadata: dict[str, str], retention_days: int
) -> dict[str, Any] | None:
    """Replace a conversation's metadata; None when the tenant has no such conversation.

    Metadata that grows it past the tenant's bound is refused (400 storage_limit_exceeded).
    """
    meta = _seal({"metadata": metadata})
    if not _live(tenant_id, conversation_id).exists():
        return None
    with transaction.atomic():
        # The tenant's row first, then the conversation's, as every write that checks holds
        # them: two such writes never wait on each other's second lock.
        _tenant_hold(tenant_id)
        row = _live(tenant_id, conversation_id).select_for_update().first()
        if row is None:
            return None
        if len(meta) > row.size:
            kept_room_check(tenant_id=tenant_id, size=len(meta) - row.size, param="metadata")
        row.sealed, row.size = meta, len(meta)
        _touched(row, retention_days)
        row.save(update_fields=["sealed", "size", "updated_at", "expires_at"])
    return _object(row)


def _deleted(rows: Any) -> int:
    """Delete conversations with their items, each locked first: an add that holds one (a
    response's turn going in) finishes before its items are deleted, so none is left behind
    to fail the delete."""
    with transaction.atomic():
        ids = list(rows.select_for_update().values_list("id", flat=True))
        _, deleted = Conversation.objects.filter(id__in=ids).delete()
    return deleted.get(Conversation._meta.label, 0)


def conversation_delete(*, tenant_id: int, conversation_id: str) -> bool:
    """Delete a conversation and its items; False when the tenant has no such conversation."""
    return _deleted(_live(tenant_id, conversation_id)) > 0


def conversation_items(*, tenant_id: int, conversation_id: str) -> list[dict[str, Any]] | str:
    """Every item of the tenant's conversation, oldest first; or why not: "missing", or "full"
    when it holds more than MAX_ITEMS (a response's turns took it past)."""
    row = _live(tenant_id, conversation_id).only("id").first()
    if row is None:
        return "missing"
    # One more than the most it may hold says whether it is past it, without counting them.
    sealed = list(row.items.order_by("position").values_list("sealed", flat=True)[: MAX_ITEMS + 1])
    if len(sealed) > MAX_ITEMS:
        return "full"
    return [_open(one) for one in sealed]


def conversation_items_page(
    *, tenant_id: int, conversation_id: str, limit: int, order: str, after: str | None
) -> tuple[list[dict[str, Any]], bool] | str:
    """A page of a conversation's items in `order` (asc: oldest first), past the item
    `after`, and whether more follow; or which is missing: "conversation" or "after"."""
    row = _live(tenant_id, conversation_id).first()
    if row is None:
        return "conversation"
    items = row.items.all()
    if after is not None:
        if not ITEM_ID.fullmatch(after):
            return "after"
        position = items.filter(item_id=after).values_list("position", flat=True).first()
        if position is None:
            return "after"
        if order == "asc":
            items = items.filter(position__gt=position)
        else:
            items = items.filter(position__lt=position)
    ordered = items.order_by("position" if order == "asc" else "-position")
    sealed = list(ordered.values_list("sealed", flat=True)[: limit + 1])
    return [_open(s) for s in sealed[:limit]], len(sealed) > limit


def conversation_items_add(
    *, tenant_id: int, conversation_id: str, items: list[dict[str, Any]], retention_days: int
) -> list[dict[str, Any]] | str:
    """Add items a client sent after the conversation's last one; what was added, or why
    nothing was: "missing", "full" (past MAX_ITEMS) or an item id the conversation holds.

    Items that would take the tenant past its bound are refused (400 storage_limit_exceeded).
    """
    sealed = _sealed_items(items)
    if not _live(tenant_id, conversation_id).exists():
        return "missing"
    with transaction.atomic():
        _tenant_hold(tenant_id)
        row = _live(tenant_id, conversation_id).select_for_update().first()
        if row is None:
            return "missing"
        if row.items.count() + len(items) > MAX_ITEMS:
            return "full"
        # Only ids an item may have are looked up: any other (a NUL in it, which PostgreSQL
        # cannot compare) is renamed below whatever the conversation holds.
        wanted = [i["id"] for i in items if ITEM_ID.fullmatch(i["id"])]
        taken = set(row.items.filter(item_id__in=wanted).values_list("item_id", flat=True))
        if taken:
            return min(taken)
        _room_check(tenant_id, [s for _, s in sealed], "items")
        _append(row, sealed)
        _touched(row, retention_days)
        row.save(update_fields=["next_position", "updated_at", "expires_at"])
    return items


# A response's turn goes into its conversation when the response ends so; a failed or
# cancelled one adds nothing.
TURN_STATUSES = ("completed", "incomplete")


def conversation_turn_add(
    *, tenant_id: int, conversation_id: str, items: list[dict[str, Any]]
) -> bool:
    """Add a response's turn (its input, then its output) to the conversation it named; False
    when the conversation is gone (deleted while the response ran).

    The turn always goes in: an input item whose id the conversation holds already (a client
    sending an item it had added), or one an item's id may not be, gets a new id rather than
    failing a finished response; and it goes in past the tenant's storage bound, which its
    response was checked against when it was created. A conversation that expired meanwhile
    is not brought back.
    """
    with transaction.atomic():
        row = (
            _live(tenant_id, conversation_id)
            .select_related("tenant")
            .select_for_update(of=("self",))
            .first()
        )
        if row is None:
            return False
        # Only ids an item may have are looked up: any other (a NUL in it, which PostgreSQL
        # cannot compare) is renamed below whatever the conversation holds.
        wanted = [i["id"] for i in items if ITEM_ID.fullmatch(i["id"])]
        taken = set(row.items.filter(item_id__in=wanted).values_list("item_id", flat=True))
        fresh = []
        for item in items:
            if item["id"] in taken or not ITEM_ID.fullmatch(item["id"]):
                item = {**item, "id": f"item_{secrets.token_hex(12)}"}
            taken.add(item["id"])
            fresh.append(item)
        _append(row, _sealed_items(fresh))
        _touched(row, row.tenant.retention_days)
        row.save(update_fields=["next_position", "updated_at", "expires_at"])
    return True


def conversation_item_get(
    *, tenant_id: int, conversation_id: str, item_id: str
) -> dict[str, Any] | str:
    """One item of the tenant's conversation, or which is missing: "conversation" or "item"."""
    row = _live(tenant_id, conversation_id).first()
    if row is None:
        return "conversation"
    if not ITEM_ID.fullmatch(item_id):
        return "item"
    sealed = row.items.filter(item_id=item_id).values_list("sealed", flat=True).first()
    return "item" if sealed is None else dict(_open(sealed))


def conversation_item_delete(
    *, tenant_id: int, conversation_id: str, item_id: str, retention_days: int
) -> dict[str, Any] | str:
    """Delete one item; the conversation as it stands, or which is missing (as above)."""
    with transaction.atomic():
        row = _live(tenant_id, conversation_id).select_for_update().first()
        if row is None:
            return "conversation"
        if not ITEM_ID.fullmatch(item_id):
            return "item"
        deleted, _ = row.items.filter(item_id=item_id).delete()
        if not deleted:
            return "item"
        _touched(row, retention_days)
        row.save(update_fields=["updated_at", "expires_at"])
    return _object(row)


def conversations_purge(*, now: dt.datetime | None = None) -> int:
    """Delete every conversation past its expiry (with its items); return how many."""
    return _deleted(Conversation.objects.filter(expires_at__lte=now or timezone.now()))


def conversations_delete(*, tenant_id: int) -> int:
    """Delete every conversation of a tenant (a tenant deletion); return how many."""
    return _deleted(Conversation.objects.filter(tenant_id=tenant_id))


def conversations_expiry_shorten(*, tenant_id: int, retention_days: int) -> int:
    """Bring a tenant's conversations within a shorter retention period."""
    limit = kept_for(retention_days)
    return Conversation.objects.filter(
        tenant_id=tenant_id, expires_at__gt=F("updated_at") + limit
    ).update(expires_at=F("updated_at") + limit)
