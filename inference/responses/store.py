"""What the Responses and Conversations APIs keep in PostgreSQL: stored responses (write, read,
chain, delete) and conversations with their items, always within one tenant.

Every function takes the tenant; another tenant's id reads as absent (a 404 to the caller).
What a client asks to keep, a stored response or a conversation, lives for the tenant's
retention period when it sets one, else OpenAI's 30 days (a conversation after its last
change, a response after its creation). A tenant's stored responses and conversations (their
items included) hold together at most ROUNDHOUSE_TENANT_STORED_BYTES of PostgreSQL, which
keeps them for every tenant: one tenant's writes cannot fill it for the others.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import F, Sum
from django.utils import timezone

from inference.base.errors import ApiError
from inference.models import Conversation, ConversationItem, StoredResponse
from privacy.crypto import content_open, content_seal
from tenants.models import Tenant

log = logging.getLogger(__name__)

# What an id this API made looks like; any other is absent without a query (a NUL byte, say,
# which PostgreSQL cannot even compare).
RESPONSE_ID = re.compile(r"^resp_[0-9a-f]{32}$")
# The longest chain of previous responses a turn may rebuild (OpenAI sets no number; this
# bounds the reads of one request).
MAX_CHAIN = 256


@dataclass(frozen=True)
class Kept:
    """A stored response opened: its object as the API returned it, and its input items."""

    id: str
    previous_id: str
    body: dict[str, Any]
    input_items: list[dict[str, Any]]
    request_id: str = ""
    requested_model: str = ""  # the model as the client named it (an alias, say)
    # The sequence number of a background response's last event (-1: not ended, or not
    # background): a stream resumed after its reply stream expired starts after it.
    last_sequence: int = -1

    @property
    def finished(self) -> bool:
        return self.body["status"] in TERMINAL_STATUSES


TERMINAL_STATUSES = ("completed", "incomplete", "failed", "cancelled")


def response_opened(row: StoredResponse) -> Kept:
    """A stored response's row opened (its sealed text read)."""
    sealed = json.loads(content_open(bytes(row.sealed)))
    return Kept(
        id=row.id,
        previous_id=row.previous_id,
        body=sealed["response"],
        input_items=sealed["input_items"],
        request_id=row.request_id,
        requested_model=sealed.get("requested_model", ""),
        last_sequence=sealed.get("last_sequence", -1),
    )


def _sealed(
    body: dict[str, Any],
    input_items: list[dict[str, Any]],
    *,
    requested_model: str,
    last_sequence: int = -1,
) -> bytes:
    return content_seal(
        json.dumps(
            {
                "response": body,
                "input_items": input_items,
                "requested_model": requested_model,
                "last_sequence": last_sequence,
            }
        ).encode()
    )


def response_save(
    *,
    tenant_id: int,
    request_id: str,
    body: dict[str, Any],
    input_items: list[dict[str, Any]],
    retention_days: int,
    requested_model: str = "",
) -> bool:
    """Keep a response and its input items; False when its id is kept already (a replay).

    A background response is kept as it is accepted (queued) and ended by response_finish.
    It is kept whole past the tenant's storage bound: its create was checked against the
    bound before any engine work (the create's room check), and its end is what the tenant
    paid for.
    """
    created = dt.datetime.fromtimestamp(body["created_at"], tz=dt.UTC)
    sealed = _sealed(body, input_items, requested_model=requested_model)
    try:
        with transaction.atomic():
            StoredResponse.objects.create(
                id=body["id"],
                tenant_id=tenant_id,
                request_id=request_id,
                previous_id=body.get("previous_response_id") or "",
                status=body["status"],
                created_at=created,
                expires_at=created + kept_for(retention_days),
                sealed=sealed,
                size=len(sealed),
            )
    except IntegrityError:
        return False
    return True


def response_get(*, tenant_id: int, response_id: str) -> Kept | None:
    """The tenant's stored response, or None (unknown, deleted, or another tenant's)."""
    if not RESPONSE_ID.fullmatch(response_id):
        return None
    row = StoredResponse.objects.filter(
        tenant_id=tenant_id, id=response_id, expires_at__gt=timezone.now()
    ).first()
    return None if row is None else response_opened(row)


def response_finish(
    *, tenant_id: int, response_id: str, body: dict[str, Any], last_sequence: int
) -> bool:
    """Write a background response's end; False when it has ended already (or is gone).

    Any frontend may try at once (the one that accepted it, a poll, the sweep): the row is
    locked and only an unfinished one is written, so its end is written once.
    """
    with transaction.atomic():
        row = (
            StoredResponse.objects.select_for_update()
            .filter(tenant_id=tenant_id, id=response_id)
            .exclude(status__in=TERMINAL_STATUSES)
            .first()
        )
        if row is None:
            return False
        kept = response_opened(row)
        row.status = body["status"]
        row.sealed = _sealed(
            body,
            kept.input_items,
            requested_model=kept.requested_model,
            last_sequence=last_sequence,
        )
        row.size = len(row.sealed)
        row.save(update_fields=["status", "sealed", "size"])
        conversation = body.get("conversation")
        if conversation and body["status"] in TURN_STATUSES:
            try:
                with transaction.atomic():  # its own savepoint: it cannot undo the end
                    conversation_turn_add(
                        tenant_id=tenant_id,
                        conversation_id=conversation["id"],
                        items=[*kept.input_items, *body["output"]],
                    )
            except DatabaseError:
                log.exception("could not add response %s to its conversation", response_id)
    return True


def responses_unfinished(*, older_than: float) -> list[tuple[int, Kept]]:
    """Background responses not ended in the store, accepted more than `older_than` seconds
    ago (the accepting frontend normally ends them first), with their tenants."""
    cutoff = timezone.now() - dt.timedelta(seconds=older_than)
    rows = (
        StoredResponse.objects.exclude(status__in=TERMINAL_STATUSES)
        .filter(created_at__lt=cutoff, expires_at__gt=timezone.now())
        .order_by("created_at")
    )
    return [(row.tenant_id, response_opened(row)) for row in rows[:500]]


def response_chain(*, tenant_id: int, response_id: str) -> list[Kept] | None:
    """A response and every response before it, oldest first; None when one is missing.

    A turn rebuilt from a chain with a gap would silently drop part of the conversation, so a
    missing link (deleted, expired, another tenant's, or never stored) fails the whole chain,
    and so does a chain longer than MAX_CHAIN. One query: PostgreSQL follows the links.
    """
    if not RESPONSE_ID.fullmatch(response_id):
        return None
    table = StoredResponse._meta.db_table
    now = timezone.now()
    # Each step reads the row its last row names; a missing link ends the walk early, which
    # the check below finds. One row past MAX_CHAIN is read, to tell a chain that is too long.
    query = f"""
        WITH RECURSIVE chain AS (
            SELECT r.*, 1 AS depth FROM {table} r
            WHERE r.tenant_id = %s AND r.id = %s AND r.expires_at > %s
          UNION ALL
            SELECT p.*, c.depth + 1 FROM {table} p JOIN chain c ON p.id = c.previous_id
            WHERE p.tenant_id = %s AND p.expires_at > %s AND c.depth <= %s
        )
        SELECT * FROM chain ORDER BY depth
    """  # nosec B608: the table name is the model's own; every value is a parameter
    rows = list(
        StoredResponse.objects.raw(query, [tenant_id, response_id, now, tenant_id, now, MAX_CHAIN])
    )
    if not rows or len(rows) > MAX_CHAIN or rows[-1].previous_id:
        return None  # none, too long, or the oldest one read names one that is not there
    return [response_opened(row) for row in reversed(rows)]


def response_delete(*, tenant_id: int, response_id: str) -> bool:
    """Delete the tenant's stored response; False when it has none by that id."""
    if not RESPONSE_ID.fullmatch(response_id):
        return False
    deleted, _ = StoredResponse.objects.filter(
        tenant_id=tenant_id, id=response_id, expires_at__gt=timezone.now()
    ).delete()
    return deleted > 0


def responses_purge(*, now: dt.datetime | None = None) -> int:
    """Delete every stored response past its expiry; return how many."""
    expired = StoredResponse.objects.filter(expires_at__lte=now or timezone.now())
    deleted, _ = expired.delete()
    return deleted


def responses_delete(*, tenant_id: int) -> int:
    """Delete every stored response of a tenant (a tenant deletion); return how many."""
    deleted, _ = StoredResponse.objects.filter(tenant_id=tenant_id).delete()
    return deleted


def responses_expiry_shorten(*, tenant_id: int, retention_days: int) -> int:
    """Bring a tenant's stored responses within a shorter retention period."""
    from django.db.models import F

    limit = kept_for(retention_days)
    return StoredResponse.objects.filter(
        tenant_id=tenant_id, expires_at__gt=F("created_at") + limit
    ).update(expires_at=F("created_at") + limit)


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
