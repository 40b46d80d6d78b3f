"""The official openai SDK with tools, structured output, logprobs, choices and cached tokens.

What a client team writes against vLLM's own server, run unchanged against Roundhouse. The
demo model was trained to close what a grammar opens, so the structured requests reach a
complete object in a few dozen tokens as a client sends them, with no `logit_bias`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel, Field

from tests.conftest import ALIAS


class GetWeather(BaseModel):
    """The weather in a unit."""

    unit: Literal["celsius", "fahrenheit"]


class GetTime(BaseModel):
    """The time in a zone."""

    zone: Literal["utc", "cet"]


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    score: int = Field(ge=0, le=9)


TOOLS = [openai.pydantic_function_tool(GetWeather), openai.pydantic_function_tool(GetTime)]
ARGUMENTS: dict[str, type[BaseModel]] = {"GetWeather": GetWeather, "GetTime": GetTime}
ASK = [{"role": "user", "content": "weather in Paris, and the time?"}]
NAMED: Any = {"type": "function", "function": {"name": "GetTime"}}
PROMPT = "def main(args):"


@pytest.fixture
def sdk(stack, world):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=world.acme_key, max_retries=0)


def _arguments(call: Any) -> BaseModel:
    """A tool call's arguments, parsed as JSON and validated against its tool's schema."""
    assert call.type == "function" and call.id
    return ARGUMENTS[call.function.name].model_validate(json.loads(call.function.arguments))


def test_named_tool_call(sdk):
    completion = sdk.chat.completions.create(
        model=ALIAS,
        messages=ASK,
        tools=TOOLS,
        tool_choice=NAMED,
        temperature=0,
        max_tokens=64,
    )
    [choice] = completion.choices
    [call] = choice.message.tool_calls
    assert call.function.name == "GetTime"
    assert isinstance(_arguments(call), GetTime)
    assert choice.message.content == ""  # a forced call says nothing else
    assert choice.finish_reason == "stop"  # a named function keeps the engine's reason


def test_required_tool_choice(sdk):
    completion = sdk.chat.completions.create(
        model=ALIAS,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=64,
    )
    [choice] = completion.choices
    [call] = choice.message.tool_calls
    assert call.function.name in ARGUMENTS
    _arguments(call)
    assert choice.finish_reason == "tool_calls"


def test_streamed_tool_call_reassembled_by_the_sdk(sdk):
    events = []
    with sdk.chat.completions.stream(
        model=ALIAS,
        messages=ASK,
        tools=TOOLS,
        tool_choice=NAMED,
        temperature=0,
        max_tokens=64,
        stream_options={"include_usage": True},
    ) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls
    assert call.function.name == "GetTime"
    assert isinstance(call.function.parsed_arguments, GetTime)  # the SDK parsed the pieces
    pieces = [e for e in events if e.type == "tool_calls.function.arguments.delta"]
    assert pieces  # (how many depends on how the stream batched the tokens)
    assert "".join(p.arguments_delta for p in pieces) == call.function.arguments
    done = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert [e.name for e in done] == ["GetTime"]
    assert final.usage is not None and final.usage.completion_tokens > 0


def test_conversation_with_a_tool_result(sdk):
    """An assistant's tool call and the tool's answer in the history reach the prompt."""
    called = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "GetWeather", "arguments": '{"unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    ]
    asked = sdk.chat.completions.create(
        model=ALIAS, messages=ASK, tools=TOOLS, temperature=0, max_tokens=4
    )
    answered = sdk.chat.completions.create(
        model=ALIAS, messages=called, tools=TOOLS, temperature=0, max_tokens=4
    )
    # The call and its result are rendered into the prompt (Hermes: <tool_call>, <tool_response>).
    assert answered.usage.prompt_tokens > asked.usage.prompt_tokens + 10
    assert answered.choices[0].finish_reason in {"stop", "length", "tool_calls"}
    follow_up = sdk.chat.completions.create(
        model=ALIAS,
        messages=called,
        tools=TOOLS,
        tool_choice=NAMED,
        temperature=0,
        max_tokens=64,
    )
    [call] = follow_up.choices[0].message.tool_calls
    assert isinstance(_arguments(call), GetTime)


def test_parse_into_a_pydantic_model(sdk):
    completion = sdk.chat.completions.parse(
        model=ALIAS,
        messages=[{"role": "user", "content": "Is a queue a list?"}],
        response_format=Verdict,
        temperature=0,
        max_tokens=32,
    )
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, Verdict)
    assert message.parsed == Verdict.model_validate_json(message.content)


def test_json_object(sdk):
    completion = sdk.chat.completions.create(
        model=ALIAS,
        messages=[{"role": "user", "content": "hello"}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=64,
    )
    [choice] = completion.choices
    assert choice.finish_reason == "stop"
    assert isinstance(json.loads(choice.message.content), dict)


def test_logprobs_and_top_logprobs(sdk):
    completion = sdk.chat.completions.create(
        model=ALIAS,
        messages=[{"role": "user", "content": "hello"}],
        temperature=0,
        max_tokens=5,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    [choice] = completion.choices
    content = choice.logprobs.content
    assert len(content) == completion.usage.completion_tokens == 5
    assert "".join(t.token for t in content) == choice.message.content
    for position in content:
        assert position.logprob <= 0
        assert position.bytes == list(position.token.encode())
        assert len(position.top_logprobs) == 3
        likeliest = position.top_logprobs[0]
        # Greedy: the chosen token is the likeliest one.
        assert (likeliest.token, likeliest.logprob) == (position.token, position.logprob)
        ranked = [alt.logprob for alt in position.top_logprobs]
        assert ranked == sorted(ranked, reverse=True)


def test_two_choices_with_a_seed(sdk, usage_of):
    def ask() -> Any:
        return sdk.chat.completions.with_raw_response.create(
            model=ALIAS,
            messages=[{"role": "user", "content": "hello"}],
            n=2,
            seed=7,
            temperature=0.9,
            max_tokens=8,
            extra_body={"ignore_eos": True},
        )

    first, again = ask(), ask()
    completion = first.parse()
    assert [c.index for c in completion.choices] == [0, 1]
    assert {c.finish_reason for c in completion.choices} == {"length"}
    texts = [c.message.content for c in completion.choices]
    assert texts[0] != texts[1]  # each choice samples with its own seed
    assert [c.message.content for c in again.parse().choices] == texts  # and repeatably
    assert completion.usage.completion_tokens == 16
    [record] = usage_of(first.headers["x-request-id"])
    assert record.completion_tokens == 16  # every choice is billed


def test_completions_with_several_prompts(sdk, usage_of):
    prompts = [PROMPT, "hello", "import os"]
    raw = sdk.completions.with_raw_response.create(
        model=ALIAS, prompt=prompts, temperature=0, max_tokens=4, extra_body={"ignore_eos": True}
    )
    completion = raw.parse()
    assert [c.index for c in completion.choices] == [0, 1, 2]
    alone = [
        sdk.completions.create(
            model=ALIAS, prompt=p, temperature=0, max_tokens=4, extra_body={"ignore_eos": True}
        )
        for p in prompts
    ]
    # Each prompt gets the answer it gets on its own.
    assert [c.text for c in completion.choices] == [a.choices[0].text for a in alone]
    assert completion.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert completion.usage.completion_tokens == 12
    [record] = usage_of(raw.headers["x-request-id"])
    assert (record.prompt_tokens, record.completion_tokens) == (
        completion.usage.prompt_tokens,
        12,
    )


def test_cached_tokens_on_a_repeated_long_prompt(sdk, usage_of):
    system = f"Session {uuid.uuid4()}. You answer briefly and well. " + "Keep it short. " * 80
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "hello"}]

    def ask() -> Any:
        return sdk.chat.completions.with_raw_response.create(
            model=ALIAS, messages=messages, temperature=0, max_tokens=2
        )

    first, second = ask(), ask()
    usage = second.parse().usage
    cached = usage.prompt_tokens_details.cached_tokens
    # The prefix cache serves whole blocks, and never the last prompt token.
    assert 0 < cached < usage.prompt_tokens
    assert first.parse().usage.prompt_tokens_details.cached_tokens < cached
    records = {
        r.request_id: r
        for r in usage_of(first.headers["x-request-id"], second.headers["x-request-id"])
    }
    record = records[second.headers["x-request-id"]]
    assert (record.prompt_tokens, record.cached_tokens) == (usage.prompt_tokens, cached)
    # What the second found cached, the first wrote (vLLM's created_cache_tokens on chat);
    # each record keeps what its answer said.
    earlier = first.parse().usage.prompt_tokens_details
    assert earlier.created_cache_tokens >= cached - earlier.cached_tokens
    for answer in (first, second):
        said = answer.parse().usage.prompt_tokens_details.created_cache_tokens
        assert records[answer.headers["x-request-id"]].cache_created_tokens == said
