"""Tenant limits over real HTTP: 429s that clients and the openai SDK understand."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from tests.conftest import ALIAS

HEADERS = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
]


@pytest.fixture
def client(stack):
    with httpx.Client(base_url=stack.base_url, timeout=120) as c:
        yield c


def _completion(client, key, **fields):
    body = {"model": ALIAS, "prompt": "hi", "max_tokens": 2, **fields}
    return client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})


def test_admitted_responses_carry_the_rate_limit_headers(client, world):
    response = _completion(client, world.acme_key)
    assert response.status_code == 200
    assert all(name in response.headers for name in HEADERS)
    assert int(response.headers["x-ratelimit-limit-requests"]) == 600


def test_responses_that_admit_nothing_still_carry_the_rate_limit_headers(client, world):
    auth = {"Authorization": f"Bearer {world.acme_key}"}
    invalid = client.post("/v1/completions", json={"model": ALIAS, "prompt": 3}, headers=auth)
    assert invalid.status_code == 400
    unknown = _completion(client, world.acme_key, model="no-such-model")
    assert unknown.status_code == 404
    listing = client.get("/v1/models", headers=auth)
    for response in (invalid, listing, unknown):
        assert all(name in response.headers for name in HEADERS), response.headers


def test_the_request_over_the_per_minute_limit_gets_429_with_retry_after(client, world):
    key = world.limited_keys["initech"]
    assert _completion(client, key).status_code == 200
    assert _completion(client, key).status_code == 200
    refused = _completion(client, key)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(refused.headers["Retry-After"]) >= 1
    assert int(refused.headers["retry-after-ms"]) > 0
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"


def test_a_spent_budget_gets_429_budget_exceeded(client, world):
    refused = _completion(client, world.limited_keys["umbrella"])
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "budget_exceeded"


def _hold_the_slot(stack, key: str, release: threading.Event) -> tuple[threading.Thread, dict]:
    """Stream a long completion on `key` until `release` (hanging up then frees the slot).

    `state["holding"]` is set at its first event; `state["ended_at"]` is when its stream ended
    on its own, so a caller can tell whether the slot was still held at a given moment.
    """
    state: dict = {"holding": threading.Event(), "ended_at": None, "seen": []}

    def hold() -> None:
        body = {"model": ALIAS, "prompt": "hi", "max_tokens": 1000, "ignore_eos": True}
        with (
            httpx.Client(base_url=stack.base_url, timeout=120) as own,
            own.stream(
                "POST",
                "/v1/completions",
                json={**body, "stream": True},
                headers={"Authorization": f"Bearer {key}"},
            ) as response,
        ):
            for line in response.iter_lines():
                if line.startswith("data: "):
                    state["seen"].append(line)
                    state["holding"].set()
                if release.is_set():
                    return  # hang up: the platform cancels the stream and frees the lease
        state["ended_at"] = time.monotonic()

    thread = threading.Thread(target=hold)
    thread.start()
    return thread, state


def test_the_sdk_raises_then_retries_a_concurrency_limit(stack, client, world):
    key = world.limited_keys["hooli"]
    impatient = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    patient = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=8)
    # The tiny model streams fast: on a loaded machine the holding stream can end before the
    # second request is sent. Such a round proves nothing either way, so it is run again.
    for _round in range(3):
        release = threading.Event()
        holder, state = _hold_the_slot(stack, key, release)
        try:
            assert state["holding"].wait(timeout=60)
            sent_at = time.monotonic()
            try:
                impatient.completions.create(model=ALIAS, prompt="x", max_tokens=1)
            except openai.RateLimitError as refused:
                assert refused.code == "concurrency_limit_exceeded"
                # Refused while the stream holds the slot; once it hangs up, retries get in.
                release.set()
                completion = patient.completions.create(model=ALIAS, prompt="x", max_tokens=1)
                assert completion.usage is not None and completion.usage.completion_tokens == 1
                return
        finally:
            release.set()
            holder.join()
        ended_at = state["ended_at"]
        if ended_at is None or ended_at > sent_at:
            pytest.fail(f"admitted while a stream held the only slot; it saw {state['seen']}")
    pytest.fail("the holding stream ended before the second request, three times")


def test_two_frontends_share_one_tenants_limit_exactly(stack, world, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from tests.conftest import _free_port, _http_ok, _spawn, _wait_for

    port = _free_port()
    second = _spawn(
        "frontend-2",
        ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)],
        tmp_path,
    )
    try:
        other_url = f"http://127.0.0.1:{port}"
        _wait_for(second, lambda: _http_ok(f"{other_url}/healthz"), timeout=120)
        key = world.limited_keys["pied-piper"]

        def call(base_url: str) -> int:
            with httpx.Client(base_url=base_url, timeout=120) as c:
                return _completion(c, key).status_code

        urls = [stack.base_url, other_url] * 6
        with ThreadPoolExecutor(max_workers=12) as pool:
            statuses = list(pool.map(call, urls))
    finally:
        second.popen.terminate()
        second.popen.wait(timeout=30)
    assert statuses.count(200) == 5
    assert statuses.count(429) == 7
