"""Streaming over `/v1/ws`: in-process with Channels' communicator, and over the real server."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import httpx
import pytest
import websockets
from asgiref.testing import ApplicationCommunicator
from channels.routing import URLRouter
from django.conf import settings

from billing.models import UsageRecord
from inference.urls import websocket_urlpatterns
from tenants.models import ApiKey, Tenant
from tenants.services import api_key_issue, api_key_revoke, quota_update, tenant_create
from tests.conftest import ALIAS


def _ws_url(stack: Any) -> str:
    return stack.base_url.replace("http://", "ws://") + "/v1/ws"


def _request(client_id: str, *, max_tokens: int = 8, **body: Any) -> str:
    return json.dumps(
        {
            "type": "request",
            "id": client_id,
            "endpoint": "completions",
            "body": {"model": ALIAS, "prompt": "The yard", "max_tokens": max_tokens, **body},
        }
    )


def _ended(messages: list[dict[str, Any]]) -> bool:
    return bool(messages) and messages[-1]["type"] in ("finished", "error")


async def _until_end(
    socket: Any, ids: set[str], seen: dict[str, list[dict[str, Any]]] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Collect messages until every id in ids has finished or failed (`seen`: what was read
    already, an end among it included)."""
    seen = seen if seen is not None else {}
    for i in ids:
        seen.setdefault(i, [])
    open_ids = {i for i in ids if not _ended(seen[i])}
    while open_ids:
        message = json.loads(await asyncio.wait_for(socket.recv(), 60))
        seen[message["id"]].append(message)
        if message["type"] in ("finished", "error"):
            open_ids.discard(message["id"])
    return seen


def _communicator(token: str) -> ApplicationCommunicator:
    """The consumer in-process, driven over ASGI messages (what Channels' WebsocketCommunicator
    does; importing that one needs daphne, which this project does not run)."""
    scope = {
        "type": "websocket",
        "path": "/v1/ws",
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {token}".encode())],
        "subprotocols": [],
    }
    return ApplicationCommunicator(URLRouter(websocket_urlpatterns), scope)


async def test_the_communicator_refuses_a_bad_key_before_accepting(stack, django_db_blocker):
    with django_db_blocker.unblock():
        communicator = _communicator("sy-notakey-at-all")
        await communicator.send_input({"type": "websocket.connect"})
        answer = await communicator.receive_output(timeout=10)
    assert answer == {"type": "websocket.close", "code": 4401, "reason": ""} or (
        answer["type"] == "websocket.close" and answer["code"] == 4401
    )


async def test_the_communicator_streams_a_request(stack, world, django_db_blocker):
    with django_db_blocker.unblock():
        communicator = _communicator(world.acme_key)
        await communicator.send_input({"type": "websocket.connect"})
        assert (await communicator.receive_output(timeout=10))["type"] == "websocket.accept"
        await communicator.send_input(
            {"type": "websocket.receive", "text": _request("one", max_tokens=5, ignore_eos=True)}
        )
        kinds: list[str] = []
        text = ""
        while not kinds or kinds[-1] not in ("finished", "error"):
            output = await communicator.receive_output(timeout=60)
            message = json.loads(output["text"])
            assert message["id"] == "one"
            kinds.append(message["type"])
            text += message.get("text", "")
        await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
        await communicator.wait(timeout=10)
    assert kinds[0] == "started" and kinds[-1] == "finished" and text


async def test_a_bad_key_is_refused_by_the_server(stack):
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(
            _ws_url(stack), additional_headers={"Authorization": "Bearer sy-wrong"}
        ):
            pass
    assert refused.value.response.status_code == 403


async def test_interleaved_requests_and_a_browser_style_key(stack, world):
    protocol = f"roundhouse.key.{world.acme_key}"
    async with websockets.connect(_ws_url(stack), subprotocols=[protocol]) as socket:  # type: ignore[list-item]
        assert socket.subprotocol == protocol
        for client_id in ("a", "b", "c"):
            await socket.send(_request(client_id, max_tokens=6, ignore_eos=True, user=client_id))
        seen = await _until_end(socket, {"a", "b", "c"})
    for messages in seen.values():
        kinds = [m["type"] for m in messages]
        assert kinds[0] == "started" and kinds[-1] == "finished", kinds
        assert sum(m.get("tokens", 0) for m in messages if m["type"] == "delta") == 6
        assert messages[-1]["usage"]["completion_tokens"] == 6


async def test_bad_messages_get_errors_naming_the_field(stack, world):
    headers = {"Authorization": f"Bearer {world.acme_key}"}
    async with websockets.connect(_ws_url(stack), additional_headers=headers) as socket:
        await socket.send("not json")
        assert json.loads(await socket.recv())["error"]["code"] == "invalid_json"
        await socket.send(json.dumps({"type": "request", "id": "x", "body": {"model": ALIAS}}))
        error = json.loads(await socket.recv())
        assert error["id"] == "x" and error["error"]["param"] == "messages"
        await socket.send(_request("y", max_tokens=10_000_000))
        error = json.loads(await socket.recv())
        assert error["id"] == "y" and error["error"]["param"] == "max_tokens"


async def test_cancel_aborts_one_request_and_closing_aborts_the_rest(stack, world, usage_of):
    # Globex: no per-request token limit below the context, so "stop" can ask for 1,000.
    headers = {"Authorization": f"Bearer {world.globex_key}"}
    async with websockets.connect(_ws_url(stack), additional_headers=headers) as socket:
        await socket.send(_request("keep", max_tokens=6, ignore_eos=True))
        # Long enough that the cancel lands first on a busy machine (180 tokens once finished
        # before it).
        await socket.send(_request("stop", max_tokens=1000, ignore_eos=True))
        started: dict[str, str] = {}
        # On a busy worker "keep" may end before "stop" starts: its end is kept, not dropped.
        seen: dict[str, list[dict[str, Any]]] = {"keep": [], "stop": []}
        while "stop" not in started or "keep" not in started:
            message = json.loads(await asyncio.wait_for(socket.recv(), 60))
            seen[message["id"]].append(message)
            if message["type"] == "started":
                started[message["id"]] = message["request_id"]
        await socket.send(json.dumps({"type": "cancel", "id": "stop"}))
        seen = await _until_end(socket, {"stop", "keep"}, seen)
        assert seen["keep"][-1]["type"] == "finished"
        assert seen["stop"][-1]["error"]["code"] == "cancelled"
        # Abrupt close: a long request left running is aborted in the engine and billed.
        await socket.send(_request("orphan", max_tokens=180, ignore_eos=True))
        while True:
            message = json.loads(await asyncio.wait_for(socket.recv(), 60))
            if message["type"] == "delta" and message["id"] == "orphan":
                orphan = message
                break
            if message["type"] == "started" and message["id"] == "orphan":
                started["orphan"] = message["request_id"]
    del orphan
    found = await asyncio.to_thread(usage_of, started["stop"], started["orphan"], started["keep"])
    records = {r.request_id: r for r in found}
    assert records[started["keep"]].status == "ok"
    for name, asked in (("stop", 1000), ("orphan", 180)):
        record = records[started[name]]
        assert record.status == "cancelled" and record.completion_tokens < asked


async def test_websocket_requests_carry_the_sockets_trace_or_their_own(stack, world, usage_of):
    socket_trace = "5c3a9e0d6b1f4a27b8e2d4c6f1a3b5d7"
    own_trace = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
    headers = {
        "Authorization": f"Bearer {world.acme_key}",
        "traceparent": f"00-{socket_trace}-1111111111111111-01",
    }
    async with websockets.connect(_ws_url(stack), additional_headers=headers) as socket:
        own = json.loads(_request("own"))
        own["traceparent"] = f"00-{own_trace}-2222222222222222-01"
        await socket.send(_request("inherits"))
        await socket.send(json.dumps(own))
        seen = await _until_end(socket, {"inherits", "own"})
    ids = {key: next(m["request_id"] for m in seen[key] if m["type"] == "started") for key in seen}
    found = await asyncio.to_thread(usage_of, ids["inherits"], ids["own"])
    traces = {r.request_id: r.trace_id for r in found}
    assert traces == {ids["inherits"]: socket_trace, ids["own"]: own_trace}


async def test_a_request_cancelled_at_once_ends_with_one_cancelled_event(stack, world):
    headers = {"Authorization": f"Bearer {world.acme_key}"}
    async with websockets.connect(_ws_url(stack), additional_headers=headers) as socket:
        # The cancel lands while the request is still being admitted, or just after.
        await socket.send(_request("quick", max_tokens=200, ignore_eos=True))
        await socket.send(json.dumps({"type": "cancel", "id": "quick"}))
        await socket.send(_request("after"))
        seen = await _until_end(socket, {"quick", "after"})
    ends = [m for m in seen["quick"] if m["type"] in ("finished", "error")]
    assert len(ends) == 1 and ends[0]["type"] == "error"
    assert ends[0]["error"]["code"] == "cancelled"
    assert seen["after"][-1]["type"] == "finished"


async def test_token_ids_ride_on_the_deltas_when_asked_for(stack, world):
    protocol = f"roundhouse.key.{world.acme_key}"
    async with websockets.connect(_ws_url(stack), subprotocols=[protocol]) as socket:  # type: ignore[list-item]
        await socket.send(_request("ids", max_tokens=6, ignore_eos=True, return_token_ids=True))
        await socket.send(_request("plain", max_tokens=6, ignore_eos=True))
        two = {"prompt": ["Trains run", "The yard"], "return_token_ids": True}
        await socket.send(_request("two", max_tokens=2, ignore_eos=True, **two))
        seen = await _until_end(socket, {"ids", "plain", "two"})
    deltas = [m for m in seen["ids"] if m["type"] == "delta"]
    assert len([t for m in deltas for t in m["token_ids"]]) == 6
    assert all(len(m["token_ids"]) == m["tokens"] for m in deltas)
    assert not any("token_ids" in m for m in seen["plain"])
    # The prompts' ids come with the start, one list per prompt, as the engine got them.
    started = {key: seen[key][0] for key in seen}
    [prompt] = started["ids"]["prompt_token_ids"]
    finished = seen["ids"][-1]
    assert len(prompt) == finished["usage"]["prompt_tokens"] and prompt[0] == 0  # BOS
    first, second = started["two"]["prompt_token_ids"]
    assert second == prompt and first != prompt and first[0] == 0
    assert "prompt_token_ids" not in started["plain"]


async def test_the_end_names_the_stop_token_that_ended_a_choice(stack, world):
    protocol = f"roundhouse.key.{world.acme_key}"
    async with websockets.connect(_ws_url(stack), subprotocols=[protocol]) as socket:  # type: ignore[list-item]
        # The only token it may write is also a stop token: the first one ends it.
        await socket.send(_request("stopped", allowed_token_ids=[300], stop_token_ids=[300]))
        await socket.send(_request("cut", max_tokens=2, ignore_eos=True))
        seen = await _until_end(socket, {"stopped", "cut"})
    stopped, cut = seen["stopped"][-1], seen["cut"][-1]
    assert (stopped["finish_reason"], stopped["stop_reasons"]) == ("stop", [300])
    assert cut["finish_reason"] == "length" and "stop_reasons" not in cut


async def test_the_rendered_chat_template_comes_with_the_start_when_asked_for(stack, world):
    protocol = f"roundhouse.key.{world.acme_key}"
    body = {"model": ALIAS, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    async with websockets.connect(_ws_url(stack), subprotocols=[protocol]) as socket:  # type: ignore[list-item]
        for client_id, extra in (("text", {"return_prompt_text": True}), ("plain", {})):
            message = {"type": "request", "id": client_id, "endpoint": "chat.completions"}
            await socket.send(json.dumps({**message, "body": {**body, **extra}}))
        seen = await _until_end(socket, {"text", "plain"})
    rendered = seen["text"][0]["prompt_text"]
    assert seen["text"][0]["type"] == "started" and "Hi" in rendered
    assert "prompt_text" not in seen["plain"][0]


# An open socket is held to its key as it stands now, and every frame counts.


@dataclass(frozen=True)
class Tenancy:
    """A tenant of a test's own (its limits and its key are the test's to change)."""

    tenant: Tenant
    key: ApiKey
    token: str

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


async def _tenancy(blocker: Any, slug: str, **quota: Any) -> Tenancy:
    def create() -> Tenancy:
        with blocker.unblock():
            tenant = tenant_create(slug=slug)
            roomy = {"requests_per_minute": 100_000, "tokens_per_minute": 10_000_000}
            quota_update(tenant=tenant, changes={**roomy, "max_concurrency": 100, **quota})
            issued = api_key_issue(tenant=tenant, name="tests")
        return Tenancy(tenant=tenant, key=issued.key, token=issued.token)

    return await asyncio.to_thread(create)


@pytest.fixture
def control(django_db_blocker: Any) -> Any:
    """Run a control-plane change (a service call) from an async test, as an operator would."""

    async def run(change: Any, /, **kwargs: Any) -> Any:
        def unblocked() -> Any:
            with django_db_blocker.unblock():
                return change(**kwargs)

        return await asyncio.to_thread(unblocked)

    return run


def _tenant_disable(*, tenant: Tenant) -> None:
    tenant.is_active = False
    tenant.save(update_fields=["is_active"])


async def _closing(socket: Any) -> tuple[list[dict[str, Any]], int, str]:
    """Read until the server closes the socket; return what it sent, its close code and reason."""
    messages: list[dict[str, Any]] = []
    try:
        while True:
            messages.append(json.loads(await asyncio.wait_for(socket.recv(), 60)))
    except websockets.ConnectionClosed as closed:
        assert closed.rcvd is not None, "the client's side closed, not the server's"
        return messages, closed.rcvd.code, closed.rcvd.reason


async def _http_error(stack: Any, tenancy: Tenancy, body: dict[str, Any], code: str) -> Any:
    """POST a completion until this frontend refuses it with `code` (the change has reached
    it); return the error."""
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as client:
        for _ in range(300):
            answer = await client.post("/v1/completions", json=body, headers=tenancy.headers())
            if answer.status_code >= 400 and answer.json()["error"]["code"] == code:
                return answer.json()["error"]
            await asyncio.sleep(0.1)
    raise AssertionError(f"HTTP never answered {code}")


async def test_revoking_a_key_ends_its_sockets_requests_and_closes_them(
    stack, control, usage_of, django_db_blocker
):
    own = await _tenancy(django_db_blocker, "ws-revoked")
    headers = own.headers()
    async with (
        websockets.connect(_ws_url(stack), additional_headers=headers) as busy,
        websockets.connect(_ws_url(stack), additional_headers=headers) as idle,
    ):
        await busy.send(_request("long", max_tokens=1000, ignore_eos=True))
        seen: dict[str, list[dict[str, Any]]] = {"long": []}
        while not any(m["type"] == "delta" for m in seen["long"]):
            seen["long"].append(json.loads(await asyncio.wait_for(busy.recv(), 60)))
        request_id = seen["long"][0]["request_id"]
        await control(api_key_revoke, key=own.key)
        # The running request ends with the reason, then the socket closes as at connect.
        messages, code, reason = await _closing(busy)
        assert [m["type"] for m in messages][-1:] == ["error"], messages[-3:]
        assert messages[-1]["id"] == "long"
        assert messages[-1]["error"]["code"] == "revoked_api_key"
        assert (code, reason) == (4401, "revoked_api_key")
        # A socket that sends nothing is closed too.
        _, code, reason = await _closing(idle)
        assert (code, reason) == (4401, "revoked_api_key")
    [record] = await asyncio.to_thread(usage_of, request_id)
    assert record.status == "cancelled" and 0 < record.completion_tokens < 1000
    billed = await control(UsageRecord.objects.filter(tenant=own.tenant).count)
    assert billed == 1


async def test_a_frame_sent_after_its_key_is_revoked_runs_nothing(
    stack, control, django_db_blocker
):
    own = await _tenancy(django_db_blocker, "ws-revoked-frame")
    async with websockets.connect(_ws_url(stack), additional_headers=own.headers()) as socket:
        await socket.send(_request("before", max_tokens=2))
        assert (await _until_end(socket, {"before"}))["before"][-1]["type"] == "finished"
        await control(api_key_revoke, key=own.key)
        await _http_error(stack, own, {"model": ALIAS, "prompt": "x"}, "revoked_api_key")
        with contextlib.suppress(websockets.ConnectionClosed):  # the check may close it first
            await socket.send(_request("after", max_tokens=2))
        messages, code, reason = await _closing(socket)
    # The frame got HTTP's answer, unless the periodic check closed the socket first.
    assert all(m["type"] == "error" for m in messages), messages
    assert all(m["error"]["code"] == "revoked_api_key" for m in messages), messages
    assert (code, reason) == (4401, "revoked_api_key")


async def test_disabling_a_tenant_closes_its_sockets(stack, control, django_db_blocker):
    own = await _tenancy(django_db_blocker, "ws-disabled")
    headers = own.headers()
    async with (
        websockets.connect(_ws_url(stack), additional_headers=headers) as sending,
        websockets.connect(_ws_url(stack), additional_headers=headers) as idle,
    ):
        await control(_tenant_disable, tenant=own.tenant)
        await _http_error(stack, own, {"model": ALIAS, "prompt": "x"}, "tenant_disabled")
        with contextlib.suppress(websockets.ConnectionClosed):  # the check may close it first
            await sending.send(_request("after", max_tokens=2))
        messages, code, reason = await _closing(sending)
        assert all(m["error"]["code"] == "tenant_disabled" for m in messages), messages
        assert (code, reason) == (4403, "tenant_disabled")
        _, code, reason = await _closing(idle)
        assert (code, reason) == (4403, "tenant_disabled")


async def test_a_key_that_expires_while_its_socket_is_open_closes_it(stack, control):
    tenant = await control(tenant_create, slug="ws-expiring")
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)
    issued = await control(api_key_issue, tenant=tenant, name="tests", expires_at=soon)
    headers = {"Authorization": f"Bearer {issued.token}"}
    async with websockets.connect(_ws_url(stack), additional_headers=headers) as socket:
        _, code, reason = await _closing(socket)
    assert (code, reason) == (4401, "expired_api_key")


async def test_a_quota_cut_reaches_an_open_socket_as_it_reaches_http(
    stack, control, django_db_blocker
):
    own = await _tenancy(django_db_blocker, "ws-quota-cut", max_tokens_per_request=100)
    body = {"model": ALIAS, "prompt": "The yard", "max_tokens": 8}
    async with websockets.connect(_ws_url(stack), additional_headers=own.headers()) as socket:
        await socket.send(_request("before", max_tokens=8))
        assert (await _until_end(socket, {"before"}))["before"][-1]["type"] == "finished"
        await control(quota_update, tenant=own.tenant, changes={"max_tokens_per_request": 4})
        refused = await _http_error(stack, own, body, "max_tokens_exceeded")
        await socket.send(_request("cut", max_tokens=8))
        [error] = (await _until_end(socket, {"cut"}))["cut"]
        assert error["error"] == refused  # the same status, code, field and message
        await control(quota_update, tenant=own.tenant, changes={"monthly_budget": Decimal("0")})
        broke = await _http_error(stack, own, {**body, "max_tokens": 4}, "budget_exceeded")
        await socket.send(_request("broke", max_tokens=4))
        [error] = (await _until_end(socket, {"broke"}))["broke"]
        assert error["error"] == broke


async def test_every_frame_counts_against_the_tenants_requests_per_minute(stack, django_db_blocker):
    own = await _tenancy(django_db_blocker, "ws-counted", requests_per_minute=4)
    async with websockets.connect(_ws_url(stack), additional_headers=own.headers()) as socket:
        # Four frames that run nothing: a cancel of nothing, two that fail before admission.
        await socket.send(json.dumps({"type": "cancel", "id": "nothing"}))
        await socket.send("not json")
        await socket.send(json.dumps({"type": "request", "id": "bad", "body": {"model": ALIAS}}))
        await socket.send(json.dumps({"type": "cancel", "id": "nothing"}))
        await socket.send(_request("over"))
        answers = [json.loads(await asyncio.wait_for(socket.recv(), 60)) for _ in range(3)]
    assert [a["error"]["code"] for a in answers] == [
        "invalid_json",
        "missing_required_parameter",
        "rate_limit_exceeded",
    ], answers
    # Refused before it was read: it names the frame it answers, and when to retry.
    assert answers[2]["id"] is None and answers[2]["frame"] == 5
    assert answers[2]["retry_after_ms"] > 0
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as client:
        body = {"model": ALIAS, "prompt": "x", "max_tokens": 1}
        answer = await client.post("/v1/completions", json=body, headers=own.headers())
    assert answer.status_code == 429 and answer.json()["error"]["code"] == "rate_limit_exceeded"


async def test_a_frame_over_the_limit_closes_the_socket_with_1009(stack, world):
    limit = settings.ROUNDHOUSE_WS_MAX_FRAME_BYTES
    headers = {"Authorization": f"Bearer {world.acme_key}"}
    async with websockets.connect(_ws_url(stack), additional_headers=headers) as socket:
        # A frame of exactly the limit is read (its prompt is then too long for the model).
        frame = _request("full", prompt="")
        await socket.send(
            frame.replace('"prompt": ""', '"prompt": "' + "a" * (limit - len(frame)) + '"')
        )
        [answer] = (await _until_end(socket, {"full"}))["full"]
        assert answer["type"] == "error" and answer["error"]["param"] == "prompt"
        await socket.send("a" * (limit + 1))
        messages, code, reason = await _closing(socket)
    assert messages == [] and (code, reason) == (1009, "frame_too_large")
