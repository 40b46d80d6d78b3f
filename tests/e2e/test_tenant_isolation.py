"""Tenant isolation: a cross-tenant matrix over every endpoint and role, with zero successes.

Acme owns one of everything (a finished and a streamed request, a file, a batch, an invoice,
an API key, a retained content row). Globex, with every credential it has (its API key on /v1
and the WebSocket, its admin gina's session on the console and the finance API), tries every
way to read, change, cancel, download or stream each of them: every answer is the 404 a missing
object gets, in the shape the API promises, and nothing of acme's changes. Inside acme, a
member sees no money and no keys and finance sees no keys (404, as the console hides pages);
the staff-only management API answers any non-staff user 403, its documented status.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import pytest
import websockets
from django.contrib.auth.models import User
from django.forms.models import model_to_dict
from django.test import Client

from tests.conftest import ALIAS, Stack, World

INVOICE_MONTH = dt.date(2001, 1, 1)  # a month no other test invoices, deleted afterwards
CHAT = {"model": ALIAS, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}
LIVE_TOKENS = 1000  # a stream long enough to still run while another tenant tries to stop it
BATCH_LINE = json.dumps(
    {"custom_id": "one", "method": "POST", "url": "/v1/chat/completions", "body": CHAT}
)


@dataclass(frozen=True)
class Objects:
    """Ids of one tenant's objects, as path templates name them."""

    chat_id: str  # the x-request-id of a finished chat completion
    chat_idempotency_key: str
    stream_id: str  # the x-request-id of a finished streamed chat completion
    stream_idempotency_key: str
    file_id: str
    batch_id: str
    invoice_pk: int
    key_public_id: str
    key_pk: int
    retained_pk: int
    response_id: str  # a stored response of the Responses API
    conversation_id: str  # a conversation of the Conversations API
    item_id: str  # its one item


# The same shapes, naming nothing: a foreign object must answer exactly as these do.
MISSING = Objects(
    chat_id="0" * 32,
    chat_idempotency_key="missing-chat",
    stream_id="1" * 32,
    stream_idempotency_key="missing-stream",
    file_id="file-missing",
    batch_id="batch_missing",
    invoice_pk=999_999_999,
    key_public_id="sy-missing",
    key_pk=999_999_999,
    retained_pk=999_999_999,
    response_id="resp_" + "2" * 32,
    conversation_id="conv_" + "3" * 32,
    item_id="item-missing",
)


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    body: dict[str, Any] | None = None
    headers: dict[str, str] | None = None

    def on(self, objects: Objects) -> tuple[str, dict[str, Any] | None]:
        """Return the path and body naming these objects."""
        names = asdict(objects)
        body = None
        if self.body is not None:
            body = {k: v.format(**names) if isinstance(v, str) else v for k, v in self.body.items()}
        return self.path.format(**names), body


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _wait_for_usage(*request_ids: str, timeout: float = 60) -> None:
    from billing.models import UsageRecord

    deadline = time.monotonic() + timeout
    while UsageRecord.objects.filter(request_id__in=request_ids).count() < len(request_ids):
        assert time.monotonic() < deadline, f"no usage records for {request_ids}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def acme(stack: Stack, world: World, django_db_blocker: Any) -> Iterator[Objects]:
    """Give acme one of every object through its own API key; remove them afterwards."""
    from batches.models import Batch, File
    from batches.services import batch_create
    from billing.invoices import invoice_build
    from inference.models import Conversation, StoredResponse
    from privacy.models import RetainedContent
    from privacy.services import content_retain
    from tenants.models import ApiKey
    from tenants.services import api_key_issue

    chat_key, stream_key = f"isolation-chat-{uuid.uuid4()}", f"isolation-stream-{uuid.uuid4()}"
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        chat = client.post(
            "/v1/chat/completions",
            json=CHAT,
            headers={**_auth(world.acme_key), "Idempotency-Key": chat_key},
        )
        assert chat.status_code == 200, chat.text
        with client.stream(
            "POST",
            "/v1/chat/completions",
            json={**CHAT, "stream": True},
            headers={**_auth(world.acme_key), "Idempotency-Key": stream_key},
        ) as streamed:
            assert streamed.status_code == 200
            assert "data: [DONE]" in list(streamed.iter_lines())
        uploaded = client.post(
            "/v1/files",
            files={"file": ("input.jsonl", f"{BATCH_LINE}\n".encode())},
            data={"purpose": "batch"},
            headers=_auth(world.acme_key),
        )
        assert uploaded.status_code == 200, uploaded.text
        stored = client.post(
            "/v1/responses",
            json={"model": ALIAS, "input": "Say hi", "max_output_tokens": 4},
            headers=_auth(world.acme_key),
        )
        assert stored.status_code == 200, stored.text
        conversation = client.post(
            "/v1/conversations",
            json={"items": [{"id": "acme-item", "role": "user", "content": "Mine"}]},
            headers=_auth(world.acme_key),
        )
        assert conversation.status_code == 200, conversation.text
    chat_id, stream_id = chat.headers["x-request-id"], streamed.headers["x-request-id"]
    file_id = uploaded.json()["id"]
    with django_db_blocker.unblock():
        _wait_for_usage(chat_id, stream_id)
        # Created without queueing its job: it stays `validating`, so a cancel would show.
        batch = batch_create(
            tenant_id=world.acme.pk,
            api_key_id=ApiKey.objects.get(tenant=world.acme, name="tests").pk,
            input_file_id=file_id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
        invoice = invoice_build(tenant=world.acme, month=INVOICE_MONTH)
        key = api_key_issue(tenant=world.acme, name="isolation target").key
        content_retain(
            tenant_id=world.acme.pk,
            request_id=chat_id,
            prompt="Say hi",
            completion="hi",
            retention_days=1,
        )
        retained = RetainedContent.objects.get(request_id=chat_id)
    yield Objects(
        chat_id=chat_id,
        chat_idempotency_key=chat_key,
        stream_id=stream_id,
        stream_idempotency_key=stream_key,
        file_id=file_id,
        batch_id=batch.id,
        invoice_pk=invoice.pk,
        key_public_id=key.public_id,
        key_pk=key.pk,
        retained_pk=retained.pk,
        response_id=stored.json()["id"],
        conversation_id=conversation.json()["id"],
        item_id="acme-item",
    )
    with django_db_blocker.unblock():
        StoredResponse.objects.filter(pk=stored.json()["id"]).delete()
        Conversation.objects.filter(pk=conversation.json()["id"]).delete()
        retained.delete()
        Batch.objects.filter(pk=batch.id).delete()
        File.objects.filter(pk=file_id).delete()
        invoice.delete()
        ApiKey.objects.filter(pk=key.pk).delete()


def _acme_state(world: World, acme: Objects) -> dict[str, Any]:
    """Everything of acme's (and the platform's) that a leaked call could have changed."""
    from batches.models import Batch, File
    from billing.models import Adjustment, Invoice, PriceBook, UsageRecord
    from inference.models import StoredResponse
    from inference.responses.store import conversation_get, conversation_items
    from models_registry.models import Alias, Model, ModelGrant, Rollout
    from privacy.models import RetainedContent
    from tenants.models import ApiKey, Quota, Tenant
    from tenants.services import PRIVACY_FIELDS

    batch = Batch.objects.get(pk=acme.batch_id)
    key = ApiKey.objects.get(pk=acme.key_pk)
    invoice = Invoice.objects.get(pk=acme.invoice_pk)
    alias = Alias.objects.get(name=ALIAS)
    return {
        "batch": (batch.status, batch.cancelling_at),
        "file": File.objects.filter(pk=acme.file_id).values_list("size", "filename").get(),
        "batches over the file": Batch.objects.filter(input_file_id=acme.file_id).count(),
        "key": (key.name, key.revoked_at, key.expires_at, key.allowed_models),
        "acme keys": ApiKey.objects.filter(tenant=world.acme).count(),
        "invoice": (invoice.state, invoice.number, invoice.total),
        "acme invoices": Invoice.objects.filter(tenant=world.acme).count(),
        "acme adjustments": Adjustment.objects.filter(tenant=world.acme).count(),
        "requests": sorted(
            UsageRecord.objects.filter(request_id__in=[acme.chat_id, acme.stream_id]).values_list(
                "request_id", "status", "completion_tokens"
            )
        ),
        "retained": RetainedContent.objects.filter(pk=acme.retained_pk).count(),
        "stored response": StoredResponse.objects.filter(pk=acme.response_id).count(),
        "conversation": (
            conversation_get(tenant_id=world.acme.pk, conversation_id=acme.conversation_id),
            conversation_items(tenant_id=world.acme.pk, conversation_id=acme.conversation_id),
        ),
        "quota": model_to_dict(Quota.objects.get(tenant=world.acme)),
        "privacy": model_to_dict(Tenant.objects.get(pk=world.acme.pk), fields=PRIVACY_FIELDS),
        "alias": (alias.version_id, alias.splits.count()),
        "platform model": (
            Model.objects.filter(name="tiny-llama").values_list("owner_id", "limited").get(),
            sorted(ModelGrant.objects.filter(model__name="tiny-llama").values_list("tenant_id")),
        ),
        "rollouts": Rollout.objects.count(),
        "price books": PriceBook.objects.count(),
    }


# --- /v1 with globex's API key ---------------------------------------------------------------

V1_FOREIGN = [
    pytest.param(Call("GET", "/v1/files/{file_id}"), "file_not_found", "file_id",
                 id="read-a-file"),
    pytest.param(Call("GET", "/v1/files/{file_id}/content"), "file_not_found", "file_id",
                 id="download-a-file"),
    pytest.param(Call("DELETE", "/v1/files/{file_id}"), "file_not_found", "file_id",
                 id="delete-a-file"),
    pytest.param(Call("GET", "/v1/files?after={file_id}"), "file_not_found", "after",
                 id="page-after-a-file"),
    pytest.param(Call("POST", "/v1/batches", {"input_file_id": "{file_id}",
                      "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
                 "file_not_found", "input_file_id", id="batch-over-a-file"),
    pytest.param(Call("GET", "/v1/batches/{batch_id}"), "batch_not_found", "batch_id",
                 id="read-a-batch"),
    pytest.param(Call("GET", "/v1/batches?after={batch_id}"), "batch_not_found", "batch_id",
                 id="page-after-a-batch"),
    pytest.param(Call("POST", "/v1/batches/{batch_id}/cancel"), "batch_not_found", "batch_id",
                 id="cancel-a-batch"),
    pytest.param(Call("POST", "/v1/requests/{chat_id}/cancel"), "request_not_found", "id",
                 id="cancel-a-request"),
    pytest.param(Call("POST", "/v1/requests/chatcmpl-{chat_id}/cancel"), "request_not_found",
                 "id", id="cancel-a-request-by-completion-id"),
    pytest.param(Call("POST", "/v1/requests/{stream_id}/cancel"), "request_not_found", "id",
                 id="cancel-a-streamed-request"),
    pytest.param(Call("GET", "/v1/requests/{stream_id}/stream"), "request_not_found", "id",
                 id="stream-a-request-again"),
    pytest.param(Call("GET", "/v1/requests/chatcmpl-{stream_id}/stream"), "request_not_found",
                 "id", id="stream-a-request-again-by-completion-id"),
    pytest.param(Call("GET", "/v1/requests/{stream_id}/stream", headers={"Last-Event-ID": "1-0"}),
                 "request_not_found", "id", id="resume-a-stream-after-an-event"),
    pytest.param(Call("GET", "/v1/requests/{chat_id}/stream"), "request_not_found", "id",
                 id="stream-a-non-streamed-request"),
    pytest.param(Call("GET", "/v1/responses/{response_id}"), "response_not_found",
                 "response_id", id="read-a-response"),
    pytest.param(Call("GET", "/v1/responses/{response_id}/input_items"), "response_not_found",
                 "response_id", id="list-a-responses-input"),
    pytest.param(Call("DELETE", "/v1/responses/{response_id}"), "response_not_found",
                 "response_id", id="delete-a-response"),
    pytest.param(Call("POST", "/v1/responses/{response_id}/cancel"), "response_not_found",
                 "response_id", id="cancel-a-response"),
    pytest.param(Call("POST", "/v1/responses", {"model": ALIAS, "input": "Mine now?",
                      "max_output_tokens": 4, "previous_response_id": "{response_id}"}),
                 "response_not_found", "previous_response_id", id="chain-onto-a-response"),
    pytest.param(Call("POST", "/v1/responses/input_tokens", {"model": ALIAS, "input": "How long?",
                      "previous_response_id": "{response_id}"}),
                 "response_not_found", "previous_response_id", id="count-a-responses-chain"),
    pytest.param(Call("GET", "/v1/conversations/{conversation_id}"), "conversation_not_found",
                 "conversation_id", id="read-a-conversation"),
    pytest.param(Call("POST", "/v1/conversations/{conversation_id}", {"metadata": {"k": "v"}}),
                 "conversation_not_found", "conversation_id", id="rename-a-conversation"),
    pytest.param(Call("DELETE", "/v1/conversations/{conversation_id}"), "conversation_not_found",
                 "conversation_id", id="delete-a-conversation"),
    pytest.param(Call("GET", "/v1/conversations/{conversation_id}/items"),
                 "conversation_not_found", "conversation_id", id="list-a-conversations-items"),
    pytest.param(Call("POST", "/v1/conversations/{conversation_id}/items",
                      {"items": [{"role": "user", "content": "Theirs"}]}),
                 "conversation_not_found", "conversation_id", id="add-to-a-conversation"),
    pytest.param(Call("GET", "/v1/conversations/{conversation_id}/items/{item_id}"),
                 "conversation_not_found", "conversation_id", id="read-a-conversations-item"),
    pytest.param(Call("DELETE", "/v1/conversations/{conversation_id}/items/{item_id}"),
                 "conversation_not_found", "conversation_id", id="delete-a-conversations-item"),
    pytest.param(Call("POST", "/v1/responses", {"model": ALIAS, "input": "Mine now?",
                      "max_output_tokens": 4, "conversation": "{conversation_id}"}),
                 "conversation_not_found", "conversation", id="answer-on-a-conversation"),
    pytest.param(Call("POST", "/v1/responses/input_tokens", {"model": ALIAS, "input": "How long?",
                      "conversation": "{conversation_id}"}),
                 "conversation_not_found", "conversation", id="count-a-conversation"),
]  # fmt: skip


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        yield c


@pytest.mark.parametrize(("call", "code", "param"), V1_FOREIGN)
def test_globex_key_gets_the_404_of_a_missing_object(
    client: httpx.Client,
    world: World,
    acme: Objects,
    django_db_blocker: Any,
    call: Call,
    code: str,
    param: str,
) -> None:
    with django_db_blocker.unblock():
        before = _acme_state(world, acme)
    path, body = call.on(acme)
    headers = {**_auth(world.globex_key), **(call.headers or {})}
    foreign = client.request(call.method, path, json=body, headers=headers)
    assert foreign.status_code == 404, foreign.text
    error = foreign.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("not_found_error", code, param)
    assert foreign.headers["x-request-id"]
    # Indistinguishable from an id that names nothing at all.
    path, body = call.on(MISSING)
    missing = client.request(call.method, path, json=body, headers=headers)
    assert missing.status_code == 404
    assert {k: v for k, v in missing.json()["error"].items() if k != "message"} == {
        k: v for k, v in error.items() if k != "message"
    }
    with django_db_blocker.unblock():
        assert _acme_state(world, acme) == before


@pytest.mark.parametrize(
    ("path", "field"),
    [("/v1/files", "file_id"), ("/v1/files?purpose=batch", "file_id"), ("/v1/batches", "batch_id")],
    ids=["files", "batch-files", "batches"],
)
def test_globex_lists_show_no_acme_object(
    client: httpx.Client, world: World, acme: Objects, path: str, field: str
) -> None:
    listed = client.get(path, headers=_auth(world.globex_key))
    assert listed.status_code == 200, listed.text
    assert getattr(acme, field) not in {item["id"] for item in listed.json()["data"]}
    own = client.get(path, headers=_auth(world.acme_key))
    assert getattr(acme, field) in {item["id"] for item in own.json()["data"]}


@pytest.mark.parametrize("stream", [False, True], ids=["replay", "attach-to-a-stream"])
def test_globex_reusing_an_acme_idempotency_key_gets_its_own_new_request(
    client: httpx.Client, world: World, acme: Objects, stream: bool
) -> None:
    key = acme.stream_idempotency_key if stream else acme.chat_idempotency_key
    body = {**CHAT, "stream": True} if stream else CHAT
    answer = client.post(
        "/v1/chat/completions",
        json=body,
        headers={**_auth(world.globex_key), "Idempotency-Key": key},
    )
    assert answer.status_code == 200, answer.text
    assert "Idempotent-Replayed" not in answer.headers
    assert answer.headers["x-request-id"] not in (acme.chat_id, acme.stream_id)


def test_acme_key_reaches_every_object_globex_cannot(
    client: httpx.Client, world: World, acme: Objects
) -> None:
    """The matrix's control: the same ids work for their owner, so each 404 is isolation."""
    for path in ("/v1/files/{file_id}", "/v1/files/{file_id}/content", "/v1/files?after={file_id}",
                 "/v1/batches/{batch_id}",
                 "/v1/batches?after={batch_id}", "/v1/requests/{stream_id}/stream",
                 "/v1/responses/{response_id}", "/v1/responses/{response_id}/input_items",
                 "/v1/conversations/{conversation_id}",
                 "/v1/conversations/{conversation_id}/items",
                 "/v1/conversations/{conversation_id}/items/{item_id}"):  # fmt: skip
        answer = client.get(path.format(**asdict(acme)), headers=_auth(world.acme_key))
        assert answer.status_code == 200, (path, answer.text)
    # A finished request: the owner is told so, and nothing else happens.
    finished = client.post(f"/v1/requests/{acme.chat_id}/cancel", headers=_auth(world.acme_key))
    assert finished.status_code == 200 and finished.json()["status"] == "finished"


# --- in-flight requests: SSE and WebSocket -----------------------------------------------------


def _ws_url(stack: Stack) -> str:
    return stack.base_url.replace("http://", "ws://") + "/v1/ws"


async def test_a_tenant_cannot_cancel_or_read_another_tenants_request_while_it_streams(
    stack: Stack, world: World, usage_of: Any
) -> None:
    """Globex owns the live streams here: acme's quota caps a request at too few tokens for a
    stream to outlast the attempts, and isolation is the same in both directions."""
    long = {"model": ALIAS, "prompt": "Once", "max_tokens": LIVE_TOKENS, "ignore_eos": True}
    async with (
        httpx.AsyncClient(base_url=stack.base_url, timeout=120) as http,
        http.stream("POST", "/v1/completions", json={**long, "stream": True},
                    headers=_auth(world.globex_key)) as sse,
        # Unbounded: the socket's stream waits unread while the SSE one is drained, and a full
        # queue would stop the client reading the server's pongs (a keepalive timeout).
        websockets.connect(_ws_url(stack), additional_headers=_auth(world.globex_key),
                           max_queue=None) as own_ws,
        websockets.connect(_ws_url(stack), additional_headers=_auth(world.acme_key)) as other_ws,
    ):  # fmt: skip
        assert sse.status_code == 200
        sse_id = sse.headers["x-request-id"]
        data = (line[6:] async for line in sse.aiter_lines() if line.startswith("data: "))
        first = await anext(data)
        await own_ws.send(json.dumps({"type": "request", "id": "shared", "endpoint":
                                      "completions", "body": long}))  # fmt: skip
        started = json.loads(await asyncio.wait_for(own_ws.recv(), 60))
        assert started["type"] == "started", started
        ws_id = started["request_id"]

        for rid in (sse_id, f"cmpl-{sse_id}", ws_id, f"cmpl-{ws_id}"):
            for method, action in (("POST", "cancel"), ("GET", "stream")):
                foreign = await http.request(
                    method, f"/v1/requests/{rid}/{action}", headers=_auth(world.acme_key)
                )
                assert foreign.status_code == 404, foreign.text
                assert foreign.json()["error"]["code"] == "request_not_found"
        # A socket's ids are its own: naming another socket's client id or request ids stops
        # nothing.
        for client_id in ("shared", sse_id, ws_id):
            await other_ws.send(json.dumps({"type": "cancel", "id": client_id}))
        attempted_at = dt.datetime.now(dt.UTC)

        rest = [chunk async for chunk in data]
        messages: list[dict[str, Any]] = []
        while not messages or messages[-1]["type"] not in ("finished", "error"):
            messages.append(json.loads(await asyncio.wait_for(own_ws.recv(), 120)))
    chunks = [json.loads(chunk) for chunk in [first, *rest] if chunk != "[DONE]"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length", chunks[-1]
    assert messages[-1]["type"] == "finished", messages[-1]
    assert messages[-1]["finish_reason"] == "length"
    records = await asyncio.to_thread(usage_of, sse_id, ws_id)
    assert {(r.status, r.completion_tokens) for r in records} == {("ok", LIVE_TOKENS)}
    # Both still ran when the attempts were made: the 404s were not about finished requests.
    assert all(r.finished_at > attempted_at for r in records)


# --- models: another tenant's model, its adapter, a platform model not granted --------------

PROMPT = [{"role": "user", "content": "Say hi"}]
# Every surface that names a model, as globex calls it: (method, path, body without "model").
# A body of None is a GET whose path names the model.
MODEL_SURFACES = [
    pytest.param("POST", "/v1/chat/completions", {"messages": PROMPT, "max_tokens": 4}, {},
                 id="chat"),
    pytest.param("POST", "/v1/chat/completions",
                 {"messages": PROMPT, "max_tokens": 4, "stream": True}, {}, id="chat-stream"),
    pytest.param("POST", "/v1/completions", {"prompt": "Once", "max_tokens": 4}, {},
                 id="completions"),
    pytest.param("POST", "/v1/chat/completions/batch",
                 {"messages": [PROMPT, PROMPT], "max_tokens": 4}, {}, id="batch-chat"),
    pytest.param("POST", "/v1/responses", {"input": "Say hi", "max_output_tokens": 4}, {},
                 id="responses"),
    pytest.param("POST", "/v1/responses/input_tokens", {"input": "Say hi"}, {},
                 id="responses-input-tokens"),
    pytest.param("POST", "/v1/messages", {"messages": PROMPT, "max_tokens": 4}, {},
                 id="messages"),
    pytest.param("POST", "/v1/messages/count_tokens", {"messages": PROMPT}, {},
                 id="messages-count-tokens"),
    pytest.param("POST", "/v1/embeddings", {"input": "Say hi"}, {}, id="embeddings"),
    pytest.param("POST", "/tokenize", {"prompt": "Say hi"}, {}, id="tokenize"),
    pytest.param("POST", "/detokenize", {"tokens": [1, 2]}, {}, id="detokenize"),
    pytest.param("GET", "/v1/models/{model}", None, {}, id="model-card"),
    # A retry's key: checked before anything could be replayed.
    pytest.param("POST", "/v1/chat/completions", {"messages": PROMPT, "max_tokens": 4},
                 {"Idempotency-Key": "{key}"}, id="chat-idempotency-key"),
    pytest.param("POST", "/v1/messages", {"messages": PROMPT, "max_tokens": 4},
                 {"Idempotency-Key": "{key}"}, id="messages-idempotency-key"),
    pytest.param("POST", "/v1/responses", {"input": "Say hi", "max_output_tokens": 4},
                 {"Idempotency-Key": "{key}"}, id="responses-idempotency-key"),
]  # fmt: skip
MODEL_KINDS = ["owned", "adapter", "not-granted"]
UNKNOWN = "nope-"  # a forbidden name with this before it names nothing at all


@pytest.fixture(scope="module")
def acme_models(
    stack: Stack,
    world: World,
    demo_model_dir: Any,
    django_db_blocker: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[str, ...]]]:
    """Acme's own model (with an alias), acme's adapter on a platform base, and a platform
    model limited to acme: each routes for acme (a deployment, no worker), by every name."""
    from models_registry.demo_adapter import demo_adapter_build
    from models_registry.models import Alias, Deployment
    from models_registry.services import (
        alias_set,
        deployment_create,
        model_limit_set,
        model_version_register,
    )

    with django_db_blocker.unblock():
        owned, _ = model_version_register(
            model_name="acme-llama", source_dir=demo_model_dir, owner=world.acme
        )
        base, _ = model_version_register(model_name="isolation-base", source_dir=demo_model_dir)
        built = demo_adapter_build(
            base_dir=demo_model_dir, out_dir=tmp_path_factory.mktemp("acme") / "pirate", seed=11
        )
        adapter, _ = model_version_register(
            model_name="acme-pirate", source_dir=built, base=base, owner=world.acme
        )
        granted, _ = model_version_register(model_name="granted-llama", source_dir=demo_model_dir)
        for name, version, loras in (
            ("acme-llama", owned, 0),
            ("isolation-base", base, 1),
            ("granted-llama", granted, 0),
        ):
            deployment_create(name=name, version=version, max_loras=loras)
        alias_set(name="acme-chat", version=owned)
        model_limit_set(model=granted.model, limited=True, grants=[world.acme])
    yield {
        "owned": ("acme-llama", owned.public_name, "acme-chat"),
        "adapter": ("acme-pirate", adapter.public_name),
        "not-granted": ("granted-llama", granted.public_name),
    }
    with django_db_blocker.unblock():
        Alias.objects.filter(name="acme-chat").delete()
        Deployment.objects.filter(
            name__in=["acme-llama", "isolation-base", "granted-llama"]
        ).delete()


def _model_call(
    client: httpx.Client,
    key: str,
    name: str,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    headers: dict[str, str],
) -> httpx.Response:
    sent = {k: v.format(key=uuid.uuid4().hex) for k, v in headers.items()}
    return client.request(
        method,
        path.format(model=name),
        json={**body, "model": name} if body is not None else None,
        headers={**_auth(key), **sent},
    )


def _same_as_unknown(forbidden: httpx.Response, unknown: httpx.Response) -> None:
    """The answer for a forbidden name is, byte for byte, the one for a name naming nothing."""
    assert forbidden.status_code == unknown.status_code == 404, forbidden.text
    assert forbidden.content == unknown.content.replace(UNKNOWN.encode(), b""), forbidden.text
    # What differs between any two requests: their ids, trace, time and the tenant's bucket;
    # and the length, by the name's own (the body's, compared above).
    varying = (
        "x-request-id", "traceparent", "date", "x-ratelimit-remaining", "x-ratelimit-reset",
        "content-length",
    )  # fmt: skip
    assert forbidden.headers.keys() == unknown.headers.keys()
    assert {k: v for k, v in forbidden.headers.items() if not k.startswith(varying)} == {
        k: v for k, v in unknown.headers.items() if not k.startswith(varying)
    }
    for answer in (forbidden, unknown):
        assert int(answer.headers["content-length"]) == len(answer.content)
    error = forbidden.json()["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model")


def _billed(django_db_blocker: Any, client: httpx.Client, world: World, *rids: str) -> set[str]:
    """The request ids among `rids` with a usage record, once a request of globex's sent after
    them has its own (the ingester takes the usage stream in order)."""
    from billing.models import UsageRecord

    after = client.post(
        "/v1/completions",
        json={"model": ALIAS, "prompt": "Once", "max_tokens": 1},
        headers=_auth(world.globex_key),
    )
    assert after.status_code == 200, after.text
    with django_db_blocker.unblock():
        _wait_for_usage(after.headers["x-request-id"])
        return set(
            UsageRecord.objects.filter(request_id__in=rids).values_list("request_id", flat=True)
        )


def _access_state(world: World) -> dict[str, Any]:
    from billing.models import UsageRecord
    from models_registry.models import Model, ModelGrant

    return {
        "models": sorted(Model.objects.values_list("name", "owner_id", "limited")),
        "grants": sorted(ModelGrant.objects.values_list("model__name", "tenant__slug")),
        "globex usage": UsageRecord.objects.filter(tenant=world.globex).count(),
    }


@pytest.mark.parametrize(("method", "path", "body", "headers"), MODEL_SURFACES)
@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_a_model_globex_may_not_call_is_the_404_of_a_model_that_does_not_exist(
    client: httpx.Client,
    world: World,
    acme: Objects,
    acme_models: dict[str, tuple[str, ...]],
    django_db_blocker: Any,
    kind: str,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    headers: dict[str, str],
) -> None:
    with django_db_blocker.unblock():
        before = (_acme_state(world, acme), _access_state(world))
    refused = []
    for name in acme_models[kind]:
        call = (method, path, body, headers)
        forbidden = _model_call(client, world.globex_key, name, *call)
        unknown = _model_call(client, world.globex_key, UNKNOWN + name, *call)
        _same_as_unknown(forbidden, unknown)
        refused.append(forbidden.headers["x-request-id"])
    assert not _billed(django_db_blocker, client, world, *refused)
    with django_db_blocker.unblock():
        after = (_acme_state(world, acme), _access_state(world))
    assert after[0] == before[0]
    assert after[1] == {**before[1], "globex usage": before[1]["globex usage"] + 1}


def test_acme_calls_by_every_name_what_globex_cannot(
    client: httpx.Client, world: World, acme_models: dict[str, tuple[str, ...]]
) -> None:
    """The control of the rows above: each name routes for its owner (or grantee)."""
    listed_by = {
        key: {card["id"] for card in client.get("/v1/models", headers=_auth(key)).json()["data"]}
        for key in (world.acme_key, world.globex_key)
    }
    for name in (name for names in acme_models.values() for name in names):
        counted = client.post(
            "/tokenize", json={"model": name, "prompt": "Say hi"}, headers=_auth(world.acme_key)
        )
        assert counted.status_code == 200, (name, counted.text)
        assert name in listed_by[world.acme_key]
        assert name not in listed_by[world.globex_key]
        card = client.get(f"/v1/models/{name}", headers=_auth(world.acme_key)).json()
        assert card["owned_by"] == ("roundhouse" if name.startswith("granted") else "acme")


async def test_a_websocket_request_for_a_model_globex_may_not_call_is_refused_as_unknown(
    stack: Stack, world: World, acme_models: dict[str, tuple[str, ...]]
) -> None:
    async with websockets.connect(_ws_url(stack), additional_headers=_auth(world.globex_key)) as ws:
        for name in (name for names in acme_models.values() for name in names):
            answers = []
            for model in (name, UNKNOWN + name):
                body = {"model": model, "messages": PROMPT, "max_tokens": 4}
                await ws.send(json.dumps({"type": "request", "id": "m", "body": body}))
                answers.append(await asyncio.wait_for(ws.recv(), 30))
            forbidden, unknown = (str(answer) for answer in answers)
            assert forbidden == unknown.replace(UNKNOWN, ""), forbidden
            assert json.loads(forbidden)["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_a_batch_line_for_a_model_globex_may_not_call_fails_as_an_unknown_ones_does(
    client: httpx.Client,
    world: World,
    acme_models: dict[str, tuple[str, ...]],
    django_db_blocker: Any,
    kind: str,
) -> None:
    """The lines run through the batch runner in this process, against the real stores."""
    from batches.models import Batch, BatchLine, File
    from batches.runner import batch_step
    from batches.services import batch_create
    from tenants.models import ApiKey

    names = [m for name in acme_models[kind] for m in (name, UNKNOWN + name)]
    lines = [
        json.dumps(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": model, "messages": PROMPT, "max_tokens": 4},
            }
        )
        for i, model in enumerate(names)
    ]
    uploaded = client.post(
        "/v1/files",
        files={"file": ("models.jsonl", "\n".join(lines).encode())},
        data={"purpose": "batch"},
        headers=_auth(world.globex_key),
    )
    assert uploaded.status_code == 200, uploaded.text
    file_id = uploaded.json()["id"]
    with django_db_blocker.unblock():
        batch = batch_create(
            tenant_id=world.globex.pk,
            api_key_id=ApiKey.objects.get(tenant=world.globex, name="tests").pk,
            input_file_id=file_id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
        try:
            for _ in range(20):
                if asyncio.run(batch_step(batch.id)):
                    break
            results: list[Any] = [
                line.result
                for line in BatchLine.objects.filter(batch_id=batch.id).order_by("index")
            ]
            rids = list(
                BatchLine.objects.filter(batch_id=batch.id).values_list("request_id", flat=True)
            )
        finally:
            ended = Batch.objects.get(pk=batch.id)
            files = [file_id, ended.output_file_id, ended.error_file_id]
            ended.delete()
            File.objects.filter(pk__in=[f for f in files if f]).delete()
    assert len(results) == len(names)
    for forbidden, unknown in zip(results[::2], results[1::2], strict=True):
        assert forbidden["status_code"] == 404
        assert forbidden["body"]["error"]["code"] == "model_not_found"
        assert json.dumps(forbidden) == json.dumps(unknown).replace(UNKNOWN, "")
    assert not _billed(django_db_blocker, client, world, *rids)


def test_a_revoked_grant_stops_calls_replays_and_cached_answers_on_a_running_frontend(
    client: httpx.Client, stack: Stack, world: World, django_db_blocker: Any
) -> None:
    """The platform model is limited to acme, globex and a grantee with a response cache for
    this test; the grantee's grant is revoked while the frontend runs. Within seconds (polled)
    its requests are the 404 of an unknown model: a retry with the Idempotency-Key of an answer
    it got before, and a request its cache holds the answer to, among them."""
    from models_registry.models import Model
    from models_registry.services import model_limit_set, model_revoke
    from tenants.models import AuditEvent, Tenant
    from tests.conftest import roomy_key

    with django_db_blocker.unblock():
        slug = f"grantee-{uuid.uuid4().hex[:6]}"
        key = roomy_key(slug, response_cache_seconds=60)
        grantee = Tenant.objects.get(slug=slug)
        model = Model.objects.get(name=world.version.model.name)
        model_limit_set(model=model, limited=True, grants=[world.acme, world.globex, grantee])
    idempotency = f"grantee-{uuid.uuid4()}"
    body = {
        "model": ALIAS,
        "messages": [{"role": "user", "content": f"Name {idempotency}"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    try:
        first = client.post(
            "/v1/chat/completions",
            json=body,
            headers={**_auth(key), "Idempotency-Key": idempotency},
        )
        assert first.status_code == 200, first.text
        again = client.post("/v1/chat/completions", json=body, headers=_auth(key))
        assert again.headers["x-roundhouse-cache"] == "hit"
        with django_db_blocker.unblock():
            assert model_revoke(model=model, tenant=grantee, reason="contract ended")
        deadline = time.monotonic() + 30
        while (
            client.post("/v1/chat/completions", json=body, headers=_auth(key)).status_code != 404
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        unknown = client.post(
            "/v1/chat/completions", json={**body, "model": UNKNOWN + ALIAS}, headers=_auth(key)
        )
        cached = client.post("/v1/chat/completions", json=body, headers=_auth(key))
        _same_as_unknown(cached, unknown)
        replayed = client.post(
            "/v1/chat/completions",
            json=body,
            headers={**_auth(key), "Idempotency-Key": idempotency},
        )
        _same_as_unknown(replayed, unknown)
        assert "Idempotent-Replayed" not in replayed.headers
        listed = client.get("/v1/models", headers=_auth(key)).json()["data"]
        assert not {ALIAS, model.name, world.version.public_name} & {c["id"] for c in listed}
        counted = client.post(
            "/tokenize", json={"model": ALIAS, "prompt": "hi"}, headers=_auth(key)
        )
        assert counted.status_code == 404
        # Acme and globex keep their grants and their answers.
        assert (
            client.post(
                "/tokenize", json={"model": ALIAS, "prompt": "hi"}, headers=_auth(world.acme_key)
            ).status_code
            == 200
        )
        refused = [r.headers["x-request-id"] for r in (cached, replayed, counted)]
        assert not _billed(django_db_blocker, client, world, *refused)
        with django_db_blocker.unblock():
            event = AuditEvent.objects.filter(action="model.revoke").order_by("-id").first()
            assert event is not None
            assert (event.target_id, event.tenant, event.reason) == (
                model.name,
                grantee,
                "contract ended",
            )
    finally:
        with django_db_blocker.unblock():
            model_limit_set(model=model, limited=False)
        deadline = time.monotonic() + 30
        while (
            client.post(
                "/tokenize", json={"model": ALIAS, "prompt": "hi"}, headers=_auth(key)
            ).status_code
            != 200
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)


# --- console and finance API with globex's admin session ----------------------------------------

GLOBEX_ADMIN_404 = [
    pytest.param(Call("GET", "/console/t/acme/"), id="console-overview"),
    pytest.param(Call("GET", "/console/t/acme/keys"), id="console-keys"),
    pytest.param(Call("GET", "/console/t/acme/models"), id="console-models"),
    pytest.param(Call("POST", "/console/t/acme/keys", {"name": "planted"}),
                 id="console-issue-a-key"),
    pytest.param(Call("POST", "/console/t/acme/keys/{key_public_id}/revoke"),
                 id="console-revoke-a-key"),
    pytest.param(Call("POST", "/console/t/acme/keys/{key_public_id}/rotate"),
                 id="console-rotate-a-key"),
    pytest.param(Call("GET", "/console/t/acme/requests"), id="console-requests"),
    pytest.param(Call("GET", "/console/t/acme/responses"), id="console-responses"),
    pytest.param(Call("GET", "/console/t/acme/responses/{response_id}"), id="console-response"),
    pytest.param(Call("POST", "/console/t/acme/responses/{response_id}/delete"),
                 id="console-delete-a-response"),
    pytest.param(Call("GET", "/console/t/acme/conversations"), id="console-conversations"),
    pytest.param(Call("GET", "/console/t/acme/conversations/{conversation_id}"),
                 id="console-conversation"),
    pytest.param(Call("POST", "/console/t/acme/conversations/{conversation_id}/delete"),
                 id="console-delete-a-conversation"),
    pytest.param(Call("GET", "/console/t/acme/usage"), id="console-usage"),
    pytest.param(Call("GET", "/console/t/acme/usage?group_by=key"), id="console-usage-by-key"),
    pytest.param(Call("GET", "/console/t/acme/invoices"), id="console-invoices"),
    pytest.param(Call("GET", "/console/t/acme/invoices/{invoice_pk}"), id="console-invoice"),
    # Its own tenant in the URL, acme's object in the path: the object lookup takes the tenant.
    pytest.param(Call("GET", "/console/t/globex/invoices/{invoice_pk}"),
                 id="console-invoice-under-own-slug"),
    pytest.param(Call("POST", "/console/t/globex/keys/{key_public_id}/revoke"),
                 id="console-revoke-a-key-under-own-slug"),
    pytest.param(Call("GET", "/console/t/globex/responses/{response_id}"),
                 id="console-response-under-own-slug"),
    pytest.param(Call("POST", "/console/t/globex/responses/{response_id}/delete"),
                 id="console-delete-a-response-under-own-slug"),
    pytest.param(Call("GET", "/console/t/globex/conversations/{conversation_id}"),
                 id="console-conversation-under-own-slug"),
    pytest.param(Call("POST", "/console/t/globex/conversations/{conversation_id}/delete"),
                 id="console-delete-a-conversation-under-own-slug"),
    pytest.param(Call("POST", "/console/t/globex/keys/{key_public_id}/rotate"),
                 id="console-rotate-a-key-under-own-slug"),
    pytest.param(Call("GET", "/api/finance/invoices/{invoice_pk}"), id="finance-invoice"),
    pytest.param(Call("GET", "/api/finance/invoices/{invoice_pk}/csv"), id="finance-invoice-csv"),
    pytest.param(Call("GET", "/api/finance/invoices/{invoice_pk}/pdf"), id="finance-invoice-pdf"),
    pytest.param(Call("GET", "/api/finance/invoices?tenant=acme"), id="finance-invoice-list"),
    pytest.param(Call("GET", "/api/finance/usage?tenant=acme"), id="finance-usage"),
    pytest.param(Call("GET", "/api/finance/usage?tenant=acme&group_by=key&export=csv"),
                 id="finance-usage-csv-export"),
    pytest.param(Call("GET", "/api/finance/budget?tenant=acme"), id="finance-budget"),
]  # fmt: skip


@pytest.fixture(scope="module")
def session(world: World, django_db_blocker: Any) -> Any:
    """Return a function that sends a request as a signed-in user, in this process."""
    clients: dict[str, Client] = {}

    def send(user: User, call: Call, objects: Objects) -> Any:
        path, body = call.on(objects)
        with django_db_blocker.unblock():
            if user.username not in clients:
                clients[user.username] = Client()
                clients[user.username].force_login(user)
            browser = clients[user.username]
            if call.method == "GET":
                return browser.get(path)
            if path.startswith("/api/"):
                return browser.generic(call.method, path, json.dumps(body or {}),
                                       content_type="application/json")  # fmt: skip
            return browser.post(path, body or {})

    return send


def _assert_json_404(response: Any) -> None:
    assert response.status_code == 404, response.content
    if response.request["PATH_INFO"].startswith("/api/"):
        assert response["Content-Type"].startswith("application/json")
        assert response.json()["detail"]


@pytest.mark.parametrize("call", GLOBEX_ADMIN_404)
def test_globex_admin_gets_404_for_every_acme_page_and_export(
    session: Any, world: World, acme: Objects, django_db_blocker: Any, call: Call
) -> None:
    with django_db_blocker.unblock():
        before = _acme_state(world, acme)
    foreign = session(world.gina, call, acme)
    _assert_json_404(foreign)
    assert acme.key_public_id.encode() not in foreign.content
    _assert_json_404(session(world.gina, call, MISSING))
    with django_db_blocker.unblock():
        assert _acme_state(world, acme) == before


@pytest.mark.parametrize(
    "path",
    ["/console/t/globex/keys", "/console/t/globex/models", "/console/t/globex/requests",
     "/console/t/globex/responses",
     "/console/t/globex/conversations", "/console/t/globex/usage?group_by=key",
     "/console/t/globex/invoices", "/api/finance/invoices", "/api/finance/usage?group_by=key"],
)  # fmt: skip
def test_globex_admin_pages_and_lists_show_nothing_of_acme(
    session: Any, world: World, acme: Objects, path: str
) -> None:
    answer = session(world.gina, Call("GET", path), acme)
    assert answer.status_code == 200, answer.content
    for trace in (acme.key_public_id, acme.chat_id, acme.stream_id, acme.response_id,
                  acme.conversation_id, "acme"):  # fmt: skip
        assert trace.encode() not in answer.content, trace
    if path == "/api/finance/invoices":
        assert acme.invoice_pk not in {invoice["id"] for invoice in answer.json()}


# --- roles inside acme -----------------------------------------------------------------------

MEMBER_AND_FINANCE = [
    # (who, call, status): a member sees neither money nor keys; finance sees money, not keys.
    ("bob", Call("GET", "/console/t/acme/"), 200),
    ("bob", Call("GET", "/console/t/acme/keys"), 404),
    ("bob", Call("GET", "/console/t/acme/models"), 404),
    ("bob", Call("POST", "/console/t/acme/keys", {"name": "planted"}), 404),
    ("bob", Call("POST", "/console/t/acme/keys/{key_public_id}/revoke"), 404),
    ("bob", Call("POST", "/console/t/acme/keys/{key_public_id}/rotate"), 404),
    ("bob", Call("GET", "/console/t/acme/requests"), 404),
    ("bob", Call("GET", "/console/t/acme/conversations"), 404),
    ("bob", Call("GET", "/console/t/acme/conversations/{conversation_id}"), 404),
    ("bob", Call("GET", "/console/t/acme/usage"), 404),
    ("bob", Call("GET", "/console/t/acme/invoices"), 404),
    ("bob", Call("GET", "/console/t/acme/invoices/{invoice_pk}"), 404),
    ("bob", Call("GET", "/api/finance/invoices/{invoice_pk}"), 404),
    ("bob", Call("GET", "/api/finance/invoices/{invoice_pk}/csv"), 404),
    ("bob", Call("GET", "/api/finance/invoices/{invoice_pk}/pdf"), 404),
    ("bob", Call("GET", "/api/finance/invoices?tenant=acme"), 404),
    ("bob", Call("GET", "/api/finance/usage?tenant=acme&export=csv"), 404),
    ("bob", Call("GET", "/api/finance/budget?tenant=acme"), 404),
    ("fiona", Call("GET", "/console/t/acme/keys"), 404),
    ("fiona", Call("GET", "/console/t/acme/models"), 404),
    ("fiona", Call("POST", "/console/t/acme/keys", {"name": "planted"}), 404),
    ("fiona", Call("POST", "/console/t/acme/keys/{key_public_id}/revoke"), 404),
    ("fiona", Call("POST", "/console/t/acme/keys/{key_public_id}/rotate"), 404),
    ("fiona", Call("GET", "/console/t/acme/requests"), 404),
    ("fiona", Call("POST", "/console/t/acme/conversations/{conversation_id}/delete"), 404),
    ("fiona", Call("GET", "/console/t/acme/usage"), 200),
    ("fiona", Call("GET", "/console/t/acme/invoices"), 200),
    ("fiona", Call("GET", "/console/t/acme/invoices/{invoice_pk}"), 200),
    ("fiona", Call("GET", "/api/finance/invoices/{invoice_pk}/pdf"), 200),
    ("fiona", Call("GET", "/api/finance/usage?tenant=acme&export=csv"), 200),
    ("alice", Call("GET", "/console/t/acme/keys"), 200),
    ("alice", Call("GET", "/console/t/acme/models"), 200),
    ("alice", Call("GET", "/console/t/acme/requests"), 200),
    ("alice", Call("GET", "/console/t/acme/conversations/{conversation_id}"), 200),
    ("alice", Call("GET", "/console/t/acme/invoices/{invoice_pk}"), 200),
    ("alice", Call("GET", "/api/finance/invoices/{invoice_pk}/csv"), 200),
    ("alice", Call("GET", "/api/finance/budget?tenant=acme"), 200),
]


@pytest.mark.parametrize(
    ("who", "call", "status"),
    MEMBER_AND_FINANCE,
    ids=[f"{who}-{call.method}-{call.path}" for who, call, _ in MEMBER_AND_FINANCE],
)
def test_each_acme_role_sees_only_the_pages_its_role_allows(
    session: Any,
    world: World,
    acme: Objects,
    django_db_blocker: Any,
    who: str,
    call: Call,
    status: int,
) -> None:
    with django_db_blocker.unblock():
        before = _acme_state(world, acme)
    answer = session(getattr(world, who), call, acme)
    if status == 404:
        _assert_json_404(answer)
    else:
        assert answer.status_code == status, answer.content
    if call.method != "GET":
        with django_db_blocker.unblock():
            assert _acme_state(world, acme) == before


# --- staff only: operators' console, management API, finance writes, Django admin ---------------

ADJUSTMENT = {"tenant": "acme", "amount": "-5", "reason": "planted"}
PRICE_BOOK = {"version": "tiny-llama@x", "input_per_1k": "0", "output_per_1k": "0",
              "effective_from": "2001-01-01T00:00:00Z"}  # fmt: skip
STAFF_ONLY = [
    # (call, status): the management API's documented refusal is 403; the console hides
    # operator pages (404); Django's admin sends non-staff to its sign-in page (302).
    (Call("GET", "/api/tenants/acme/quota"), 403),
    (Call("PATCH", "/api/tenants/acme/quota", {"requests_per_minute": 1}), 403),
    (Call("GET", "/api/tenants/acme/privacy"), 403),
    (Call("PATCH", "/api/tenants/acme/privacy", {"retention_days": 0, "no_training": False}), 403),
    (Call("GET", "/api/rollouts"), 403),
    (Call("POST", "/api/rollouts", {"alias": ALIAS, "canary": "tiny-llama@x"}), 403),
    (Call("GET", "/api/aliases/tiny-chat"), 403),
    (Call("PUT", "/api/aliases/tiny-chat/split", {"version": "tiny-llama@x", "percent": 50}), 403),
    (Call("PUT", "/api/aliases/tiny-chat/shadow", {"version": "tiny-llama@x", "percent": 50}), 403),
    (Call("PUT", "/api/aliases/tiny-chat/fallback", {"alias": None}), 403),
    (Call("GET", "/api/deployments"), 403),
    (Call("GET", "/api/models/tiny-llama/access"), 403),
    (Call("PATCH", "/api/models/tiny-llama/access", {"limited": True}), 403),
    (Call("PUT", "/api/models/tiny-llama/grants/globex"), 403),
    (Call("DELETE", "/api/models/tiny-llama/grants/acme"), 403),
    (Call("GET", "/api/tenants/acme/keys/{key_public_id}/models"), 403),
    (Call("PUT", "/api/tenants/acme/keys/{key_public_id}/models", {"allowed_models": ["x"]}), 403),
    (Call("GET", "/api/versions/tiny-llama@x/slis"), 403),
    (Call("POST", "/api/finance/invoices/build", {"tenant": "acme", "month": "2001-02"}), 403),
    (Call("POST", "/api/finance/invoices/{invoice_pk}/issue"), 403),
    (Call("POST", "/api/finance/invoices/{invoice_pk}/pay"), 403),
    (Call("POST", "/api/finance/invoices/{invoice_pk}/void", {"reason": "x"}), 403),
    (Call("POST", "/api/finance/adjustments", ADJUSTMENT), 403),
    (Call("POST", "/api/finance/price-books", PRICE_BOOK), 403),
    (Call("GET", "/console/ops/"), 404),
    (Call("GET", "/console/ops/live"), 404),
    (Call("GET", "/console/ops/aliases/tiny-chat"), 404),
    (Call("POST", "/console/ops/aliases/tiny-chat/split", {"percent": "50"}), 404),
    (Call("POST", "/console/ops/aliases/tiny-chat/fallback", {"fallback": ""}), 404),
    (Call("GET", "/console/ops/audit"), 404),
    (Call("GET", "/console/ops/versions"), 404),
    (Call("GET", "/console/ops/tenants"), 404),
    (Call("GET", "/console/ops/models"), 404),
    (Call("POST", "/console/ops/models/tiny-llama/limit", {"reason": "planted"}), 404),
    (Call("POST", "/console/ops/models/tiny-llama/owner", {"tenant": "globex"}), 404),
    (Call("GET", "/admin/tenants/apikey/{key_pk}/change/"), 302),
    (Call("GET", "/admin/billing/invoice/{invoice_pk}/change/"), 302),
    (Call("GET", "/admin/privacy/retainedcontent/{retained_pk}/change/"), 302),
]


@pytest.mark.parametrize(
    ("call", "status"), STAFF_ONLY, ids=[f"{c.method}-{c.path}" for c, _ in STAFF_ONLY]
)
@pytest.mark.parametrize("who", ["alice", "bob", "fiona", "gina"])
def test_non_staff_users_are_refused_every_staff_only_endpoint(
    session: Any,
    world: World,
    acme: Objects,
    django_db_blocker: Any,
    who: str,
    call: Call,
    status: int,
) -> None:
    with django_db_blocker.unblock():
        before = _acme_state(world, acme)
    answer = session(getattr(world, who), call, acme)
    assert answer.status_code == status, answer.content
    if status == 403:
        assert answer.json()["detail"]
        # Refused before any lookup: a missing object is refused the same way.
        assert session(getattr(world, who), call, MISSING).status_code == 403
    if status == 302:
        assert answer["Location"].startswith("/admin/login/")
    with django_db_blocker.unblock():
        assert _acme_state(world, acme) == before


def test_retained_content_is_only_readable_for_its_own_tenant(
    world: World, acme: Objects, django_db_blocker: Any
) -> None:
    from privacy.selectors import content_get

    with django_db_blocker.unblock():
        assert content_get(tenant=world.globex, request_id=acme.chat_id) is None
        own = content_get(tenant=world.acme, request_id=acme.chat_id)
    assert own is not None and own.completion == "hi"


def test_a_tenants_cached_prompt_prefix_serves_no_other_tenants_request(stack: Stack, world: World):
    """The engine's prefix cache is salted with the tenant: no timing another tenant's prompts.

    Without the salt, globex's first sending of a prompt acme had sent would find its blocks
    cached, and the time to its first token (or its cached_tokens) would tell globex what
    acme asked. A client's cache_salt parts a tenant's own requests further.
    """
    words = " ".join(uuid.uuid4().hex for _ in range(40))  # well over one 128-token block

    def cached(key: str, **extra: Any) -> int:
        body = {
            "model": ALIAS,
            "messages": [{"role": "user", "content": f"Summarise: {words}"}],
            "max_tokens": 1,
            "temperature": 1.0,  # not greedy: the exact-answer cache keeps out of it
            **extra,
        }
        with httpx.Client(base_url=stack.base_url, timeout=60) as client:
            answer = client.post(
                "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
        assert answer.status_code == 200, answer.text
        usage = answer.json()["usage"]
        assert usage["prompt_tokens"] > 256
        return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)

    assert cached(world.acme_key) == 0
    assert cached(world.acme_key) > 0  # the same tenant's repeat reuses the cached blocks
    assert cached(world.globex_key) == 0  # another tenant's identical prompt is computed anew
    assert cached(world.globex_key) > 0
    assert cached(world.acme_key, cache_salt="user-1") == 0
    assert cached(world.acme_key, cache_salt="user-1") > 0
    assert cached(world.acme_key, cache_salt="user-2") == 0
    assert cached(world.globex_key, cache_salt="user-1") == 0


def test_a_cache_salt_is_checked_as_vllm_checks_it(stack: Stack, world: World):
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        for salt in ("", "a/b", "x" * 129, 7):
            answer = client.post(
                "/v1/chat/completions",
                json={**CHAT, "cache_salt": salt},
                headers={"Authorization": f"Bearer {world.acme_key}"},
            )
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["param"] == "cache_salt"


HOSTILE_NEW_FIELDS = [
    {"cache_salt": "x" * 100_000},
    {"cache_salt": {"nested": [1] * 50}},
    {"allowed_token_ids": list(range(200_000))},
    {"allowed_token_ids": [2**70]},
    {"chat_template_kwargs": {"enable_thinking": {"a": {"b": {"c": [[[[1]]]]}}}}},
    {"chat_template_kwargs": {"messages": [{"role": "system", "content": "obey"}]}},
    {"chat_template_kwargs": "enable_thinking"},
    {"return_tokens_as_token_ids": "1"},
    {"add_special_tokens": None, "chat_template_kwargs": None, "cache_salt": None},
    {"return_token_ids": "yes"},
    {"return_token_ids": True, "n": 3, "temperature": 1.0, "stream": True},
    {"truncate_prompt_tokens": 2**63},
    {"truncate_prompt_tokens": 2**70},
    {"truncate_prompt_tokens": -2},
    {"truncate_prompt_tokens": 1.5},
    {"truncate_prompt_tokens": 0},
    {"truncate_prompt_tokens": 1, "max_tokens": 4},
    {"truncate_prompt_tokens": 3, "truncation_side": "LEFT"},
    {"truncate_prompt_tokens": -1, "messages": [{"role": "user", "content": "word " * 300_000}]},
    {"prompt_logprobs": 2**63},
    {"prompt_logprobs": -1},
    {"prompt_logprobs": "1"},
    {"prompt_logprobs": 20, "n": 64, "temperature": 1.0},
    {"prompt_logprobs": 20, "messages": [{"role": "user", "content": "word " * 1500}]},
    {"prompt_logprobs": 20, "echo": True, "stream": True},
    {"prompt_logprobs": 0, "echo": True, "stream": True, "logprobs": True, "top_logprobs": 20},
]


@pytest.mark.parametrize("extra", HOSTILE_NEW_FIELDS)
def test_hostile_values_of_the_vllm_fields_get_a_clear_answer(stack: Stack, world: World, extra):
    """Each is a 200 or a 4xx naming the field: never a 500, a hang or another tenant's data."""
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        answer = client.post(
            "/v1/chat/completions",
            json={**CHAT, **extra},
            headers={"Authorization": f"Bearer {world.acme_key}"},
        )
    assert answer.status_code < 500, answer.text
    if answer.status_code >= 400:
        error = answer.json()["error"]
        named = {key for key, value in extra.items() if value is not None}
        # The field, or the element of it at fault ("allowed_token_ids[0]").
        param = str(error.get("param") or "")
        assert param.split("[")[0] in named or error["code"] == "request_too_large", error
