"""vLLM's /v1/chat/completions/batch end to end: several conversations in one request, each
answered as one choice, admitted, billed and recorded once."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import ALIAS

CONVERSATIONS = [
    [{"role": "user", "content": "hello"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "what is a queue?"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure,"}],
]


@pytest.fixture
def client(stack, world):
    headers = {"Authorization": f"Bearer {world.acme_key}"}
    with httpx.Client(base_url=stack.base_url, headers=headers, timeout=60) as c:
        yield c


def test_each_conversation_is_answered_as_its_own_chat_in_one_request(client, usage_of):
    sampling = {"model": ALIAS, "temperature": 0, "max_tokens": 5, "ignore_eos": True}
    response = client.post(
        "/v1/chat/completions/batch",
        json={**sampling, "messages": CONVERSATIONS, "return_token_ids": True},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert "prompt_token_ids" not in body  # as vLLM's server answers: no prompt's ids
    alone = [
        client.post("/v1/chat/completions", json={**sampling, "messages": conversation}).json()
        for conversation in CONVERSATIONS
    ]
    for choice, single in zip(body["choices"], alone, strict=True):
        assert choice["message"] == single["choices"][0]["message"]
        assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 5
    usage = body["usage"]
    assert usage["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in alone)
    assert usage["completion_tokens"] == 15
    [record] = usage_of(response.headers["x-request-id"])
    assert record.endpoint == "chat.completions.batch" and record.status == "ok"
    assert (record.prompt_tokens, record.completion_tokens) == (usage["prompt_tokens"], 15)


def test_each_choice_continues_and_echoes_its_own_conversations_last_message(client):
    response = client.post(
        "/v1/chat/completions/batch",
        json={
            "model": ALIAS,
            "messages": CONVERSATIONS[1:],
            "max_tokens": 2,
            "ignore_eos": True,  # two tokens each: the trained model may end one at once
            "echo": True,
            "logprobs": True,
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    first, second = (choice["message"] for choice in body["choices"])
    # Without a generation prompt each answer continues its last message, in its role.
    assert first["role"] == "user" and first["content"].startswith("what is a queue?")
    assert second["role"] == "assistant" and second["content"].startswith("Sure,")
    assert [len(c["logprobs"]["content"]) for c in body["choices"]] == [2, 2]
    assert body.get("prompt_logprobs") is None  # the batch answer has no place for them


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stream": True}, "stream"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"n": 2}, "n"),
        ({"messages": [CONVERSATIONS[0], [{"role": "user", "content": "x\ud800"}]]},
         "messages[1][0].content"),
        ({"messages": [CONVERSATIONS[0], [{"role": "user", "content": "yard " * 100_000}]]},
         "messages[1]"),
    ],
)  # fmt: skip
def test_a_refused_batch_costs_nothing_and_names_the_field(client, usage_of, fields, param):
    body = {"model": ALIAS, "messages": CONVERSATIONS, "max_tokens": 2, **fields}
    # As JSON text: a lone surrogate is written as its escape, as a hostile client sends it.
    response = client.post(
        "/v1/chat/completions/batch",
        content=json.dumps(body),
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["param"] == param
    assert response.headers["x-should-retry"] == "false"
    assert usage_of(response.headers["x-request-id"], timeout=1) == []
