"""Retries that match intent, over real HTTP: every error says whether a retry can succeed
(`x-should-retry`), and the official SDK with its default retries obeys it."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import ALIAS


@pytest.fixture
def client(stack):
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        yield c


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_the_sdk_does_not_rerun_a_request_whose_own_deadline_passed(stack, world, usage_of):
    attempts: list[httpx.Request] = []
    http_client = openai.DefaultHttpxClient(event_hooks={"request": [attempts.append]})
    sdk = openai.OpenAI(
        base_url=f"{stack.base_url}/v1", api_key=world.globex_key, http_client=http_client
    )
    assert sdk.max_retries == openai.DEFAULT_MAX_RETRIES > 0  # the SDK's defaults, unchanged
    with pytest.raises(openai.APIStatusError) as failed:
        sdk.completions.create(
            model=ALIAS,
            prompt="Once",
            max_tokens=1000,
            extra_body={"ignore_eos": True},
            extra_headers={"x-request-timeout": "0.05"},
        )
    response = failed.value.response
    assert failed.value.code == "deadline_exceeded", response.text
    assert response.headers["x-should-retry"] == "false"
    assert "Retry-After" not in response.headers  # no wait can mend it
    assert len(attempts) == 1  # one HTTP attempt: the SDK did not run it again
    [record] = usage_of(response.headers["x-request-id"])
    assert record.status == "timeout" and record.completion_tokens < 1000


def test_a_rate_limit_429_says_retry(client, world, django_db_blocker):
    from tenants.services import api_key_issue, tenant_create

    with django_db_blocker.unblock():
        tenant = tenant_create(slug="retry-rpm")
        tenant.quota.requests_per_minute = 1
        tenant.quota.save()
        key = api_key_issue(tenant=tenant, name="tests").token
    body = {"model": ALIAS, "prompt": "hi", "max_tokens": 2}
    assert client.post("/v1/completions", json=body, headers=_auth(key)).status_code == 200
    refused = client.post("/v1/completions", json=body, headers=_auth(key))
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.headers["x-should-retry"] == "true"
    assert int(refused.headers["Retry-After"]) >= 1


def test_a_spent_budget_429_says_do_not_retry(client, world):
    refused = client.post(
        "/v1/completions",
        json={"model": ALIAS, "prompt": "hi", "max_tokens": 2},
        headers=_auth(world.limited_keys["umbrella"]),
    )
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "budget_exceeded"
    assert refused.headers["x-should-retry"] == "false"


def test_a_bad_request_says_do_not_retry(client, world):
    refused = client.post(
        "/v1/completions",
        json={"model": ALIAS, "prompt": 3, "max_tokens": 2},
        headers=_auth(world.acme_key),
    )
    assert refused.status_code == 400
    assert refused.headers["x-should-retry"] == "false"
    unknown = client.get("/v1/nothing-here", headers=_auth(world.acme_key))
    assert unknown.status_code == 404
    assert unknown.headers["x-should-retry"] == "false"


def test_refusals_before_the_body_is_read_say_do_not_retry(client, world):
    # Content-Length over the limit: refused by the ASGI handler, the body never read.
    too_large = client.post(
        "/v1/completions",
        content=b"x" * (5 * 1024 * 1024),
        headers={**_auth(world.acme_key), "Content-Type": "application/json"},
    )
    assert too_large.status_code == 413
    assert too_large.json()["error"]["code"] == "request_too_large"
    assert too_large.headers["Connection"] == "close"  # the handler's own refusal
    assert too_large.headers["x-should-retry"] == "false"
    # A body with a key that does not exist: refused before the body too.
    no_key = client.post(
        "/v1/completions", json={"model": ALIAS, "prompt": "x"}, headers=_auth("rh-nope")
    )
    assert no_key.status_code == 401
    assert no_key.headers["Connection"] == "close"
    assert no_key.headers["x-should-retry"] == "false"
