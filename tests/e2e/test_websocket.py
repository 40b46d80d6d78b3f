"""Streaming over `/v1/ws`: in-process with Channels' communicator, and over the real server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets
from asgiref.testing import ApplicationCommunicator
from channels.routing import URLRouter

from inference.routing import websocket_urlpatterns
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
