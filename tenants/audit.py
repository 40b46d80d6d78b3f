"""The audit chain: how an event is hashed, appended and verified.

Each event's hash covers its content and the hash of the event before it, so editing or
deleting a row breaks the chain at that row or at its successor. The database refuses UPDATE,
DELETE and TRUNCATE on the table; `audit_verify` finds what was done around that (by someone
who disabled the trigger or wrote the files).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.db import connection, transaction
from django.utils import timezone

from tenants.models import AuditEvent, Tenant

GENESIS_HASH = "0" * 64


def audit_payload(event: AuditEvent) -> dict[str, Any]:
    """Return the content of an event that its hash covers (everything but the hashes)."""
    return {
        "action": event.action,
        "target_type": event.target_type,
        "target_id": event.target_id,
        "tenant": event.tenant_id,
        "actor": event.actor_id,
        "data": event.data,
        "reason": event.reason,
        "before": event.before,
        "after": event.after,
        "created_at": event.created_at.astimezone(dt.UTC).isoformat(timespec="microseconds"),
    }


def audit_digest(*, prev_hash: str, payload: dict[str, Any]) -> str:
    """Return the chain hash of an event given the hash of the one before it."""
    body = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{prev_hash}|{body}".encode()).hexdigest()


def audit_event_hash(event: AuditEvent) -> str:
    """Return the hash an event should carry, given its content and its prev_hash."""
    return audit_digest(prev_hash=event.prev_hash, payload=audit_payload(event))


def _as_stored(value: Any) -> Any:
    """Return a JSON value as it reads back from jsonb, so the hash covers what is stored.

    Tuples become lists and keys text; whole floats become ints, as jsonb gives 1e+20 back as
    100000000000000000000 and -0.0 as 0.0.
    """
    return None if value is None else json.loads(json.dumps(value), parse_float=_whole_as_int)


def _whole_as_int(text: str) -> float | int:
    number = float(text)
    return int(number) if number.is_integer() else number


def audit_record(
    *,
    action: str,
    target_type: str,
    target_id: str,
    tenant: Tenant | None = None,
    actor: User | None = None,
    data: dict[str, Any] | None = None,
    reason: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append an event to the audit chain."""
    with transaction.atomic():
        # Serialise appenders (reads go on) so each event has exactly one successor and id order
        # is chain order. Locking the last row with SELECT ... FOR UPDATE is not enough: a writer
        # that waited for it still reads that row, not the one its predecessor just appended.
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {AuditEvent._meta.db_table} IN EXCLUSIVE MODE")
        prev_hash = AuditEvent.objects.order_by("-id").values_list("hash", flat=True).first()
        event = AuditEvent(
            tenant=tenant,
            actor=actor,
            action=action,
            target_type=target_type,
            target_id=target_id,
            data=_as_stored(data or {}),
            reason=reason,
            before=_as_stored(before),
            after=_as_stored(after),
            created_at=timezone.now(),
            prev_hash=prev_hash or GENESIS_HASH,
        )
        event.hash = audit_event_hash(event)
        event.save()
    return event


@dataclass(frozen=True)
class AuditProblem:
    """A place where the stored chain disagrees with itself."""

    event_id: int
    message: str

    def __str__(self) -> str:
        return f"event {self.event_id}: {self.message}"


def audit_verify() -> list[AuditProblem]:
    """Walk the chain in id order and return every event that was edited or lost its link.

    A gap in ids is not a problem by itself (a rolled-back transaction skips its id); a deleted
    event shows as its successor's prev_hash no longer naming the event before it.
    """
    problems: list[AuditProblem] = []
    prev_id: int | None = None
    prev_hash = GENESIS_HASH
    for event in AuditEvent.objects.order_by("id").iterator(chunk_size=2000):
        if event.prev_hash != prev_hash:
            before = "the start of the chain" if prev_id is None else f"event {prev_id}"
            problems.append(
                AuditProblem(
                    event.pk,
                    f"prev_hash does not match {before}: an event before it was deleted, "
                    "or it was inserted out of chain",
                )
            )
        if event.hash != audit_event_hash(event):
            problems.append(AuditProblem(event.pk, "hash does not match its content: edited"))
        prev_id, prev_hash = event.pk, event.hash
    return problems
