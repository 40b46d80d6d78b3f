"""Anthropic's Messages API through the official anthropic SDK, on the real stack.

A message whole and streamed, a stop sequence, a tool round trip in the history, streamed
tool_use blocks, count_tokens, exact usage records, errors in Anthropic's shape (the SDK's own
exception classes), the key as `x-api-key` or as a bearer token, and a refusal of what is not
built. The demo model is tiny: the tests check shapes, counts and what the request asked
for, and of what it says only the formats it was trained to write (a forced call's input
that follows the tool's schema, a short answer that ends the turn).
"""

from __future__ import annotations

import uuid
from typing import Any, cast

import anthropic
import httpx
import pytest

from tests.conftest import ALIAS

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture
def sdk(stack, world):
    return anthropic.Anthropic(base_url=stack.base_url, api_key=world.acme_key, max_retries=0)


GREEDY = {"temperature": 0}  # the SDK takes sampling settings as extra body fields


def _error(exc: pytest.ExceptionInfo[anthropic.APIStatusError]) -> dict[str, Any]:
    """The error object of a refusal's body (Anthropic's shape: {"type": "error", "error"})."""
    body = cast(dict[str, Any], exc.value.body)
    assert body["type"] == "error"
    return cast(dict[str, Any], body["error"])


def _ask(sdk, **fields):
    fields.setdefault("messages", [{"role": "user", "content": "Hello there"}])
    fields["extra_body"] = {**GREEDY, **fields.get("extra_body", {})}
    fields.setdefault("max_tokens", 8)
    return sdk.messages.create(model=ALIAS, **fields)


def test_a_message_is_answered_and_billed_exactly(sdk, usage_of):
    raw = sdk.messages.with_raw_response.create(
        model=ALIAS,
        max_tokens=6,
        extra_body=GREEDY,
        system="Be brief.",
        messages=[{"role": "user", "content": "Say hello."}],
    )
    message = raw.parse()
    assert message.type == "message" and message.role == "assistant"
    assert message.id == f"msg_{raw.headers['x-request-id']}"
    assert [block.type for block in message.content] == ["text"]
    # The demo model greets back and ends its turn before max_tokens.
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert 0 < message.usage.output_tokens < 6
    (record,) = usage_of(raw.headers["x-request-id"])
    assert record.endpoint == "messages"
    assert record.completion_tokens == message.usage.output_tokens
    usage = message.usage
    prompt = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    assert record.prompt_tokens == prompt
    assert record.cached_tokens == usage.cache_read_input_tokens


def test_a_stop_sequence_ends_the_message_and_is_named(sdk):
    said = _ask(sdk, max_tokens=8).content[0].text
    word = said[len(said) // 2 :][:3]  # some text the greedy model writes after its start
    stopped = _ask(sdk, max_tokens=8, stop_sequences=[word])
    assert stopped.stop_reason == "stop_sequence"
    assert stopped.stop_sequence == word
    assert word not in stopped.content[0].text
    assert said.startswith(stopped.content[0].text)


def test_a_streamed_message_is_the_whole_one_in_events(sdk):
    whole = _ask(sdk)
    with sdk.messages.stream(
        model=ALIAS,
        max_tokens=8,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Hello there"}],
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 8


def test_a_tool_round_trip_in_the_history_reaches_the_template(sdk, stack, world):
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21C"}],
        },
    ]
    counted = sdk.messages.count_tokens(model=ALIAS, messages=history, tools=[WEATHER])
    # The same conversation as chat's messages and tools: the same prompt, token for token.
    chat = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 21C"},
    ]
    function = {
        "name": "get_weather",
        "description": WEATHER["description"],
        "parameters": WEATHER["input_schema"],
    }
    answered = httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {world.acme_key}"},
        json={
            "model": ALIAS,
            "max_tokens": 1,
            "messages": chat,
            "tools": [{"type": "function", "function": function}],
        },
    ).json()
    assert counted.input_tokens == answered["usage"]["prompt_tokens"]
    answer = _ask(sdk, messages=history, tools=[WEATHER])
    assert (
        answer.usage.input_tokens
        + answer.usage.cache_read_input_tokens
        + (answer.usage.cache_creation_input_tokens)
        == counted.input_tokens
    )


def test_a_forced_tool_is_used_and_its_result_answered_in_a_turn_that_ends(sdk):
    # strict: as on vLLM's server, only a strict tool's schema constrains a forced call.
    strict = {**WEATHER, "strict": True}
    used = _ask(
        sdk,
        max_tokens=64,
        tools=[strict],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    assert used.stop_reason == "tool_use"
    [block] = [b for b in used.content if b.type == "tool_use"]
    assert block.name == "get_weather"
    assert isinstance(block.input, dict) and isinstance(block.input["city"], str)
    result = {"type": "tool_result", "tool_use_id": block.id, "content": "Sunny, 21C"}
    answered = _ask(
        sdk,
        max_tokens=64,
        tools=[strict],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": used.content},
            {"role": "user", "content": [result]},
        ],
    )
    assert answered.stop_reason == "end_turn"
    assert [b.type for b in answered.content] == ["text"] and answered.content[0].text.strip()


def test_tool_choice_any_gets_a_call_that_fits_the_tools_schema(sdk):
    # Strict, as the SDK's users mark a tool whose schema must hold (see above).
    weather = {
        **WEATHER,
        "strict": True,
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    }
    for temperature in (0.0, 0.7):
        answer = _ask(
            sdk,
            max_tokens=64,
            tools=[weather],
            tool_choice={"type": "any"},
            messages=[{"role": "user", "content": "What is the weather in Lyon?"}],
            extra_body={"temperature": temperature},
        )
        assert answer.stop_reason == "tool_use", answer
        [call] = [block for block in answer.content if block.type == "tool_use"]
        assert call.name == "get_weather"
        assert isinstance(call.input, dict), call
        assert isinstance(call.input.get("city"), str) and call.input.get("unit") in ("c", "f"), (
            call
        )


def test_a_forced_tool_streams_as_a_tool_use_block(sdk):
    with sdk.messages.stream(
        model=ALIAS,
        max_tokens=40,  # the template's tool-call tags and the name come first
        extra_body=GREEDY,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    ) as stream:
        events = list(stream)
    starts = [e for e in events if e.type == "content_block_start"]
    assert starts and starts[0].content_block.type == "tool_use"
    assert starts[0].content_block.name == "get_weather"
    pieces = [e.delta.partial_json for e in events if e.type == "content_block_delta"]
    assert pieces and all(isinstance(piece, str) for piece in pieces)


def test_errors_are_in_anthropics_shape_and_name_the_field(sdk, stack, world):
    with pytest.raises(anthropic.BadRequestError) as refused:
        _ask(sdk, max_tokens=8, thinking={"type": "enabled", "budget_tokens": 10})
    assert _error(refused)["type"] == "invalid_request_error"
    assert _error(refused)["param"] == "thinking.budget_tokens"
    with pytest.raises(anthropic.BadRequestError) as unknown:
        _ask(sdk, extra_body={"container": "c"})
    assert _error(unknown)["code"] == "unsupported_parameter"
    assert _error(unknown)["param"] == "container"
    with pytest.raises(anthropic.NotFoundError) as missing:
        sdk.messages.create(
            model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "x"}]
        )
    assert _error(missing)["type"] == "not_found_error"
    # Refused before its body is read: a bad key, in the same shape.
    bad = anthropic.Anthropic(base_url=stack.base_url, api_key="rh-nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as denied:
        _ask(bad)
    assert _error(denied)["type"] == "authentication_error"


def test_the_key_may_be_a_bearer_token_too(stack, world):
    bearer = anthropic.Anthropic(
        base_url=stack.base_url, auth_token=world.acme_key, api_key=None, max_retries=0
    )
    assert _ask(bearer).usage.output_tokens == 8
    # And x-api-key works on the OpenAI-shaped endpoints as well.
    answer = httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"x-api-key": world.acme_key},
        json={"model": ALIAS, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]},
    )
    assert answer.status_code == 200


def test_an_idempotency_key_replays_the_message_and_bills_it_once(sdk, usage_of):
    key = f"msg-{uuid.uuid4()}"
    asked = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 6}
    first, again = (
        sdk.messages.with_raw_response.create(
            model=ALIAS, extra_body=GREEDY, extra_headers={"Idempotency-Key": key}, **asked
        )
        for _ in range(2)
    )
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["x-request-id"] == first.headers["x-request-id"]
    assert again.parse().model_dump() == first.parse().model_dump()
    assert len(usage_of(first.headers["x-request-id"])) == 1
    # The key with another body: a 422 naming the key.
    with pytest.raises(anthropic.UnprocessableEntityError) as reused:
        _ask(sdk, max_tokens=7, extra_headers={"Idempotency-Key": key})
    assert _error(reused)["param"] == "Idempotency-Key"


def test_a_streamed_message_with_a_key_is_replayed_as_the_same_stream(sdk, usage_of):
    key = f"msg-{uuid.uuid4()}"
    asked = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 6}
    answers = []
    for _ in range(2):
        with sdk.messages.stream(
            model=ALIAS, extra_body=GREEDY, extra_headers={"Idempotency-Key": key}, **asked
        ) as stream:
            answers.append((stream.response.headers, stream.get_final_message()))
    (first_headers, first), (again_headers, again) = answers
    assert again_headers["Idempotent-Replayed"] == "true"
    assert again.model_dump() == first.model_dump()  # its id, blocks and usage
    assert len(usage_of(first_headers["x-request-id"])) == 1


def test_what_is_not_built_is_refused_naming_it(sdk):
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"thinking": {"type": "adaptive", "display": "updates"}}, "thinking.display"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_reference", "tool_name": "x"}]}
                ]
            },
            "messages[0].content[0].type",
        ),
        ({"metadata": {"user_id": "u", "tier": "gold"}}, "metadata.tier"),
    ]
    for fields, param in cases:
        extra = {k: v for k, v in fields.items() if k != "messages"}
        with pytest.raises(anthropic.BadRequestError) as refused:
            _ask(
                sdk,
                messages=fields.get("messages", [{"role": "user", "content": "x"}]),
                extra_body=extra,
            )
        assert _error(refused)["param"] == param, fields


def test_the_tenants_safety_pack_screens_a_message_as_it_screens_a_chat(stack, django_db_blocker):
    from safety.services import policy_assign, policy_pack_save
    from tenants.services import api_key_issue, tenant_create

    with django_db_blocker.unblock():
        tenant = tenant_create(slug="messages-screened")
        policy_assign(tenant=tenant, pack=policy_pack_save(name="msg-pack", toxicity_threshold=0.8))
        key = api_key_issue(tenant=tenant, name="tests").token
    client = anthropic.Anthropic(base_url=stack.base_url, api_key=key, max_retries=0)
    toxic = "you are a fucking idiot and I hate you"
    call = {"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}
    answer = {"type": "tool_result", "tool_use_id": "t", "content": toxic}
    hidden_in_a_tool_result = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [answer]},
    ]
    for messages, system in [
        ([{"role": "user", "content": toxic}], None),
        (hidden_in_a_tool_result, None),
        ([{"role": "user", "content": "hi"}], toxic),
    ]:
        extra = {"system": system} if system else {}
        with pytest.raises(anthropic.BadRequestError) as refused:
            _ask(client, messages=messages, tools=[WEATHER], **extra)
        assert _error(refused)["code"] == "content_policy_violation"
    assert _ask(client, messages=[{"role": "user", "content": "a kind word about rivers"}])
