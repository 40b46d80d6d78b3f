from __future__ import annotations

import datetime as dt
import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.db.models import ProtectedError
from django.db.utils import ProgrammingError

from tenants.audit import audit_event_hash, audit_verify
from tenants.models import AuditEvent
from tenants.services import audit_record

pytestmark = pytest.mark.django_db

TABLE = AuditEvent._meta.db_table
ROW_TRIGGER = "tenants_auditevent_no_update_delete"


def _verify() -> tuple[str, str]:
    """Run `manage.py audit_verify`; return its stdout, or raise with its stderr attached."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("audit_verify", stdout=out, stderr=err)
    except CommandError as exc:
        exc.add_note(err.getvalue())
        raise
    return out.getvalue(), err.getvalue()


def _broken() -> list[str]:
    """Run `manage.py audit_verify` on a chain expected to be broken; return its problem lines."""
    err = io.StringIO()
    with pytest.raises(CommandError, match="audit chain broken"):
        call_command("audit_verify", stdout=io.StringIO(), stderr=err)
    return err.getvalue().splitlines()


@contextmanager
def _trigger_disabled() -> Iterator[Any]:
    """Tamper the way someone who owns the table could; undone with the test's transaction."""
    with connection.cursor() as cursor:
        # ALTER TABLE refuses while the deferred foreign-key checks of new events are pending.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(f"ALTER TABLE {TABLE} DISABLE TRIGGER {ROW_TRIGGER}")
        yield cursor
        cursor.execute(f"ALTER TABLE {TABLE} ENABLE TRIGGER {ROW_TRIGGER}")


def _three_events(world: Any) -> list[AuditEvent]:
    return [
        audit_record(
            action="test.event",
            target_type="tenant",
            target_id="acme",
            tenant=world.acme,
            actor=world.alice,
            data={"n": n},
        )
        for n in range(3)
    ]


def test_the_chain_verifies_after_events_are_recorded(world):
    _three_events(world)
    audit_record(action="test.bare", target_type="thing", target_id="1")
    out, err = _verify()
    assert out.strip() == f"audit chain intact: {AuditEvent.objects.count()} events"
    assert err == ""


def test_a_gap_in_ids_is_not_a_problem(world):
    first = audit_record(action="test.event", target_type="thing", target_id="1")
    with pytest.raises(RuntimeError), transaction.atomic():
        audit_record(action="test.event", target_type="thing", target_id="rolled back")
        raise RuntimeError
    last = audit_record(action="test.event", target_type="thing", target_id="2")
    assert last.pk > first.pk + 1
    assert audit_verify() == []


def test_the_database_refuses_an_update(world):
    event = _three_events(world)[1]
    with (
        pytest.raises(ProgrammingError, match="audit events are append-only"),
        transaction.atomic(),
    ):
        AuditEvent.objects.filter(pk=event.pk).update(data={"n": 99})
    assert AuditEvent.objects.get(pk=event.pk).data == {"n": 1}


def test_the_database_refuses_a_delete(world):
    event = _three_events(world)[1]
    with (
        pytest.raises(ProgrammingError, match="append-only: DELETE of event"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(f"DELETE FROM {TABLE} WHERE id = %s", [event.pk])
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_the_database_refuses_a_truncate(world):
    with (
        pytest.raises(ProgrammingError, match="append-only: TRUNCATE"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(f"TRUNCATE {TABLE}")
    assert AuditEvent.objects.exists()


def test_an_edited_event_fails_verification_naming_it(world):
    event = _three_events(world)[1]
    with _trigger_disabled():
        AuditEvent.objects.filter(pk=event.pk).update(data={"n": 99})
    assert _broken() == [f"event {event.pk}: hash does not match its content: edited"]


def test_an_edited_event_with_a_recomputed_hash_breaks_its_successors_link(world):
    _, second, third = _three_events(world)
    second.data = {"n": 99}
    with _trigger_disabled():
        AuditEvent.objects.filter(pk=second.pk).update(
            data=second.data, hash=audit_event_hash(second)
        )
    [problem] = _broken()
    assert problem.startswith(f"event {third.pk}: prev_hash does not match event {second.pk}")


def test_a_deleted_event_fails_verification_at_its_successor(world):
    first, second, third = _three_events(world)
    with _trigger_disabled() as cursor:
        cursor.execute(f"DELETE FROM {TABLE} WHERE id = %s", [second.pk])
    [problem] = _broken()
    assert problem.startswith(f"event {third.pk}: prev_hash does not match event {first.pk}")
    assert "deleted" in problem


def test_reason_before_and_after_are_stored(world):
    event = audit_record(
        action="quota.update",
        target_type="tenant",
        target_id="acme",
        tenant=world.acme,
        actor=world.alice,
        reason="customer upgraded to the team plan",
        before={"requests_per_minute": 60, "models": ("a", "b")},
        after={"requests_per_minute": 600, "models": ["a"]},
    )
    stored = AuditEvent.objects.get(pk=event.pk)
    assert stored.reason == "customer upgraded to the team plan"
    assert stored.before == {"requests_per_minute": 60, "models": ["a", "b"]}
    assert stored.after == {"requests_per_minute": 600, "models": ["a"]}
    assert stored.created_at == event.created_at
    assert stored.hash == event.hash == audit_event_hash(stored)


@pytest.mark.parametrize("number", [1e20, 1e16, 1.0, -0.0, 0.1, 1.5e-7, 2**70])
def test_numbers_verify_after_their_round_trip_through_jsonb(world, number):
    audit_record(action="test.event", target_type="thing", target_id="1", data={"n": number})
    assert audit_verify() == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("reason", "no reason"),
        ("before", {"requests_per_minute": 6000}),
        ("after", None),
        ("created_at", dt.datetime(2020, 1, 1, tzinfo=dt.UTC)),
        ("target_id", "globex"),
        ("actor", None),
    ],
)
def test_the_hash_covers_every_stored_field(world, field, value):
    event = audit_record(
        action="quota.update",
        target_type="tenant",
        target_id="acme",
        tenant=world.acme,
        actor=world.alice,
        reason="customer upgraded",
        before={"requests_per_minute": 60},
        after={"requests_per_minute": 600},
    )
    with _trigger_disabled():
        AuditEvent.objects.filter(pk=event.pk).update(**{field: value})
    assert [str(problem) for problem in audit_verify()] == [
        f"event {event.pk}: hash does not match its content: edited"
    ]


def test_an_actor_with_audit_events_cannot_be_deleted(world):
    audit_record(action="test.event", target_type="thing", target_id="1", actor=world.bob)
    with pytest.raises(ProtectedError), transaction.atomic():
        world.bob.delete()


def test_concurrent_appends_keep_a_single_chain(world):
    # Committed from other connections, like requests in separate workers; the chain stays valid.
    writers, each = 6, 10
    start = threading.Barrier(writers)

    def append(writer: int) -> None:
        try:
            start.wait()
            for n in range(each):
                audit_record(
                    action="test.concurrent", target_type="thing", target_id=f"{writer}-{n}"
                )
        finally:
            connection.close()

    threads = [threading.Thread(target=append, args=(writer,)) for writer in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert AuditEvent.objects.filter(action="test.concurrent").count() == writers * each
    assert audit_verify() == []
