"""Idempotency-Key over real HTTP: replay, attach, conflict, mismatch, and per-tenant keys."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
import uuid
from typing import cast

import httpx
import msgspec
import pytest

from dataplane.frontdoor import FrontDoor, Refusal, Refused
from dataplane.redis_client import redis_client_new, redis_sync_client
from inference.body.fields import COMPLETIONS
from inference.pipeline.idempotency import Idempotency, Original, body_digest, record_key
from tests.conftest import ALIAS
from tests.jobs import job_new


@pytest.fixture
def client(stack):
    with httpx.Client(base_url=stack.base_url, timeout=120) as c:
        yield c


def _headers(key: str, idempotency_key: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Idempotency-Key": idempotency_key, **extra}


def _long(**fields):
    return {"model": ALIAS, "prompt": "Once", "max_tokens": 600, "ignore_eos": True, **fields}


def test_a_retry_gets_the_stored_response_and_is_billed_once(client, world, usage_of):
    key = f"order-{uuid.uuid4()}"
    body = {"model": ALIAS, "prompt": "Tell me a story", "max_tokens": 12, "seed": 7}
    first = client.post("/v1/completions", json=body, headers=_headers(world.acme_key, key))
    assert first.status_code == 200, first.text
    # The same request again, with its keys in another order: the same bytes come back.
    reordered = dict(reversed(list(body.items())))
    again = client.post("/v1/completions", json=reordered, headers=_headers(world.acme_key, key))
    assert again.status_code == 200
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["x-request-id"] == first.headers["x-request-id"]
    assert "Idempotent-Replayed" not in first.headers
    assert len(usage_of(first.headers["x-request-id"])) == 1


def test_the_same_key_with_a_different_body_is_refused(client, world):
    key = f"order-{uuid.uuid4()}"
    body = {"model": ALIAS, "prompt": "a", "max_tokens": 2}
    assert client.post(
        "/v1/completions", json=body, headers=_headers(world.acme_key, key)
    ).is_success
    other = client.post(
        "/v1/completions", json={**body, "max_tokens": 3}, headers=_headers(world.acme_key, key)
    )
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert other.json()["error"]["param"] == "Idempotency-Key"


def test_keys_belong_to_one_tenant(client, world):
    key = f"shared-{uuid.uuid4()}"
    one = client.post(
        "/v1/completions",
        json={"model": ALIAS, "prompt": "a", "max_tokens": 2},
        headers=_headers(world.acme_key, key),
    )
    other = client.post(
        "/v1/completions",
        json={"model": ALIAS, "prompt": "b", "max_tokens": 3},
        headers=_headers(world.globex_key, key),
    )
    assert one.status_code == 200 and other.status_code == 200
    assert "Idempotent-Replayed" not in other.headers


def test_a_retry_while_the_original_runs_is_a_conflict(stack, world):
    key = f"slow-{uuid.uuid4()}"
    with (
        httpx.Client(base_url=stack.base_url, timeout=120) as a,
        httpx.Client(base_url=stack.base_url, timeout=120) as b,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        body = _long(max_tokens=1000)
        original = pool.submit(
            a.post, "/v1/completions", json=body, headers=_headers(world.globex_key, key)
        )
        # Retry only once the original owns the key and is queued, or the retry would own it.
        _wait_until_bound(world.globex.pk, key)
        conflict = b.post("/v1/completions", json=body, headers=_headers(world.globex_key, key))
        assert not original.done(), "the original finished before the retry"
        assert conflict.status_code == 409, conflict.text
        assert conflict.json()["error"]["code"] == "idempotency_key_in_use"
        assert int(conflict.headers["Retry-After"]) >= 1
        assert original.result().status_code == 200
        replay = b.post("/v1/completions", json=body, headers=_headers(world.globex_key, key))
        assert replay.content == original.result().content


def _wait_until_bound(tenant_id: int, key: str) -> None:
    client = redis_sync_client()
    record = record_key(tenant_id, key)
    deadline = time.monotonic() + 30
    while not client.hexists(record, "rid"):
        assert time.monotonic() < deadline, "the original never claimed its key"
        time.sleep(0.01)


def _stream_text(response: httpx.Response) -> tuple[str, str]:
    text: list[str] = []
    ident = ""
    for line in response.iter_lines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            ident = chunk["id"]
            text.extend(choice["text"] for choice in chunk["choices"])
    return ident, "".join(text)


def test_a_streaming_retry_attaches_to_the_same_stream(stack, world, usage_of):
    key = f"stream-{uuid.uuid4()}"
    body = _long(stream=True, max_tokens=300)

    def stream() -> tuple[str, str]:
        with (
            httpx.Client(base_url=stack.base_url, timeout=120) as c,
            c.stream(
                "POST", "/v1/completions", json=body, headers=_headers(world.globex_key, key)
            ) as response,
        ):
            assert response.status_code == 200
            return _stream_text(response)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(stream)
        time.sleep(0.3)
        second = pool.submit(stream)
        (id_one, text_one), (id_two, text_two) = first.result(), second.result()
    assert id_one == id_two and text_one == text_two and text_one
    assert len(usage_of(id_one.removeprefix("cmpl-"))) == 1
    # After it ended, a retry replays the whole stream.
    assert stream() == (id_one, text_one)


@pytest.mark.parametrize(
    "path, fields",
    [
        # Several token-id prompts, two choices each, echoed: each choice lists its prompt's
        # ids and opens with its prompt's text, as the tokenizer writes it.
        ("/v1/completions", {"prompt": [[72, 101, 108], [87, 111]], "echo": True, "n": 2}),
        ("/v1/completions", {"prompt": "def main():", "return_token_ids": True, "n": 2}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "return_token_ids": True},
        ),
        # The rendered template: a replay renders it again with the version that answered.
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "return_prompt_text": True},
        ),
    ],
    ids=["echoed-token-prompts", "completions-token-ids", "chat-token-ids", "chat-prompt-text"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_replay_lists_the_prompts_token_ids_and_echo_as_the_original_did(
    client, world, path, fields, stream
):
    key = f"ids-{uuid.uuid4()}"
    body = {"model": ALIAS, "max_tokens": 4, "seed": 3, "stream": stream, **fields}
    first = client.post(path, json=body, headers=_headers(world.acme_key, key))
    assert first.status_code == 200, first.text
    again = client.post(path, json=body, headers=_headers(world.acme_key, key))
    assert again.headers["Idempotent-Replayed"] == "true"
    if stream:
        # Entries the original got one by one a replay may read at once, merged: compare what
        # each choice's chunks add up to.
        assert _choices_streamed(again.text) == _choices_streamed(first.text)
        wanted = "prompt_text" if fields.get("return_prompt_text") else "prompt_token_ids"
        assert all(c[wanted] for c in _choices_streamed(first.text).values())
    else:
        assert again.json() == first.json()
        assert ("prompt_token_ids" in first.text) == bool(fields.get("return_token_ids"))
        assert ("prompt_text" in first.text) == bool(fields.get("return_prompt_text"))


def _choices_streamed(text: str) -> dict[int, dict]:
    """Each choice of an SSE answer: its text, token ids and prompt's ids, chunks joined."""
    choices: dict[int, dict] = {}
    for line in text.splitlines():
        if not line.startswith("data: {"):
            continue
        chunk = json.loads(line[6:])
        for choice in chunk["choices"]:
            kept = choices.setdefault(
                choice["index"],
                {"text": "", "token_ids": [], "prompt_token_ids": None, "prompt_text": None},
            )
            kept["text"] += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            kept["token_ids"] += choice.get("token_ids") or []
            prompt = choice.get("prompt_token_ids") or chunk.get("prompt_token_ids")
            kept["prompt_token_ids"] = kept["prompt_token_ids"] or prompt
            kept["prompt_text"] = kept["prompt_text"] or chunk.get("prompt_text")
            if choice.get("finish_reason"):
                kept["finish_reason"] = choice["finish_reason"]
    return choices


def test_a_failed_request_frees_its_key_for_a_retry(client, world):
    key = f"flaky-{uuid.uuid4()}"
    body = {"model": ALIAS, "prompt": "Once", "max_tokens": 200, "ignore_eos": True}
    failed = client.post(
        "/v1/completions",
        json=body,
        headers=_headers(world.globex_key, key, **{"x-request-timeout": "0.05"}),
    )
    assert failed.status_code == 503
    time.sleep(0.2)  # the key is released off the response path
    retried = client.post("/v1/completions", json=body, headers=_headers(world.globex_key, key))
    assert retried.status_code == 200, retried.text
    assert "Idempotent-Replayed" not in retried.headers


def test_a_malformed_key_is_refused(client, world):
    response = client.post(
        "/v1/completions",
        json={"model": ALIAS, "prompt": "a", "max_tokens": 2},
        headers=_headers(world.acme_key, "x" * 300),
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "Idempotency-Key"


def test_a_retry_after_its_frontend_died_mid_submission_runs_the_request_once(
    client, world, usage_of
):
    """A frontend binds a key to its request, queues it, then marks it queued. One that dies
    between the first two steps leaves a request that never runs; between the last two, one
    that runs. A retry (after a few seconds' grace) finds out which, and runs it once."""
    body = {"model": ALIAS, "prompt": "Once", "max_tokens": 5}
    tenant = world.globex.pk
    store = redis_sync_client()

    # Died after queueing: a real request whose record is set back to "bound, not known to be
    # queued", ten seconds ago. The retry finds it ran and replays it.
    key = f"died-after-{uuid.uuid4()}"
    first = client.post("/v1/completions", json=body, headers=_headers(world.globex_key, key))
    assert first.status_code == 200, first.text
    record = record_key(tenant, key)
    store.hset(record, mapping={"queued": 0, "bound": time.time() - 10})
    again = client.post("/v1/completions", json=body, headers=_headers(world.globex_key, key))
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert store.hget(record, "queued") == b"1"
    assert len(usage_of(first.json()["id"].removeprefix("cmpl-"))) == 1

    # Died before queueing: the key bound to a request that never reached its queue.
    deployment = cast(bytes, store.hget(record, "deployment")).decode()
    key = f"died-before-{uuid.uuid4()}"
    stalled = msgspec.structs.replace(
        job_new(deployment, tenant=tenant), request_id=uuid.uuid4().hex
    )
    asyncio.run(
        _bound_then_died(tenant, key, body_digest(endpoint=COMPLETIONS, body=body), stalled)
    )
    retry = client.post("/v1/completions", json=body, headers=_headers(world.globex_key, key))
    assert retry.status_code == 200, retry.text
    assert "Idempotent-Replayed" not in retry.headers
    assert retry.json()["id"] != f"cmpl-{stalled.request_id}"
    # The stalled frontend wakes and queues its request: refused, it never runs.
    assert asyncio.run(_enqueue(stalled)) == Refused(Refusal.SHUT_OUT)
    replay = client.post("/v1/completions", json=body, headers=_headers(world.globex_key, key))
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json()["id"] == retry.json()["id"]
    assert len(usage_of(retry.json()["id"].removeprefix("cmpl-"))) == 1
    assert usage_of(stalled.request_id, timeout=0) == []


async def _bound_then_died(tenant: int, key: str, digest: str, job) -> None:
    """What a frontend leaves that bound `key` to `job` ten seconds ago, then died."""
    client = redis_client_new()
    try:
        keys = Idempotency(client)
        rid = job.request_id
        assert await keys.begin(tenant_id=tenant, key=key, digest=digest, request_id=rid) is None
        original = Original(
            request_id=rid,
            deployment=job.deployment,
            model=ALIAS,
            version="1",
            created=int(job.enqueued_at),
            deadline=job.deadline,
        )
        await keys.bind(tenant_id=tenant, key=key, original=original)
        await client.hset(record_key(tenant, key), "bound", time.time() - 10)
    finally:
        await client.aclose()


async def _enqueue(job) -> Refused | None:
    client = redis_client_new()
    try:
        return await FrontDoor(client).enqueue(job)
    finally:
        await client.aclose()
