"""Stored responses: sealed, tenant-scoped, chained, expired and deleted with the tenant."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from inference.models import StoredResponse
from inference.responses.store import (
    response_chain,
    response_delete,
    response_get,
    response_save,
    responses_purge,
)
from inference.tasks import responses_purge as responses_purge_task
from tenants.services import tenant_create, tenant_delete, tenant_privacy_update

pytestmark = pytest.mark.django_db


def _save(tenant, *, previous: str = "", days: int = 0, created: float | None = None) -> str:
    rid = uuid.uuid4().hex
    body: dict[str, Any] = {
        "id": f"resp_{rid}",
        "created_at": int(created or time.time()),
        "status": "completed",
        "previous_response_id": previous or None,
        "output": [{"type": "message", "content": [{"text": "secret answer"}]}],
    }
    items = [{"type": "message", "id": "i", "role": "user", "content": [{"text": "secret"}]}]
    assert response_save(
        tenant_id=tenant.pk, request_id=rid, body=body, input_items=items, retention_days=days
    )
    return body["id"]


def test_the_text_is_sealed_and_read_back_only_by_its_tenant(world):
    tenant, other = tenant_create(slug="resp-own"), tenant_create(slug="resp-other")
    response_id = _save(tenant)
    row = StoredResponse.objects.get(pk=response_id)
    assert b"secret" not in bytes(row.sealed)
    kept = response_get(tenant_id=tenant.pk, response_id=response_id)
    assert kept is not None and kept.input_items[0]["content"][0]["text"] == "secret"
    assert response_get(tenant_id=other.pk, response_id=response_id) is None
    assert not response_delete(tenant_id=other.pk, response_id=response_id)
    assert response_get(tenant_id=tenant.pk, response_id=response_id) is not None


def test_a_chain_is_read_oldest_first_and_a_gap_breaks_it(world):
    tenant = tenant_create(slug="resp-chain")
    first = _save(tenant)
    second = _save(tenant, previous=first)
    third = _save(tenant, previous=second)
    chain = response_chain(tenant_id=tenant.pk, response_id=third)
    assert chain is not None and [k.id for k in chain] == [first, second, third]
    assert response_delete(tenant_id=tenant.pk, response_id=first)
    assert response_chain(tenant_id=tenant.pk, response_id=third) is None


def test_a_chain_is_read_in_one_query_and_one_too_long_is_refused(
    world, monkeypatch, django_assert_num_queries
):
    tenant = tenant_create(slug="resp-long-chain")
    ids = [_save(tenant)]
    for _ in range(4):
        ids.append(_save(tenant, previous=ids[-1]))
    with django_assert_num_queries(1):
        chain = response_chain(tenant_id=tenant.pk, response_id=ids[-1])
    assert chain is not None and [k.id for k in chain] == ids
    monkeypatch.setattr("inference.responses.store.MAX_CHAIN", 4)
    assert response_chain(tenant_id=tenant.pk, response_id=ids[-1]) is None
    assert response_chain(tenant_id=tenant.pk, response_id=ids[-2]) is not None
    other = tenant_create(slug="resp-long-chain-other")
    assert response_chain(tenant_id=other.pk, response_id=ids[-1]) is None


def test_lifetime_follows_the_tenants_retention_else_thirty_days(world):
    tenant = tenant_create(slug="resp-life")
    default = _save(tenant, days=0)
    week = _save(tenant, days=7)
    rows = {r.id: r for r in StoredResponse.objects.filter(tenant=tenant)}
    assert rows[default].expires_at - rows[default].created_at == dt.timedelta(days=30)
    assert rows[week].expires_at - rows[week].created_at == dt.timedelta(days=7)


def test_expired_responses_are_hidden_then_purged_every_hour(world):
    tenant = tenant_create(slug="resp-purge")
    old = _save(tenant, days=1, created=time.time() - 2 * 86400)
    fresh = _save(tenant, days=1)
    assert response_get(tenant_id=tenant.pk, response_id=old) is None
    assert responses_purge() == 1
    assert response_get(tenant_id=tenant.pk, response_id=fresh) is not None
    assert responses_purge_task() == 0
    entry = settings.CELERY_BEAT_SCHEDULE["inference-responses-purge"]
    assert entry["task"] == responses_purge_task.name


def test_a_shorter_retention_applies_to_responses_already_kept(world):
    tenant = tenant_create(slug="resp-shorter")
    tenant_privacy_update(tenant=tenant, retention_days=30)
    older = _save(tenant, days=30, created=time.time() - 10 * 86400)
    recent = _save(tenant, days=30)
    tenant_privacy_update(tenant=tenant, retention_days=7)
    assert response_get(tenant_id=tenant.pk, response_id=older) is None
    assert response_get(tenant_id=tenant.pk, response_id=recent) is not None
    assert responses_purge(now=timezone.now()) == 1


def test_deleting_the_tenant_deletes_its_responses(world):
    tenant = tenant_create(slug="resp-gone")
    _save(tenant)
    summary = tenant_delete(tenant=tenant)
    assert not StoredResponse.objects.filter(tenant=tenant).exists()
    assert summary.retained_texts_deleted == 1


def test_a_background_responses_end_keeps_its_new_size(world):
    from inference.responses.store import response_finish

    tenant = tenant_create(slug="resp-sized")
    rid = uuid.uuid4().hex
    body: dict[str, Any] = {"id": f"resp_{rid}", "created_at": int(time.time()), "status": "queued"}
    assert response_save(
        tenant_id=tenant.pk, request_id=rid, body=body, input_items=[], retention_days=0
    )
    queued = StoredResponse.objects.get(pk=body["id"]).size
    ended = {**body, "status": "completed", "output": [{"text": "x" * 2000}]}
    assert response_finish(tenant_id=tenant.pk, response_id=body["id"], body=ended, last_sequence=3)
    row = StoredResponse.objects.get(pk=body["id"])
    assert row.size == len(bytes(row.sealed)) > queued + 2000
