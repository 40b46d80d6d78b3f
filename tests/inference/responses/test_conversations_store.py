"""Conversations: sealed, tenant-scoped, in order, expired, and deleted with the tenant."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import IntegrityError
from django.utils import timezone

from inference.models import Conversation, ConversationItem
from inference.responses.store import (
    MAX_ITEMS,
    conversation_create,
    conversation_delete,
    conversation_get,
    conversation_item_get,
    conversation_items,
    conversation_items_add,
    conversation_items_page,
    conversation_turn_add,
    conversation_update,
    conversations_purge,
)
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
    assert conversation_items(tenant_id=other.pk, conversation_id=created["id"]) == "missing"
    items = conversation_items(tenant_id=tenant.pk, conversation_id=created["id"])
    assert isinstance(items, list) and _texts(items) == ["secret words"]
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
    items = conversation_items(tenant_id=tenant.pk, conversation_id=conversation)
    assert isinstance(items, list) and _texts(items) == ["one", "two", "three", "four", "five"]
    assert items[3]["id"] != "a" and len({i["id"] for i in items}) == 5


def test_a_conversation_holds_at_most_max_items(world, monkeypatch):
    monkeypatch.setattr("inference.responses.store.MAX_ITEMS", 3)
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


def test_ids_a_path_or_postgresql_cannot_carry_read_as_absent_and_a_turn_renames_them(world):
    tenant = tenant_create(slug="conv-ids")
    conversation = conversation_create(
        tenant_id=tenant.pk, items=[_message("a", "one")], metadata={}, retention_days=0
    )["id"]
    for bad in ("\x00", "a/b", "x" * 65):
        assert (
            conversation_item_get(tenant_id=tenant.pk, conversation_id=conversation, item_id=bad)
            == "item"
        )
        assert (
            conversation_items_page(
                tenant_id=tenant.pk, conversation_id=conversation, limit=5, order="asc", after=bad
            )
            == "after"
        )
    turn = [_message("x" * 65, "two"), _message("d", "three"), _message("d", "four"),
            _message("a\x00", "five")]  # fmt: skip
    assert conversation_turn_add(tenant_id=tenant.pk, conversation_id=conversation, items=turn)
    items = conversation_items(tenant_id=tenant.pk, conversation_id=conversation)
    assert isinstance(items, list) and _texts(items) == ["one", "two", "three", "four", "five"]
    assert len({i["id"] for i in items}) == 5 and all(len(i["id"]) <= 64 for i in items)


def test_an_expired_conversation_takes_no_turn_and_one_past_max_items_no_response(
    world, monkeypatch
):
    tenant = tenant_create(slug="conv-ends")
    expired = conversation_create(tenant_id=tenant.pk, items=[], metadata={}, retention_days=0)[
        "id"
    ]
    Conversation.objects.filter(pk=expired).update(expires_at=timezone.now())
    assert not conversation_turn_add(
        tenant_id=tenant.pk, conversation_id=expired, items=[_message("a", "late")]
    )
    assert conversation_get(tenant_id=tenant.pk, conversation_id=expired) is None
    monkeypatch.setattr("inference.responses.store.MAX_ITEMS", 2)
    full = conversation_create(tenant_id=tenant.pk, items=[], metadata={}, retention_days=0)["id"]
    turn = [_message("a", "1"), _message("b", "2"), _message("c", "3")]
    assert conversation_turn_add(tenant_id=tenant.pk, conversation_id=full, items=turn)
    assert conversation_items(tenant_id=tenant.pk, conversation_id=full) == "full"


def test_a_background_responses_end_is_kept_when_its_turn_cannot_go_in(world, monkeypatch):
    from inference.responses.store import response_finish, response_get, response_save

    tenant = tenant_create(slug="conv-finish")
    conversation = conversation_create(
        tenant_id=tenant.pk, items=[], metadata={}, retention_days=0
    )["id"]
    body: dict[str, Any] = {
        "id": "resp_" + "4" * 32,
        "created_at": int(timezone.now().timestamp()),
        "status": "queued",
        "output": [],
        "conversation": {"id": conversation},
    }
    response_save(
        tenant_id=tenant.pk,
        request_id="4" * 32,
        body=body,
        input_items=[_message("in", "hello")],
        retention_days=0,
    )

    def broken(**_: Any) -> bool:
        raise IntegrityError("the turn could not be written")

    monkeypatch.setattr("inference.responses.store.conversation_turn_add", broken)
    ended = {**body, "status": "completed"}
    assert response_finish(tenant_id=tenant.pk, response_id=body["id"], body=ended, last_sequence=3)
    kept = response_get(tenant_id=tenant.pk, response_id=body["id"])
    assert kept is not None and kept.body["status"] == "completed"


def test_a_tenants_conversations_and_stored_responses_share_one_storage_bound(world, settings):
    from inference.base.errors import ApiError
    from inference.models import StoredResponse
    from inference.responses.store import kept_bytes, kept_room_check, response_save

    tenant, other = tenant_create(slug="conv-bound"), tenant_create(slug="conv-bound-other")
    conversation = conversation_create(
        tenant_id=tenant.pk, items=[_message("a", "x" * 500)], metadata={}, retention_days=0
    )["id"]
    row = Conversation.objects.get(pk=conversation)
    item = ConversationItem.objects.get(conversation=row)
    # Each row keeps the bytes it holds: its sealed text.
    assert (row.size, item.size) == (len(bytes(row.sealed)), len(bytes(item.sealed)))
    body: dict[str, Any] = {"id": "resp_" + "5" * 32, "created_at": 1, "status": "completed"}
    assert response_save(
        tenant_id=tenant.pk, request_id="5" * 32, body=body, input_items=[], retention_days=0
    )
    stored = StoredResponse.objects.get(pk=body["id"])
    assert stored.size == len(bytes(stored.sealed))
    held = kept_bytes(tenant_id=tenant.pk)
    assert held == row.size + item.size + stored.size
    settings.ROUNDHOUSE_TENANT_STORED_BYTES = held + 100
    with pytest.raises(ApiError) as refused:
        conversation_items_add(
            tenant_id=tenant.pk,
            conversation_id=conversation,
            items=[_message("b", "y" * 500)],
            retention_days=0,
        )
    error = refused.value
    assert (error.status, error.code, error.param) == (400, "storage_limit_exceeded", "items")
    assert f"hold {held} bytes" in error.message
    with pytest.raises(ApiError):
        conversation_create(
            tenant_id=tenant.pk, items=[_message("b", "y" * 500)], metadata={}, retention_days=0
        )
    with pytest.raises(ApiError) as grown:
        conversation_update(
            tenant_id=tenant.pk,
            conversation_id=conversation,
            metadata={"note": "z" * 400},
            retention_days=0,
        )
    assert grown.value.param == "metadata"
    assert kept_bytes(tenant_id=tenant.pk) == held  # nothing refused was written
    # Another tenant's room is its own, and what fits still goes in.
    conversation_create(
        tenant_id=other.pk, items=[_message("b", "y" * 500)], metadata={}, retention_days=0
    )
    kept_room_check(tenant_id=tenant.pk, size=100, param="store")
    # A response's turn goes in past it: the response was checked when it was created.
    assert conversation_turn_add(
        tenant_id=tenant.pk, conversation_id=conversation, items=[_message("t", "w" * 500)]
    )
    assert kept_bytes(tenant_id=tenant.pk) > settings.ROUNDHOUSE_TENANT_STORED_BYTES
    with pytest.raises(ApiError):
        kept_room_check(tenant_id=tenant.pk, size=1, param="store")
    # Deleting makes room again.
    conversation_delete(tenant_id=tenant.pk, conversation_id=conversation)
    kept_room_check(tenant_id=tenant.pk, size=100, param="store")
