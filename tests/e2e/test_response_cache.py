"""The response cache: opt-in per tenant, deterministic requests only, never across tenants."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from typing import Any

import httpx
import pytest

from tests.conftest import ALIAS


@pytest.fixture
def client(stack):
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        yield c


def _chat(client: httpx.Client, key: str, content: str, **fields: Any) -> httpx.Response:
    body = {
        "model": ALIAS,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 12,
        "temperature": 0,
        **fields,
    }
    response = client.post(
        "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 200, response.text
    return response


def _text(response: httpx.Response) -> str:
    return str(response.json()["choices"][0]["message"]["content"])


def test_a_repeated_deterministic_request_is_answered_from_the_cache_and_billed_its_share(
    client, world, usage_of
):
    key = world.limited_keys["cyberdyne"]
    first = _chat(client, key, "Name a river")
    again = _chat(client, key, "Name a river")
    assert first.headers["x-roundhouse-cache"] == "miss"
    assert again.headers["x-roundhouse-cache"] == "hit"
    assert _text(again) == _text(first)
    assert again.json()["usage"] == first.json()["usage"]
    assert again.headers["x-request-id"] != first.headers["x-request-id"]
    # Every request has its one usage record; the cached one bills half, as the quota says.
    miss, hit = sorted(
        usage_of(first.headers["x-request-id"], again.headers["x-request-id"]),
        key=lambda r: r.response_cache,
    )
    assert (miss.response_cache, hit.response_cache) == (False, True)
    assert hit.status == "ok" and hit.completion_tokens == miss.completion_tokens
    assert miss.cost > 0
    assert hit.cost == (miss.cost * Decimal("0.5")).quantize(hit.cost)


def test_a_cached_answer_streams_like_any_other(client, world):
    key = world.limited_keys["cyberdyne"]
    plain = _text(_chat(client, key, "Name a mountain"))
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "model": ALIAS,
            "messages": [{"role": "user", "content": "Name a mountain"}],
            "max_tokens": 12,
            "temperature": 0,
            "stream": True,
        },
        headers={"Authorization": f"Bearer {key}"},
    ) as streamed:
        assert streamed.headers["x-roundhouse-cache"] == "hit"
        lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == plain


def test_tenants_never_share_entries_and_tenants_without_it_are_untouched(client, world):
    prompt = "Name a forest"
    _chat(client, world.limited_keys["cyberdyne"], prompt)
    assert _chat(client, world.limited_keys["cyberdyne"], prompt).headers["x-roundhouse-cache"] == (
        "hit"
    )
    # Another opted-in tenant with the very same request fills its own entry.
    assert _chat(client, world.limited_keys["tyrell"], prompt).headers["x-roundhouse-cache"] == (
        "miss"
    )
    # A tenant that did not opt in never sees the header.
    assert "x-roundhouse-cache" not in _chat(client, world.acme_key, prompt).headers


def test_sampled_requests_are_never_cached(client, world):
    key = world.limited_keys["tyrell"]
    for _ in range(2):
        response = _chat(client, key, "Name a lake", temperature=0.8)
        assert "x-roundhouse-cache" not in response.headers


def test_an_entry_expires_after_the_tenants_cache_time(client, world):
    key = world.limited_keys["massive"]
    assert _chat(client, key, "Name a desert").headers["x-roundhouse-cache"] == "miss"
    assert _chat(client, key, "Name a desert").headers["x-roundhouse-cache"] == "hit"
    time.sleep(1.5)
    assert _chat(client, key, "Name a desert").headers["x-roundhouse-cache"] == "miss"


def test_a_repeated_response_is_answered_from_the_cache_but_never_from_a_chat_answer(
    client, world, usage_of
):
    key = world.limited_keys["cyberdyne"]
    _chat(client, key, "Name a lake")

    def respond() -> httpx.Response:
        body = {"model": ALIAS, "input": "Name a lake", "max_output_tokens": 12, "temperature": 0}
        response = client.post(
            "/v1/responses", json=body, headers={"Authorization": f"Bearer {key}"}
        )
        assert response.status_code == 200, response.text
        return response

    first, again = respond(), respond()
    # The same prompt answered by chat is not a response's answer: the key names the endpoint.
    assert first.headers["x-roundhouse-cache"] == "miss"
    assert again.headers["x-roundhouse-cache"] == "hit"
    assert again.json()["output_text"] == first.json()["output_text"]
    assert again.json()["id"] != first.json()["id"]
    miss, hit = sorted(
        usage_of(first.headers["x-request-id"], again.headers["x-request-id"]),
        key=lambda r: r.response_cache,
    )
    assert (miss.response_cache, hit.response_cache) == (False, True)
    assert {miss.endpoint, hit.endpoint} == {"responses"}
