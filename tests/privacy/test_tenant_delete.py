"""Deleting a tenant: its text, people and keys go; what finance needs stays."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from batches.models import Batch, File, FileChunk
from batches.services import file_create
from billing.invoices import adjustment_add, invoice_build, invoice_issue, invoices_build
from billing.models import Adjustment, Invoice, UsageRecord
from dataplane.redis_client import redis_sync_client
from inference.base.errors import ApiError
from inference.pipeline.auth import principal_of_key
from privacy.models import RetainedContent
from privacy.services import content_retain
from tenants.keys import token_hash
from tenants.models import ApiKey, AuditEvent, Membership, Tenant
from tenants.services import (
    SCRUBBED_SECRET_HASH,
    api_key_issue,
    membership_add,
    tenant_create,
    tenant_delete,
    tenant_privacy_update,
)
from tests.privacy.conftest import OCTOBER, usage_add

pytestmark = pytest.mark.django_db


@pytest.fixture
def initrode(world):
    """A tenant with a member, retained text, a batch, a billed key and an unbilled key."""
    tenant = tenant_create(slug="initrode", name="Initrode")
    tenant_privacy_update(tenant=tenant, retention_days=30)
    membership_add(tenant=tenant, username="ivan", role="admin")
    membership_add(tenant=tenant, username="bob", role="member")
    billed = api_key_issue(tenant=tenant, name="production")
    unbilled = api_key_issue(tenant=tenant, name="ci")
    usage_add(world, tenant=tenant, api_key_id=billed.key.pk)
    usage_add(world, tenant=tenant, api_key_id=billed.key.pk)
    content_retain(
        tenant_id=tenant.pk,
        request_id="initrode-req-1",
        prompt="quarterly numbers",
        completion="they are fine",
        retention_days=30,
    )
    upload = file_create(tenant_id=tenant.pk, filename="in.jsonl", purpose="batch", content=b"{}")
    Batch.objects.create(
        tenant=tenant,
        api_key=unbilled.key,
        endpoint="/v1/chat/completions",
        input_file=upload,
        completion_window="24h",
        expires_at=dt.datetime(2026, 10, 4, tzinfo=dt.UTC),
    )
    adjustment_add(tenant=tenant, amount=Decimal("-1.00"), reason="goodwill")
    invoice = invoice_issue(invoice=invoice_build(tenant=tenant, month=OCTOBER))
    return tenant, billed, unbilled, invoice


def test_it_removes_content_members_and_unused_keys_and_keeps_the_bills(initrode, world):
    tenant, billed, unbilled, invoice = initrode
    usage = set(UsageRecord.objects.filter(tenant=tenant).values_list("pk", "cost"))
    summary = tenant_delete(tenant=tenant, actor=world.alice)
    assert (summary.retained_texts_deleted, summary.memberships_deleted) == (1, 2)
    assert (summary.batches_deleted, summary.files_deleted) == (1, 1)
    assert (summary.keys_deleted, summary.keys_scrubbed) == (1, 1)
    assert not RetainedContent.objects.filter(tenant=tenant).exists()
    assert not Membership.objects.filter(tenant=tenant).exists()
    assert Membership.objects.filter(tenant=world.acme, user=world.bob).exists()
    assert not Batch.objects.filter(tenant=tenant).exists()
    assert not File.objects.filter(tenant=tenant).exists()
    assert not FileChunk.objects.filter(file__tenant=tenant).exists()  # counted as no files
    assert not ApiKey.objects.filter(pk=unbilled.key.pk).exists()
    tenant.refresh_from_db()
    assert tenant.is_active is False and tenant.deleted_at is not None
    # Finance still has every record, unchanged, and the invoice still names the key.
    assert set(UsageRecord.objects.filter(tenant=tenant).values_list("pk", "cost")) == usage
    assert Invoice.objects.get(pk=invoice.pk).total == invoice.total == Decimal("3.00")
    assert Adjustment.objects.filter(tenant=tenant).count() == 1
    assert UsageRecord.objects.filter(api_key__public_id=billed.key.public_id).count() == 2


def test_a_key_with_usage_is_revoked_and_scrubbed(initrode):
    tenant, billed, _, _ = initrode
    tenant_delete(tenant=tenant)
    key = ApiKey.objects.get(pk=billed.key.pk)
    assert key.public_id == billed.key.public_id
    assert key.revoked_at is not None and key.status == "revoked"
    assert key.name == "deleted key" and key.scopes == [] and key.created_by is None
    assert key.secret_hash == SCRUBBED_SECRET_HASH != token_hash(billed.token)


def test_a_deleted_tenants_keys_authenticate_no_more(initrode):
    tenant, billed, unbilled, _ = initrode
    assert principal_of_key(billed.key.public_id).tenant_slug == "initrode"
    tenant_delete(tenant=tenant)
    for key in (billed, unbilled):
        with pytest.raises(ApiError) as refused:
            principal_of_key(key.key.public_id)
        assert refused.value.status == 401


def test_it_publishes_every_key_after_commit(
    initrode, monkeypatch, django_capture_on_commit_callbacks
):
    tenant, billed, unbilled, _ = initrode
    published: list[str] = []
    monkeypatch.setattr(
        "dataplane.tenancy.key_revocation_publish", lambda *, public_id: published.append(public_id)
    )
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        tenant_delete(tenant=tenant)
        assert published == []
    for callback in callbacks:
        callback()
    assert sorted(published) == sorted([billed.key.public_id, unbilled.key.public_id])


def test_the_deletion_is_audited(initrode, world):
    tenant, billed, unbilled, _ = initrode
    tenant_delete(tenant=tenant, actor=world.alice)
    event = AuditEvent.objects.filter(action="tenant.delete").latest("id")
    assert event.target_id == "initrode" and event.actor == world.alice
    assert event.after is not None
    assert event.after["keys_scrubbed"] == [billed.key.public_id]
    assert event.after["keys_deleted"] == [unbilled.key.public_id]


def test_deleting_twice_is_a_clear_error(initrode):
    tenant, *_ = initrode
    tenant_delete(tenant=tenant)
    with pytest.raises(ValidationError, match="was deleted on"):
        tenant_delete(tenant=tenant)
    with pytest.raises(CommandError, match="was deleted on"):
        call_command("tenant_delete", "initrode", "--yes")


def test_a_deleted_tenants_privacy_settings_cannot_change(initrode):
    tenant, *_ = initrode
    tenant_delete(tenant=tenant)
    with pytest.raises(ValidationError):
        tenant_privacy_update(tenant=tenant, retention_days=1)


def test_the_command_refuses_without_yes_and_prints_the_summary(initrode, capsys):
    tenant, *_ = initrode
    with pytest.raises(CommandError, match="--yes"):
        call_command("tenant_delete", "initrode")
    tenant.refresh_from_db()
    assert tenant.deleted_at is None
    call_command("tenant_delete", "initrode", "--yes")
    out = capsys.readouterr().out
    assert "deleted tenant initrode" in out and "1 keys with usage revoked and scrubbed" in out
    with pytest.raises(CommandError, match="no tenant"):
        call_command("tenant_delete", "nobody", "--yes")


def test_a_tenant_deleted_during_a_month_gets_its_last_invoice(world):
    tenant = tenant_create(slug="vandelay")
    key = api_key_issue(tenant=tenant, name="prod")
    usage_add(world, tenant=tenant, api_key_id=key.key.pk)
    tenant_delete(tenant=tenant)
    built = {invoice.tenant.slug: invoice for invoice in invoices_build(month=OCTOBER)}
    # Deleted after October began, before its invoice run: October is its last invoice.
    assert built["vandelay"].total == Decimal("2.00")


def test_a_tenant_deleted_before_a_month_gets_no_invoice_for_it(world):
    tenant = tenant_create(slug="kramerica")
    tenant_delete(tenant=tenant)
    Tenant.objects.filter(pk=tenant.pk).update(deleted_at=dt.datetime(2026, 9, 30, tzinfo=dt.UTC))
    assert "kramerica" not in {i.tenant.slug for i in invoices_build(month=OCTOBER)}


def test_its_cached_answers_go_and_other_tenants_stay(
    initrode, world, django_capture_on_commit_callbacks
):
    tenant = initrode[0]
    client = redis_sync_client()
    ours = [f"sy:{{t{tenant.pk}}}:rc:{n}" for n in range(3)]
    theirs = f"sy:{{t{world.acme.pk}}}:rc:kept"
    for key in [*ours, theirs]:
        client.set(key, b"x", ex=60)
    with django_capture_on_commit_callbacks(execute=True):
        tenant_delete(tenant=tenant)
    assert client.exists(*ours) == 0
    assert client.exists(theirs) == 1
    client.delete(theirs)
