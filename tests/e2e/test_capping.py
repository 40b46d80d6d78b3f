"""Output capping over HTTP: a tenant that opts in gets a shorter answer that finishes in time.

The session's worker answers far faster than a loaded deployment would, so the estimate is
set here: a stand-in worker joins the deployment's live set with a rate that brings the
deployment's to 4/3 reserved tokens a second per slot. A request may then serve about 80 tokens
in its 60 s, its prompt's among them; nothing waits in the queue ahead of it. The stand-in
takes no jobs (it reports no slots) and leaves when the module ends.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from dataplane.keys import deployment_keys, heartbeats_key
from dataplane.redis_client import redis_sync_client
from tests.conftest import ALIAS, DEPLOYMENT, roomy_key

STAND_IN = "capping-stand-in"
SECONDS_PER_TOKEN = 0.75  # per slot
TIMEOUT = "60"
ASKED = 200
CAPPED = "x-roundhouse-max-tokens-capped"


@pytest.fixture(scope="module")
def keys(stack: Any, world: Any, django_db_blocker: Any) -> dict[str, str]:
    """Keys of a tenant that caps output and of one that does not."""
    with django_db_blocker.unblock():
        # 150 tokens a minute: a request reserving its prompt and 200 tokens never fits.
        return {
            "caps": roomy_key("cap-e2e-caps", output_capping=True),
            "runs": roomy_key("cap-e2e-runs"),
            "tight-caps": roomy_key(
                "cap-e2e-tight-caps", output_capping=True, tokens_per_minute=150
            ),
            "tight-runs": roomy_key("cap-e2e-tight-runs", tokens_per_minute=150),
        }


@pytest.fixture(scope="module")
def slow(stack: Any) -> Iterator[None]:
    """The deployment's estimate, as if it were loaded (see the module's docstring)."""
    client = redis_sync_client()
    keys = deployment_keys(DEPLOYMENT)
    now = time.time()
    workers: Any = client.zrangebyscore(heartbeats_key(DEPLOYMENT), now, "+inf")
    slots: Any = client.hgetall(keys.slots)
    rates: Any = client.hgetall(keys.rate)
    # What the live workers report: "<shared> <reserved>" slots, and reserved tokens a second.
    live_slots = sum(int(part) for w in workers for part in slots.get(w, b"0 0").split())
    live_rate = sum(float(rates.get(w, 0)) for w in workers)
    client.zadd(heartbeats_key(DEPLOYMENT), {STAND_IN: now + 3600})
    client.hset(keys.rate, STAND_IN, max(live_slots, 1) / SECONDS_PER_TOKEN - live_rate)
    try:
        yield
    finally:
        client.zrem(heartbeats_key(DEPLOYMENT), STAND_IN)
        client.hdel(keys.rate, STAND_IN)
        client.close()


@pytest.fixture
def client(stack: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        yield c


def _post(client: httpx.Client, key: str, path: str, **fields: Any) -> httpx.Response:
    body = {"model": ALIAS, "max_tokens": ASKED, "ignore_eos": True, "temperature": 0, **fields}
    headers = {"Authorization": f"Bearer {key}", "x-request-timeout": TIMEOUT}
    return client.post(path, json=body, headers=headers)


def _chat(client: httpx.Client, key: str) -> httpx.Response:
    return _post(client, key, "/v1/chat/completions", messages=[{"role": "user", "content": "Hi"}])


def test_a_tenant_that_caps_output_gets_a_capped_answer_that_says_so(slow, client, keys, usage_of):
    response = _chat(client, keys["caps"])
    assert response.status_code == 200, response.text
    cap = int(response.headers[CAPPED])
    assert 16 <= cap < ASKED
    body = response.json()
    # It ran to its cap, as vLLM says of any answer that reached its max_tokens.
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == cap
    (record,) = usage_of(response.headers["x-request-id"])
    assert (record.status, record.capped_max_tokens) == ("ok", cap)
    assert record.completion_tokens == cap


def test_a_tenant_that_does_not_cap_output_runs_as_asked(slow, client, keys, usage_of):
    response = _chat(client, keys["runs"])
    assert CAPPED not in response.headers
    (record,) = usage_of(response.headers["x-request-id"])
    assert record.capped_max_tokens is None
    # Admitted as asked, as today: it runs all its tokens, or, on a machine as slow as the
    # estimate says, is cut at its deadline.
    if response.status_code == 200:
        assert response.json()["usage"]["completion_tokens"] == ASKED
    else:
        assert (response.status_code, response.json()["error"]["code"]) == (
            503,
            "deadline_exceeded",
        )


def test_a_capped_stream_and_completion_say_so_the_same_way(slow, client, keys, usage_of):
    auth = {"Authorization": f"Bearer {keys['caps']}", "x-request-timeout": TIMEOUT}
    body = {
        "model": ALIAS,
        "prompt": "Once upon a time",
        "max_tokens": ASKED,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", "/v1/completions", json=body, headers=auth) as response:
        assert response.status_code == 200
        cap = int(response.headers[CAPPED])
        chunks = [
            json.loads(line[6:])
            for line in response.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
        request_id = response.headers["x-request-id"]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert reasons[-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == cap < ASKED
    (record,) = usage_of(request_id)
    assert record.capped_max_tokens == cap


def test_a_tenant_that_caps_output_gets_an_answer_instead_of_a_tokens_429(client, keys, usage_of):
    response = _chat(client, keys["tight-caps"])
    assert response.status_code == 200, response.text
    body = response.json()
    cap = int(response.headers[CAPPED])
    # At most what the window had left after the prompt (the reservation is 150 tokens); less
    # when this module's slower estimate caps its finish too.
    assert 16 <= cap <= 150 - body["usage"]["prompt_tokens"]
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == cap
    (record,) = usage_of(response.headers["x-request-id"])
    assert (record.status, record.capped_max_tokens, record.completion_tokens) == ("ok", cap, cap)
    # Another tenant with the same window keeps today's 429.
    refused = _chat(client, keys["tight-runs"])
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "tokens_per_minute_exceeded"
    assert CAPPED not in refused.headers
