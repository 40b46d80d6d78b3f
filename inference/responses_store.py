"""Stored responses: write, read, chain and delete, always within one tenant.

Every function takes the tenant; another tenant's id reads as absent (a 404 to the caller).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from inference.conversations_store import TURN_STATUSES, conversation_turn_add
from inference.kept import kept_for
from inference.models import StoredResponse
from privacy.crypto import content_open, content_seal

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
    bound before any engine work (inference.kept), and its end is what the tenant paid for.
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
