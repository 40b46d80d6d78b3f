"""Hostile bodies against the running platform: a 400 naming the field, and no slot held.

Each body below was a 500 after admission (a lone surrogate reached the tokenizer, PostgreSQL or
Valkey; a deep body overflowed the stack), and a 500 after admission kept the tenant's
concurrency slot. Each is now refused before admission, and afterwards the tenant, whose
concurrency is two, is served more requests than that, one after another and all at once.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import websockets

from tenants.services import api_key_issue, tenant_create
from tests.conftest import ALIAS

CONCURRENCY = 2
DEEP = 10_000
NESTED = "[" * DEEP + "]" * DEEP


def _chat(**fields: Any) -> dict[str, Any]:
    return {
        "model": ALIAS,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        **fields,
    }


def _completion(**fields: Any) -> dict[str, Any]:
    return {"model": ALIAS, "prompt": "hi", "max_tokens": 2, **fields}


def _embedding(**fields: Any) -> dict[str, Any]:
    return {"model": "minilm", "input": "hi", **fields}


def _with(body: dict[str, Any], field: str, raw: str) -> str:
    """The body as JSON text with one field's value written as it is (json.dumps cannot)."""
    text = json.dumps({**body, field: "@@raw@@"})
    return text.replace('"@@raw@@"', raw)


# (endpoint, body as JSON text, status, code, param)
HOSTILE = [
    ("/v1/chat/completions", json.dumps(_chat(user="\ud800")), 400, "invalid_value", "user"),
    ("/v1/chat/completions", json.dumps(_chat(stop=["ok", "\ud800"])), 400, "invalid_value",
     "stop[1]"),
    ("/v1/chat/completions", json.dumps(_chat(messages=[{"role": "user", "content": "a\udfff"}])),
     400, "invalid_value", "messages[0].content"),
    ("/v1/chat/completions", json.dumps(_chat(model="tiny\ud800")), 400, "invalid_value", "model"),
    ("/v1/chat/completions", _with(_chat(), "messages", NESTED), 400, "invalid_json", "messages"),
    ("/v1/chat/completions", _with(_chat(), "seed", "1" + "0" * 30), 400, "invalid_value", "seed"),
    ("/v1/chat/completions", _with(_chat(), "temperature", "1" + "0" * 400), 400, "invalid_value",
     "temperature"),
    ("/v1/chat/completions", json.dumps(_chat(model="m" * 10_000)), 404, "model_not_found",
     "model"),
    ("/v1/chat/completions", json.dumps(_chat(best_of=3)), 400, "unsupported_parameter",
     "best_of"),
    ("/v1/chat/completions", json.dumps(_chat(logit_bias={"999999": 5})), 400, "invalid_value",
     "logit_bias"),
    ("/v1/chat/completions", json.dumps(_chat(tool_choice="required")), 400, "invalid_value",
     "tool_choice"),
    ("/v1/chat/completions", json.dumps(_chat(shiny_new_option=1)), 400,
     "unsupported_parameter", "shiny_new_option"),
    # vLLM's fields the platform honours: documents, logprob_token_ids, beam search.
    ("/v1/chat/completions", _with(_chat(), "documents", NESTED), 400, "invalid_json",
     "documents"),
    ("/v1/chat/completions", json.dumps(_chat(documents=[{"text": "\ud800"}])), 400,
     "invalid_value", "documents[0].text"),
    ("/v1/chat/completions", json.dumps(_chat(documents=[{"text": {"deep": "x"}}])), 400,
     "invalid_type", "documents[0].text"),
    ("/v1/chat/completions", json.dumps(_chat(documents=[{"text": "yard " * 100_000}])), 400,
     "context_length_exceeded", "messages"),
    ("/v1/chat/completions", json.dumps(_chat(logprobs=True, logprob_token_ids=list(range(5_000)))),
     400, "invalid_value", "logprob_token_ids"),
    ("/v1/chat/completions", json.dumps(_chat(logprobs=True, logprob_token_ids=[-1])), 400,
     "invalid_value", "logprob_token_ids[0]"),
    ("/v1/chat/completions", json.dumps(_chat(logprobs=True, logprob_token_ids=[10**30])), 400,
     "invalid_value", "logprob_token_ids[0]"),
    ("/v1/chat/completions", json.dumps(_chat(use_beam_search=True, length_penalty=1e308)), 400,
     "invalid_value", "length_penalty"),
    ("/v1/chat/completions", json.dumps(_chat(use_beam_search=True, n=10, max_tokens=10**9)),
     400, "max_tokens_exceeded", "max_tokens"),
    ("/v1/chat/completions", json.dumps(_chat(use_beam_search=True, n=128)), 400,
     "invalid_value", "n"),
    # A reasoning model's fields on a model that does not think; a 31-digit budget anywhere.
    ("/v1/chat/completions", json.dumps(_chat(thinking_token_budget=10**30)), 400,
     "invalid_value", "thinking_token_budget"),
    ("/v1/chat/completions", json.dumps(_chat(thinking_token_budget=64)), 400,
     "unsupported_parameter", "thinking_token_budget"),
    ("/v1/chat/completions", json.dumps(_chat(include_reasoning=False)), 400,
     "unsupported_parameter", "include_reasoning"),
    ("/v1/chat/completions", json.dumps(_chat(reasoning_effort="\ud800")), 400,
     "invalid_value", "reasoning_effort"),
    ("/v1/chat/completions", json.dumps(_chat(messages=[
        {"role": "assistant", "content": "hi", "reasoning": {"deep": ["x"]}},
        {"role": "user", "content": "hi"}])), 400, "invalid_type", "messages[0].reasoning"),
    ("/v1/completions", json.dumps(_completion(prompt="\ud800")), 400, "invalid_value", "prompt"),
    ("/v1/completions", json.dumps(_completion(user="x\udc00")), 400, "invalid_value", "user"),
    ("/v1/completions", _with(_completion(), "prompt", NESTED), 400, "invalid_json", "prompt"),
    ("/v1/completions", json.dumps(_completion(suffix="x")), 400, "unsupported_parameter",
     "suffix"),
    ("/v1/completions", json.dumps(_completion(tools=[])), 400, "unsupported_parameter", "tools"),
    ("/v1/embeddings", json.dumps(_embedding(input=["ok", "\ud800"])), 400, "invalid_value",
     "input[1]"),
    ("/v1/embeddings", json.dumps(_embedding(model="\ud800")), 400, "invalid_value", "model"),
    ("/v1/embeddings", _with(_embedding(), "input", NESTED), 400, "invalid_json", "input"),
    # More messages than a request may hold (each is read, rendered and tokenised), however
    # short: refused before any is read.
    ("/v1/chat/completions", json.dumps(_chat(messages=[{"role": "user", "content": "a"}] * 4097)),
     400, "array_above_max_length", "messages"),
    ("/v1/chat/completions/batch", json.dumps(_chat(messages=[[{"role": "user", "content": "a"}]
     * 2049] * 2)), 400, "array_above_max_length", "messages"),
    ("/v1/responses", json.dumps({"model": ALIAS, "input": ["a"] * 4097}), 400,
     "array_above_max_length", "input"),
    ("/v1/responses", json.dumps({"model": ALIAS, "input": [{"role": "user", "content": "a"}]
     * 4097, "truncation": "auto"}), 400, "array_above_max_length", "input"),
    ("/v1/messages", json.dumps({"model": ALIAS, "max_tokens": 2, "messages": [{"role": "user",
     "content": "a"}] * 4097}), 400, "array_above_max_length", "messages"),
    ("/tokenize", json.dumps({"model": ALIAS, "messages": [{"role": "user", "content": "a"}]
     * 4097}), 400, "array_above_max_length", "messages"),
]  # fmt: skip


@pytest.fixture(scope="module")
def key(stack: Any, django_db_blocker: Any) -> str:
    with django_db_blocker.unblock():
        tenant = tenant_create(slug="stark-hostile")
        tenant.quota.max_concurrency = CONCURRENCY
        tenant.quota.requests_per_minute = 10_000
        tenant.quota.save()
        return api_key_issue(tenant=tenant, name="hostile-input").token


@pytest.fixture(scope="module")
def http(stack: Any, key: str) -> Any:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    with httpx.Client(base_url=stack.base_url, headers=headers, timeout=60) as client:
        yield client


@pytest.mark.parametrize(("endpoint", "body", "status", "code", "param"), HOSTILE)
def test_a_hostile_body_is_refused_naming_the_field(http, endpoint, body, status, code, param):
    response = http.post(endpoint, content=body.encode())
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
    assert len(error["message"]) < 200  # inputs are never echoed whole


def _ws_url(stack: Any) -> str:
    return stack.base_url.replace("http://", "ws://") + "/v1/ws"


async def _answer(ws: Any) -> dict[str, Any]:
    """The next frame that ends something: an error or a request's finish."""
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), 60))
        if message["type"] in ("error", "finished"):
            return message


def _frame(client_id: str, body: str) -> str:
    return json.dumps({"type": "request", "id": client_id, "body": "@@raw@@"}).replace(
        '"@@raw@@"', body
    )


async def test_hostile_websocket_frames_get_an_error_frame_and_the_socket_serves_on(stack, key):
    hostile = [
        (_frame("surrogate", json.dumps(_chat(user="\ud800"))), "surrogate", "body.user"),
        (_frame("stop", json.dumps(_chat(stop="\udfff"))), "stop", "body.stop"),
        (_frame("deep", _with(_chat(), "messages", NESTED)), None, "body"),
        ('{"type": "request", "id": "\\ud800", "body": {}}', None, "id"),
        (_frame("endpoint", json.dumps(_chat())).replace('"type"', '"endpoint": [], "type"'),
         "endpoint", "endpoint"),
        (_frame("best", json.dumps(_chat(best_of=2))), "best", "best_of"),
    ]  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    async with websockets.connect(_ws_url(stack), additional_headers=headers) as ws:
        for frame, client_id, param in hostile:
            await ws.send(frame)
            answer = await _answer(ws)
            assert answer["type"] == "error", (frame[:60], answer)
            assert (answer["id"], answer["error"]["param"]) == (client_id, param), answer
            assert answer["error"]["code"] in (
                "invalid_value",
                "invalid_json",
                "invalid_id",
                "invalid_endpoint",
                "unsupported_parameter",
            )
        await ws.send(json.dumps({"type": "request", "id": "fine", "body": _chat()}))
        assert (await _answer(ws))["type"] == "finished"


def test_afterwards_the_tenant_is_served_past_its_concurrency(http):
    """No refused body held a slot: more requests than the concurrency run, in turn and at once."""
    for _ in range(CONCURRENCY + 2):
        response = http.post("/v1/chat/completions", content=json.dumps(_chat()).encode())
        assert response.status_code == 200, response.text[:300]

    async def at_once() -> list[int]:
        async with httpx.AsyncClient(
            base_url=str(http.base_url), headers=dict(http.headers), timeout=60
        ) as client:
            answers = await asyncio.gather(
                *(client.post("/v1/chat/completions", json=_chat()) for _ in range(CONCURRENCY))
            )
        return [a.status_code for a in answers]

    assert asyncio.run(at_once()) == [200] * CONCURRENCY
