"""The HTTP API end to end over real HTTP: frontend, Redis, a vLLM worker and the ingester."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.conftest import ACME_MAX_TOKENS, ALIAS


@pytest.fixture
def client(stack):
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        yield c


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _chat(**fields):
    return {"model": ALIAS, "messages": [{"role": "user", "content": "hello"}], **fields}


def _error(response: httpx.Response, status: int, code: str, param: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"]
    assert error["param"] == param
    assert response.headers["x-request-id"]


def _sse(response: httpx.Response) -> list:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_it_rejects_a_missing_key(client):
    _error(client.post("/v1/chat/completions", json=_chat()), 401, "missing_api_key")


def test_it_rejects_a_malformed_authorization_header(client):
    response = client.post("/v1/chat/completions", json=_chat(), headers={"Authorization": "Tok"})
    _error(response, 401, "invalid_authorization_header")


def test_it_rejects_a_malformed_key(client):
    response = client.post("/v1/chat/completions", json=_chat(), headers=_auth("sy-nope"))
    _error(response, 401, "invalid_api_key")


def test_it_rejects_a_key_with_a_wrong_secret(client, world):
    forged = world.acme_key[:-4] + ("AAAA" if not world.acme_key.endswith("AAAA") else "BBBB")
    _error(
        client.post("/v1/chat/completions", json=_chat(), headers=_auth(forged)),
        401,
        "invalid_api_key",
    )


def test_it_rejects_a_revoked_key(client, world):
    response = client.post("/v1/chat/completions", json=_chat(), headers=_auth(world.revoked_key))
    _error(response, 401, "revoked_api_key")


def test_it_rejects_an_expired_key(client, world):
    response = client.post("/v1/chat/completions", json=_chat(), headers=_auth(world.expired_key))
    _error(response, 401, "expired_api_key")


def test_it_rejects_a_key_without_the_inference_scope(client, world):
    response = client.post(
        "/v1/chat/completions", json=_chat(), headers=_auth(world.models_only_key)
    )
    _error(response, 403, "insufficient_scope")


def test_it_rejects_an_unknown_model(client, world):
    response = client.post(
        "/v1/chat/completions", json=_chat(model="gpt-17"), headers=_auth(world.acme_key)
    )
    _error(response, 404, "model_not_found", "model")


def test_it_rejects_bad_json(client, world):
    response = client.post(
        "/v1/chat/completions",
        content=b'{"model": ',
        headers={**_auth(world.acme_key), "Content-Type": "application/json"},
    )
    _error(response, 400, "invalid_json")


def test_it_names_a_field_of_the_wrong_type(client, world):
    response = client.post(
        "/v1/chat/completions", json=_chat(temperature="warm"), headers=_auth(world.acme_key)
    )
    _error(response, 400, "invalid_type", "temperature")


def test_it_rejects_max_tokens_over_the_tenant_limit(client, world):
    response = client.post(
        "/v1/chat/completions",
        json=_chat(max_tokens=ACME_MAX_TOKENS + 1),
        headers=_auth(world.acme_key),
    )
    _error(response, 400, "max_tokens_exceeded", "max_tokens")


def test_it_rejects_a_prompt_over_the_context_length(client, world):
    long_prompt = " ".join(f"word{i}" for i in range(3000))
    response = client.post(
        "/v1/completions",
        json={"model": ALIAS, "prompt": long_prompt, "max_tokens": 4},
        headers=_auth(world.acme_key),
    )
    _error(response, 400, "context_length_exceeded", "prompt")


def test_it_rejects_a_body_over_the_size_limit(client, world):
    response = client.post(
        "/v1/completions",
        json={"model": ALIAS, "prompt": "x" * (5 * 1024 * 1024)},
        headers=_auth(world.acme_key),
    )
    _error(response, 413, "request_too_large")


def test_unknown_paths_and_methods_get_json_errors(client, world):
    _error(client.get("/v1/nothing-here", headers=_auth(world.acme_key)), 404, "not_found")
    _error(
        client.get("/v1/chat/completions", headers=_auth(world.acme_key)), 405, "method_not_allowed"
    )


def test_it_lists_the_models_a_client_can_call(client, world):
    response = client.get("/v1/models", headers=_auth(world.acme_key))
    assert response.status_code == 200
    ids = {m["id"] for m in response.json()["data"]}
    assert {ALIAS, "tiny-llama", world.version.public_name} <= ids
    # As vLLM's server lists a model: the version that answers it and the usable context.
    card = next(m for m in response.json()["data"] if m["id"] == ALIAS)
    assert card["root"] == world.version.public_name
    assert 0 < card["max_model_len"] <= world.deployment.context_length
    detail = client.get(f"/v1/models/{ALIAS}", headers=_auth(world.acme_key)).json()
    assert (detail["root"], detail["max_model_len"]) == (card["root"], card["max_model_len"])


def test_a_chat_completion_returns_text_and_exact_usage(client, world, usage_of):
    response = client.post(
        "/v1/chat/completions",
        json=_chat(max_tokens=12, ignore_eos=True),
        headers=_auth(world.acme_key),
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == world.version.public_name
    assert response.headers["x-roundhouse-model-version"] == world.version.version
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 12
    [record] = usage_of(response.headers["x-request-id"])
    assert record.status == "ok"
    assert record.tenant_id == world.acme.pk
    assert record.prompt_tokens == body["usage"]["prompt_tokens"]
    assert record.completion_tokens == 12


@pytest.mark.parametrize("stream", [False, True])
def test_a_looping_answer_ends_at_its_repetition_and_bills_what_it_produced(
    client, world, usage_of, stream
):
    # One token forced at every step: a pattern of one token, repeated from the start.
    rule = {"max_pattern_size": 2, "min_count": 4}
    fields = {"max_tokens": 32, "logit_bias": {"300": 100}, "repetition_detection": rule}
    body = _chat(
        **fields, stream=stream, stream_options={"include_usage": True} if stream else None
    )
    if stream:
        with client.stream(
            "POST", "/v1/chat/completions", json=body, headers=_auth(world.acme_key)
        ) as response:
            assert response.status_code == 200
            events = _sse(response)[:-1]
            request_id = response.headers["x-request-id"]
        reason = [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1]
        usage = events[-1]["usage"]
    else:
        response = client.post("/v1/chat/completions", json=body, headers=_auth(world.acme_key))
        assert response.status_code == 200, response.text
        reason, usage = response.json()["choices"][0]["finish_reason"], response.json()["usage"]
        request_id = response.headers["x-request-id"]
    assert reason == "repetition"  # as vLLM's server names it
    assert usage["completion_tokens"] == 4
    [record] = usage_of(request_id)
    assert (record.completion_tokens, record.finish_reason) == (4, "repetition")


def test_a_streamed_completion_ends_with_usage_and_done(client, world, usage_of):
    with client.stream(
        "POST",
        "/v1/completions",
        json={
            "model": ALIAS,
            "prompt": "def main():",
            "max_tokens": 10,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        headers=_auth(world.acme_key),
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _sse(response)
        request_id = response.headers["x-request-id"]
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 10
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    assert all(e["usage"] is None for e in events[:-2])
    text = "".join(e["choices"][0]["text"] for e in events[:-2])
    assert text
    [record] = usage_of(request_id)
    assert record.completion_tokens == 10 and record.status == "ok"


def test_an_empty_text_among_prompts_is_echoed_and_scored_from_its_bos(client, world, usage_of):
    # vLLM's server serves ["", ...] from the tokenizer's BOS, but answers this echo with a 500.
    response = client.post(
        "/v1/completions",
        json={"model": ALIAS, "prompt": [""], "max_tokens": 2, "echo": True, "logprobs": 1},
        headers=_auth(world.acme_key),
    )
    assert response.status_code == 200, response.text
    [choice] = response.json()["choices"]
    logprobs = choice["logprobs"]
    assert logprobs["token_logprobs"][0] is None  # the BOS: nothing before it to score
    assert logprobs["text_offset"][0] == 0 and len(logprobs["tokens"]) == 3
    assert choice["text"] == "".join(logprobs["tokens"][1:])
    [record] = usage_of(response.headers["x-request-id"])
    assert record.prompt_tokens == 1 and record.completion_tokens == 2


def test_a_non_streaming_reply_is_written_in_a_few_large_events(client, world, usage_of):
    """Nobody reads a non-streaming request token by token: its worker holds the text back
    and writes it about once a second, so its reply stream holds a few events, not one per
    token (its stream, read again through the resume endpoint, shows them)."""
    response = client.post(
        "/v1/completions",
        json={"model": ALIAS, "prompt": "def main():", "max_tokens": 48, "ignore_eos": True},
        headers=_auth(world.acme_key),
    )
    assert response.status_code == 200, response.text
    text = response.json()["choices"][0]["text"]
    request_id = response.headers["x-request-id"]
    [record] = usage_of(request_id)
    assert record.completion_tokens == 48
    with client.stream(
        "GET", f"/v1/requests/{request_id}/stream", headers=_auth(world.acme_key)
    ) as replay:
        assert replay.status_code == 200
        events = _sse(replay)
    pieces = [e["choices"][0]["text"] for e in events[:-1] if e["choices"][0]["text"]]
    assert "".join(pieces) == text
    seconds = (record.finished_at - record.started_at).total_seconds()
    assert 1 <= len(pieces) <= int(seconds) + 1, (len(pieces), seconds)


def test_a_streamed_chat_starts_with_the_assistant_role(client, world):
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json=_chat(max_tokens=5, stream=True),
        headers=_auth(world.acme_key),
    ) as response:
        events = _sse(response)
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1] == "[DONE]"
    assert "usage" not in events[0]


def test_a_client_disconnect_aborts_generation_and_bills_what_was_made(client, world, usage_of):
    with client.stream(
        "POST",
        "/v1/completions",
        json={
            "model": ALIAS,
            "prompt": "Once",
            "max_tokens": 1000,
            "ignore_eos": True,
            "stream": True,
        },
        headers=_auth(world.globex_key),
    ) as response:
        request_id = response.headers["x-request-id"]
        for line in response.iter_lines():
            if line.startswith("data: "):
                break
    closed_at = time.time()
    [record] = usage_of(request_id)
    # Reported, not asserted: how long the engine kept going after the client left.
    print(f"abort {1000 * (record.finished_at.timestamp() - closed_at):.0f} ms after disconnect")
    assert record.status == "cancelled"
    assert 0 < record.completion_tokens < 1000
    assert record.tenant_id == world.globex.pk


def test_a_non_streaming_client_that_gives_up_cancels_its_request(stack, world, django_db_blocker):
    from billing.models import UsageRecord

    marker = "impatient client"
    with (
        httpx.Client(base_url=stack.base_url, timeout=0.5) as impatient,
        pytest.raises(httpx.ReadTimeout),
    ):
        impatient.post(
            "/v1/completions",
            json={
                "model": ALIAS,
                "prompt": marker,
                "max_tokens": 1000,
                "ignore_eos": True,
                "user": marker,
            },
            headers=_auth(world.globex_key),
        )
    deadline = time.monotonic() + 60
    with django_db_blocker.unblock():
        while time.monotonic() < deadline:
            latest = UsageRecord.objects.filter(tenant=world.globex).order_by("-id").first()
            if latest is not None and latest.status == "cancelled" and latest.prompt_tokens > 1:
                break
            time.sleep(0.2)
    assert latest is not None and latest.status == "cancelled"
    assert latest.completion_tokens < 1000


def test_every_accepted_request_has_exactly_one_usage_record(client, world, usage_of):
    ids = []
    for i in range(4):
        response = client.post(
            "/v1/completions",
            json={"model": ALIAS, "prompt": f"n{i}", "max_tokens": 3},
            headers=_auth(world.acme_key),
        )
        assert response.status_code == 200
        ids.append(response.headers["x-request-id"])
    rejected = client.post("/v1/completions", json={"model": ALIAS}, headers=_auth(world.acme_key))
    assert rejected.status_code == 400
    records = usage_of(*ids, rejected.headers["x-request-id"], timeout=10)
    assert sorted(r.request_id for r in records) == sorted(ids)


def test_a_request_can_be_cancelled_by_id_by_its_own_tenant_only(stack, client, world, usage_of):
    import threading

    started = threading.Event()
    seen: dict[str, object] = {}

    def stream() -> None:
        with (
            httpx.Client(base_url=stack.base_url, timeout=120) as own,
            own.stream(
                "POST",
                "/v1/completions",
                json={
                    "model": ALIAS,
                    "prompt": "Once",
                    "max_tokens": 1000,
                    "ignore_eos": True,
                    "stream": True,
                },
                headers=_auth(world.globex_key),
            ) as response,
        ):
            seen["id"] = response.headers["x-request-id"]
            lines = []
            for line in response.iter_lines():
                if line.startswith("data: "):
                    started.set()
                    lines.append(line)
            seen["events"] = _sse_lines(lines)

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(timeout=60)
    rid = str(seen["id"])
    foreign = client.post(f"/v1/requests/{rid}/cancel", headers=_auth(world.acme_key))
    _error(foreign, 404, "request_not_found", "id")
    own = client.post(f"/v1/requests/{rid}/cancel", headers=_auth(world.globex_key))
    assert own.status_code == 200 and own.json()["status"] == "cancelling"
    reader.join(timeout=60)
    events = seen["events"]
    assert isinstance(events, list)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "cancelled"
    [record] = usage_of(rid)
    assert record.status == "cancelled" and record.completion_tokens < 1000
    _error(
        client.post("/v1/requests/nope/cancel", headers=_auth(world.acme_key)),
        404,
        "request_not_found",
        "id",
    )


def _sse_lines(lines: list[str]) -> list:
    return [
        line[6:] if line == "data: [DONE]" else json.loads(line[6:])
        for line in lines
        if line.startswith("data: ")
    ]


def test_a_client_deadline_ends_the_request_when_it_passes(client, world, usage_of):
    response = client.post(
        "/v1/completions",
        json={"model": ALIAS, "prompt": "Once", "max_tokens": 1000, "ignore_eos": True},
        headers={**_auth(world.globex_key), "x-request-timeout": "0.05"},
    )
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "deadline_exceeded"
    [record] = usage_of(response.headers["x-request-id"])
    assert record.status == "timeout" and record.completion_tokens < 1000


def test_a_deadline_can_also_come_in_the_body(client, world):
    response = client.post(
        "/v1/completions",
        json={
            "model": ALIAS,
            "prompt": "Once",
            "max_tokens": 1000,
            "ignore_eos": True,
            "timeout": 0.05,
        },
        headers=_auth(world.globex_key),
    )
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "deadline_exceeded"


def test_an_unknown_service_tier_is_refused(client, world):
    response = client.post(
        "/v1/completions",
        json={"model": ALIAS, "prompt": "x", "max_tokens": 2, "service_tier": "gold"},
        headers=_auth(world.acme_key),
    )
    _error(response, 400, "invalid_value", "service_tier")


def test_a_flex_request_runs_in_the_batch_class(client, world):
    response = client.post(
        "/v1/completions",
        json={"model": ALIAS, "prompt": "x", "max_tokens": 2, "service_tier": "flex"},
        headers=_auth(world.acme_key),
    )
    assert response.status_code == 200


def test_a_malformed_deadline_is_refused(client, world):
    response = client.post(
        "/v1/completions",
        json={"model": ALIAS, "prompt": "x", "max_tokens": 2},
        headers={**_auth(world.acme_key), "x-request-timeout": "soon"},
    )
    _error(response, 400, "invalid_value", "x-request-timeout")


def test_a_key_issued_before_the_rename_keeps_working(client, world, django_db_blocker):
    # A key issued as `sy-...`: its stored hash covers the `sy-` token it was handed out as.
    from tenants.keys import token_hash
    from tenants.models import ApiKey, Tenant
    from tenants.services import api_key_issue

    with django_db_blocker.unblock():
        issued = api_key_issue(tenant=Tenant.objects.get(slug="acme"), name="before the rename")
        legacy = "sy-" + issued.token.removeprefix("rh-")
        ApiKey.objects.filter(pk=issued.key.pk).update(secret_hash=token_hash(legacy))
    assert client.get("/v1/models", headers=_auth(legacy)).status_code == 200
    # The same secret under the new prefix is another token, with no key behind it.
    _error(client.get("/v1/models", headers=_auth(issued.token)), 401, "invalid_api_key")


def test_a_beam_search_cancelled_mid_way_ends_once_and_leaves_the_engine_serving(
    stack, client, world, usage_of
):
    """A beam search is many short engine requests under one job: a cancel stops them all,
    the job ends once (cancelled, no beams billed), and the engine goes on serving."""
    import threading

    seen: dict[str, object] = {}
    opened = threading.Event()

    def stream() -> None:
        with (
            httpx.Client(base_url=stack.base_url, timeout=120) as own,
            own.stream(
                "POST",
                "/v1/chat/completions",
                json={
                    "model": ALIAS,
                    "messages": [{"role": "user", "content": "Once"}],
                    "max_tokens": 1000,
                    "n": 4,
                    "use_beam_search": True,
                    "ignore_eos": True,
                    "stream": True,
                },
                headers=_auth(world.globex_key),
            ) as response,
        ):
            seen["id"] = response.headers["x-request-id"]
            opened.set()
            seen["events"] = _sse_lines(
                [line for line in response.iter_lines() if line.startswith("data: ")]
            )

    reader = threading.Thread(target=stream)
    reader.start()
    assert opened.wait(timeout=60)
    rid = str(seen["id"])
    time.sleep(1.0)  # some steps of the search have run
    foreign = client.post(f"/v1/requests/{rid}/cancel", headers=_auth(world.acme_key))
    _error(foreign, 404, "request_not_found", "id")
    own = client.post(f"/v1/requests/{rid}/cancel", headers=_auth(world.globex_key))
    assert own.status_code == 200
    reader.join(timeout=60)
    events = seen["events"]
    assert isinstance(events, list)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "cancelled"
    [record] = usage_of(rid)
    assert record.status == "cancelled" and record.completion_tokens == 0
    after = client.post(
        "/v1/chat/completions",
        json={"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers=_auth(world.globex_key),
    )
    assert after.status_code == 200


def test_a_beam_searchs_time_to_first_token_is_its_first_step_not_its_whole_run(
    client, world, usage_of
):
    """A beam search answers only at its end, but its first tokens come after its first
    engine step: its usage record says so, or its whole run would count as time to first
    token in a canary's TTFT p95 and the operations page (one tenant's beam searches could
    roll back another team's rollout)."""
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": ALIAS,
            "messages": [{"role": "user", "content": "Once"}],
            "max_tokens": 32,
            "n": 2,
            "use_beam_search": True,
            "ignore_eos": True,
        },
        headers=_auth(world.globex_key),
    )
    assert response.status_code == 200, response.text
    [record] = usage_of(response.headers["x-request-id"])
    assert record.status == "ok" and record.completion_tokens == 64
    assert record.started_at < record.first_token_at < record.finished_at
    # One engine step before the first token, 31 after it.
    before = record.first_token_at - record.started_at
    assert before < record.finished_at - record.first_token_at
