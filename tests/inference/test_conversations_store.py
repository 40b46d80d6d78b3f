"""Conversations: sealed, tenant-scoped, in order, expired, and deleted with the tenant."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from inference.conversations_store import (
    MAX_ITEMS,
    conversation_create,
    conversation_get,
    conversation_items,
    conversation_items_add,
    conversation_items_page,
    conversation_turn_add,
    conversations_purge,
)
from inference.models import Conversation, ConversationItem
from inference.tasks import responses_purge as purge_task
from tenants.services import tenant_create, tenant_delete, tenant_privacy_update

pytestmark = pytest.mark.django_db


def _message(item_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "user",
        "status": "completed",
        "content": [{"type": "input_text", "text": text}],
    }


def _texts(items: list[dict[str, Any]]) -> list[str]:
    return [item["content"][0]["text"] for item in items]


def test_the_text_is_sealed_and_read_back_only_by_its_tenant(world):
    tenant, other = tenant_create(slug="conv-own"), tenant_create(slug="conv-other")
    created = conversation_create(
        tenant_id=tenant.pk,
        items=[_message("m1", "secret words")],
        metadata={"project": "hidden name"},
        retention_days=0,
    )
    row = Conversation.objects.get(pk=created["id"])
    assert b"hidden" not in bytes(row.sealed)
    assert all(
        b"secret" not in bytes(i.sealed) for i in ConversationItem.objects.filter(conversation=row)
    )
    assert conversation_get(tenant_id=tenant.pk, conversation_id=created["id"]) == created
    assert conversation_get(tenant_id=other.pk, conversation_id=created["id"]) is None
    assert conversation_items(tenant_id=other.pk, conversation_id=created["id"]) is None
    assert _texts(conversation_items(tenant_id=tenant.pk, conversation_id=created["id"]) or []) == [
        "secret words"
    ]
    # It lives 30 days after its last change when the tenant keeps no text otherwise.
    assert row.expires_at - row.updated_at == dt.timedelta(days=30)


def test_items_page_in_either_order_and_a_turn_renames_an_id_it_repeats(world):
    tenant = tenant_create(slug="conv-pages")
    conversation = conversation_create(
        tenant_id=tenant.pk, items=[_message("a", "one")], metadata={}, retention_days=0
    )["id"]
    added = conversation_items_add(
        tenant_id=tenant.pk,
        conversation_id=conversation,
        items=[_message("b", "two"), _message("c", "three")],
        retention_days=0,
    )
    assert isinstance(added, list)
    again = conversation_items_add(
        tenant_id=tenant.pk,
        conversation_id=conversation,
        items=[_message("b", "x")],
        retention_days=0,
    )
    assert again == "b"  # an id the conversation holds: nothing added
    page = conversation_items_page(
        tenant_id=tenant.pk, conversation_id=conversation, limit=2, order="desc", after=None
    )
    assert not isinstance(page, str) and _texts(page[0]) == ["three", "two"] and page[1]
    rest = conversation_items_page(
        tenant_id=tenant.pk, conversation_id=conversation, limit=2, order="desc", after="b"
    )
    assert not isinstance(rest, str) and _texts(rest[0]) == ["one"] and not rest[1]
    assert conversation_turn_add(
        tenant_id=tenant.pk,
        conversation_id=conversation,
        items=[_message("a", "four"), {**_message("out", "five"), "role": "assistant"}],
    )
    items = conversation_items(tenant_id=tenant.pk, conversation_id=conversation) or []
    assert _texts(items) == ["one", "two", "three", "four", "five"]
    assert items[3]["id"].startswith("a_") and len({i["id"] for i in items}) == 5


def test_a_conversation_holds_at_most_max_items(world, monkeypatch):
    monkeypatch.setattr("inference.conversations_store.MAX_ITEMS", 3)
    tenant = tenant_create(slug="conv-full")
    conversation = conversation_create(
        tenant_id=tenant.pk,
        items=[_message("a", "1"), _message("b", "2")],
        metadata={},
        retention_days=0,
    )["id"]
    two = [_message("c", "3"), _message("d", "4")]
    assert (
        conversation_items_add(
            tenant_id=tenant.pk, conversation_id=conversation, items=two, retention_days=0
        )
        == "full"
    )
    assert MAX_ITEMS > 3  # the platform's own bound is larger than the test's


def test_expired_conversations_are_hidden_then_purged_and_a_shorter_retention_applies(world):
    tenant = tenant_create(slug="conv-purge")
    tenant_privacy_update(tenant=tenant, retention_days=30)
    old = conversation_create(tenant_id=tenant.pk, items=[], metadata={}, retention_days=30)["id"]
    fresh = conversation_create(tenant_id=tenant.pk, items=[], metadata={}, retention_days=30)["id"]
    Conversation.objects.filter(pk=old).update(updated_at=timezone.now() - dt.timedelta(days=10))
    tenant_privacy_update(tenant=tenant, retention_days=7)
    assert conversation_get(tenant_id=tenant.pk, conversation_id=old) is None
    assert conversation_get(tenant_id=tenant.pk, conversation_id=fresh) is not None
    assert conversations_purge() == 1
    assert purge_task() == 0


def test_deleting_the_tenant_deletes_its_conversations(world):
    tenant = tenant_create(slug="conv-gone")
    conversation_create(
        tenant_id=tenant.pk, items=[_message("a", "x")], metadata={}, retention_days=0
    )
    summary = tenant_delete(tenant=tenant)
    assert not Conversation.objects.filter(tenant=tenant).exists()
    assert not ConversationItem.objects.filter(conversation__tenant=tenant).exists()
    assert summary.retained_texts_deleted == 1
