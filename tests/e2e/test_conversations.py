"""The Conversations API through the official openai SDK, on the real stack.

Create with first items, retrieve, change metadata, add and list items a page at a time, take
one out, delete; a response naming the conversation reads its items as history and adds its
turn; another tenant's conversation is absent and unchanged.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from tenants.models import Tenant
from tests.conftest import ALIAS, _free_port, _http_ok, _spawn, _wait_for, roomy_key


@pytest.fixture
def sdk(stack, world):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=world.acme_key, max_retries=0)


@pytest.fixture
def other(stack, world):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=world.globex_key, max_retries=0)


def _ask(sdk, **fields: Any):
    return sdk.responses.create(model=ALIAS, max_output_tokens=6, temperature=0, **fields)


def test_a_conversation_is_created_changed_listed_and_deleted(sdk):
    created = sdk.conversations.create(
        items=[
            {"type": "message", "role": "system", "content": "Be brief."},
            {"type": "message", "role": "user", "content": "Hello!"},
        ],
        metadata={"topic": "greeting"},
    )
    assert created.id.startswith("conv_") and created.object == "conversation"
    assert created.metadata == {"topic": "greeting"}
    assert sdk.conversations.retrieve(created.id).model_dump() == created.model_dump()
    changed = sdk.conversations.update(created.id, metadata={"topic": "farewell"})
    assert changed.metadata == {"topic": "farewell"} and changed.created_at == created.created_at
    added = sdk.conversations.items.create(
        created.id, items=[{"type": "message", "role": "user", "content": f"{n}"} for n in "ab"]
    )
    assert [item.content[0].text for item in added.data] == ["a", "b"]
    # Newest first, a page at a time; oldest first with order=asc.
    newest = sdk.conversations.items.list(created.id, limit=3)
    assert [item.content[0].text for item in newest.data] == ["b", "a", "Hello!"]
    assert newest.has_more
    everything = list(sdk.conversations.items.list(created.id, limit=1, order="asc"))
    assert [item.content[0].text for item in everything] == ["Be brief.", "Hello!", "a", "b"]
    one = sdk.conversations.items.retrieve(everything[1].id, conversation_id=created.id)
    assert one.content[0].text == "Hello!"
    left = sdk.conversations.items.delete(everything[1].id, conversation_id=created.id)
    assert left.id == created.id
    with pytest.raises(openai.NotFoundError):
        sdk.conversations.items.retrieve(everything[1].id, conversation_id=created.id)
    texts = [item.content[0].text for item in sdk.conversations.items.list(created.id, order="asc")]
    assert texts == ["Be brief.", "a", "b"]
    deleted = sdk.conversations.delete(created.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (
        created.id,
        True,
        "conversation.deleted",
    )
    with pytest.raises(openai.NotFoundError):
        sdk.conversations.retrieve(created.id)


def test_responses_on_a_conversation_read_its_items_and_add_their_turns(sdk):
    conversation = sdk.conversations.create(
        items=[{"type": "message", "role": "user", "content": "My name is Ada."}]
    )
    first = _ask(sdk, input="What is my name?", conversation=conversation.id)
    assert first.conversation is not None and first.conversation.id == conversation.id
    # The conversation's items are the history: the same prompt as sending them as input.
    alone = _ask(
        sdk,
        input=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "user", "content": "What is my name?"},
        ],
    )
    assert first.usage.input_tokens == alone.usage.input_tokens
    # Its turn went in: the input, then the answer.
    items = list(sdk.conversations.items.list(conversation.id, order="asc"))
    assert [item.type for item in items] == ["message", "message", "message"]
    assert [item.role for item in items] == ["user", "user", "assistant"]
    assert items[2].content[0].text == first.output_text
    # A streamed turn on it reads all three, and adds its own.
    events = list(
        sdk.responses.create(
            model=ALIAS,
            input="Again?",
            conversation={"id": conversation.id},
            max_output_tokens=6,
            stream=True,
        )
    )
    second = events[-1].response  # incomplete: the random model runs to max_output_tokens
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    counted = sdk.responses.input_tokens.count(
        model=ALIAS, input="And now?", conversation=conversation.id
    )
    assert counted.input_tokens > second.usage.input_tokens
    so_far = sdk.responses.input_tokens.count(model=ALIAS, conversation=conversation.id)
    assert 0 < so_far.input_tokens < counted.input_tokens  # what the history alone takes
    assert len(list(sdk.conversations.items.list(conversation.id))) == 5


def test_a_background_response_adds_its_turn_once_it_ends(sdk):
    conversation = sdk.conversations.create()
    queued = _ask(sdk, input="Tell me later.", conversation=conversation.id, background=True)
    assert queued.status == "queued"
    for _ in range(300):
        done = sdk.responses.retrieve(queued.id)
        if done.status not in ("queued", "in_progress"):
            break
        time.sleep(0.2)
    items = []
    for _ in range(100):  # the turn is written with the response's end, by whoever ends it
        items = list(sdk.conversations.items.list(conversation.id, order="asc"))
        if len(items) == 2:
            break
        time.sleep(0.2)
    assert [item.role for item in items] == ["user", "assistant"]
    assert items[1].content[0].text == done.output_text


def test_a_conversation_and_a_previous_response_cannot_both_name_the_history(sdk):
    conversation = sdk.conversations.create()
    first = _ask(sdk, input="Hi.")
    with pytest.raises(openai.BadRequestError) as refused:
        _ask(sdk, input="Both?", conversation=conversation.id, previous_response_id=first.id)
    assert refused.value.param == "conversation"
    with pytest.raises(openai.NotFoundError) as missing:
        _ask(sdk, input="Where?", conversation="conv_" + "0" * 32)
    assert (missing.value.code, missing.value.param) == ("conversation_not_found", "conversation")


def test_another_tenants_conversation_is_absent_and_unchanged(sdk, other):
    mine = sdk.conversations.create(
        items=[{"type": "message", "role": "user", "content": "Mine."}], metadata={"k": "v"}
    )
    [item] = sdk.conversations.items.list(mine.id).data
    for attempt in (
        lambda: other.conversations.retrieve(mine.id),
        lambda: other.conversations.update(mine.id, metadata={"k": "theirs"}),
        lambda: other.conversations.items.list(mine.id),
        lambda: other.conversations.items.create(
            mine.id, items=[{"type": "message", "role": "user", "content": "Theirs."}]
        ),
        lambda: other.conversations.items.retrieve(item.id, conversation_id=mine.id),
        lambda: other.conversations.items.delete(item.id, conversation_id=mine.id),
        lambda: other.conversations.delete(mine.id),
        lambda: _ask(other, input="Yours?", conversation=mine.id),
        lambda: other.responses.input_tokens.count(model=ALIAS, input="x", conversation=mine.id),
    ):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert sdk.conversations.retrieve(mine.id).metadata == {"k": "v"}
    assert [i.id for i in sdk.conversations.items.list(mine.id).data] == [item.id]


@pytest.mark.parametrize(
    ("method", "path", "body", "param"),
    [
        ("POST", "", {"items": "hello"}, "items"),
        ("POST", "", {"items": [{"role": "robot", "content": "hi"}]}, "items[0].role"),
        ("POST", "", {"items": [{"role": "user", "content": "x"}] * 21}, "items"),
        ("POST", "", {"metadata": {"k": 5}}, "metadata"),
        ("POST", "", {"colour": "red"}, "colour"),
        (
            "POST",
            "",
            {"items": [{"id": "m1", "role": "user", "content": "x"}] * 2},
            "items[1].id",
        ),
        ("POST", "/{id}", {}, "metadata"),
        ("POST", "/{id}/items", {"items": []}, "items"),
        ("GET", "/{id}/items?limit=0", None, "limit"),
        ("GET", "/{id}/items?limit=%C2%B2", None, "limit"),  # a digit to str.isdigit
        ("GET", "/{id}/items?after=%00", None, "after"),
        ("GET", "/{id}/items/%00", None, "item_id"),
        ("DELETE", "/{id}/items/%00", None, "item_id"),
        ("POST", "", {"items": [{"id": "a/b", "role": "user", "content": "x"}]}, "items[0].id"),
        ("GET", "/{id}/items?after=nothing", None, "after"),
        ("GET", "/{id}/items?include=reasoning.encrypted_content", None, "include[0]"),
        ("GET", "/conv_nothing", None, "conversation_id"),
        ("GET", "/{id}/items/nothing", None, "item_id"),
    ],
)
def test_bad_input_is_refused_naming_the_field(stack, world, sdk, method, path, body, param):
    conversation = sdk.conversations.create()
    response = httpx.request(
        method,
        f"{stack.base_url}/v1/conversations{path.format(id=conversation.id)}",
        json=body,
        headers={"Authorization": f"Bearer {world.acme_key}"},
    )
    assert response.status_code in (400, 404), response.text
    assert response.json()["error"]["param"] == param


def test_an_item_id_the_conversation_holds_is_refused_when_added_again(sdk):
    item = {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "user", "content": "x"}
    conversation = sdk.conversations.create(items=[item])
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.conversations.items.create(conversation.id, items=[item])
    assert refused.value.param == "items"
    # A response whose input carries it again still adds its turn, the item under a new id.
    _ask(sdk, input=[item], conversation=conversation.id)
    ids = [i.id for i in sdk.conversations.items.list(conversation.id, order="asc")]
    assert len(ids) == 3 and len(set(ids)) == 3 and ids[0] == item["id"]


def test_every_call_counts_against_the_tenants_requests_per_minute(stack, django_db_blocker):
    with django_db_blocker.unblock():
        key = roomy_key("conv-rate", requests_per_minute=3)
    limited = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    conversation = limited.conversations.create()
    limited.conversations.retrieve(conversation.id)
    limited.conversations.items.list(conversation.id)
    with pytest.raises(openai.RateLimitError) as refused:
        limited.conversations.items.create(
            conversation.id, items=[{"type": "message", "role": "user", "content": "x"}]
        )
    assert refused.value.code == "rate_limit_exceeded"
    # Nothing was added by the refused call.
    with django_db_blocker.unblock():
        from inference.models import ConversationItem

        assert not ConversationItem.objects.filter(conversation_id=conversation.id).exists()


STORED_BOUND = 64 * 1024  # the spawned frontend's ROUNDHOUSE_TENANT_STORED_BYTES


@pytest.fixture
def bounded_url(stack, tmp_path):
    """A frontend of its own whose tenants may keep STORED_BOUND bytes of responses and
    conversations (the shared one keeps the default)."""
    port = _free_port()
    frontend = _spawn(
        "frontend-bounded",
        ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)],
        tmp_path,
        {"ROUNDHOUSE_TENANT_STORED_BYTES": str(STORED_BOUND)},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_for(frontend, lambda: _http_ok(f"{url}/healthz"), timeout=120)
        yield url
    finally:
        frontend.popen.terminate()
        frontend.popen.wait(timeout=30)


def _items(count: int, size: int) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": "x" * size} for _ in range(count)]


def test_a_tenants_conversations_and_stored_responses_are_bounded_together(
    bounded_url, django_db_blocker, usage_of
):
    with django_db_blocker.unblock():
        key = roomy_key("stored-bound")
        tenant_id = Tenant.objects.get(slug="stored-bound").pk
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=bounded_url, timeout=60) as client:
        conversation = client.post("/v1/conversations", json={}, headers=auth).json()["id"]
        added = [
            client.post(
                f"/v1/conversations/{conversation}/items",
                json={"items": _items(20, 1500)},
                headers=auth,
            )
            for _ in range(4)
        ]
        assert [a.status_code for a in added] == [200, 400, 400, 400]
        error = added[1].json()["error"]
        assert (error["code"], error["param"]) == ("storage_limit_exceeded", "items")
        from inference.responses.store import kept_bytes

        with django_db_blocker.unblock():
            held = kept_bytes(tenant_id=tenant_id)
        assert f"hold {held} bytes" in error["message"] and str(STORED_BOUND) in error["message"]
        # A response to keep is refused before any engine work: admitted, it would be kept.
        big = {"model": ALIAS, "input": "y" * 40_000, "max_output_tokens": 4}
        for extra, param in (({}, "store"), ({"store": False, "conversation": conversation},
                                               "conversation")):  # fmt: skip
            stored = client.post("/v1/responses", json={**big, **extra}, headers=auth)
            assert stored.status_code == 400, stored.text
            error = stored.json()["error"]
            assert (error["code"], error["param"]) == ("storage_limit_exceeded", param)
        small = {**big, "input": "Hi", "store": False}
        answered = client.post("/v1/responses", json=small, headers=auth)
        assert answered.status_code == 200, answered.text  # one that keeps nothing is answered
        assert usage_of(answered.headers["x-request-id"])
        with django_db_blocker.unblock():
            from billing.models import UsageRecord

            assert not UsageRecord.objects.filter(
                request_id=stored.headers["x-request-id"]
            ).exists()
        # Room comes back as what is kept goes; writes at once never take the tenant past it.
        client.delete(f"/v1/conversations/{conversation}", headers=auth)
        conversation = client.post("/v1/conversations", json={}, headers=auth).json()["id"]

        def add(_: int) -> int:
            with httpx.Client(base_url=bounded_url, timeout=60) as own:
                return own.post(
                    f"/v1/conversations/{conversation}/items",
                    json={"items": _items(20, 1500)},
                    headers=auth,
                ).status_code

        with ThreadPoolExecutor(max_workers=6) as pool:
            statuses = list(pool.map(add, range(6)))
    # Twenty such items fit once in the bound, never twice.
    assert sorted(statuses) == [200, 400, 400, 400, 400, 400], statuses
    with django_db_blocker.unblock():
        assert kept_bytes(tenant_id=tenant_id) <= STORED_BOUND
