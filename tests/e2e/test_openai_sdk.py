"""The official openai SDK against Roundhouse: what a client team actually runs."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import ALIAS


@pytest.fixture
def sdk(stack, world):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=world.acme_key, max_retries=0)


def test_chat_completion(sdk, world, usage_of):
    raw = sdk.chat.completions.with_raw_response.create(
        model=ALIAS,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        max_tokens=8,
        extra_body={"ignore_eos": True},
    )
    completion = raw.parse()
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 8
    assert completion.model == world.version.public_name
    [record] = usage_of(raw.headers["x-request-id"])
    assert record.completion_tokens == 8


def test_streamed_chat_completion_with_usage(sdk):
    stream = sdk.chat.completions.create(
        model=ALIAS,
        messages=[{"role": "user", "content": "count"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    finishing = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishing[-1] == "length"


def test_completion(sdk):
    completion = sdk.completions.create(
        model=ALIAS, prompt="import os", max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert completion.object == "text_completion"
    assert completion.usage.completion_tokens == 5


def test_prompt_logprobs_score_a_text_as_docs_tools_shows(sdk):
    """The perplexity example of docs/tools.md: each prompt token's own log probability."""
    out = sdk.completions.create(
        model=ALIAS, prompt="The yard was quiet.", max_tokens=1, extra_body={"prompt_logprobs": 0}
    )
    positions = out.choices[0].prompt_logprobs  # vLLM's field, an extra of the SDK's model
    assert positions[0] is None and len(positions) == out.usage.prompt_tokens
    scored = [next(iter(p.values()))["logprob"] for p in positions[1:]]
    assert len(scored) == out.usage.prompt_tokens - 1
    assert all(isinstance(x, float) and x <= 0 for x in scored)


def test_streamed_completion(sdk):
    stream = sdk.completions.create(
        model=ALIAS,
        prompt="import os",
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 5
    assert "".join(c.choices[0].text for c in chunks if c.choices)


def test_pinned_version(sdk, world):
    completion = sdk.completions.create(model=world.version.public_name, prompt="x", max_tokens=2)
    assert completion.model == world.version.public_name


def test_models_list(sdk):
    assert ALIAS in {m.id for m in sdk.models.list()}


def test_errors_raise_the_sdk_exceptions(stack, world, sdk):
    bad_key = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="sy-nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.completions.create(model="nope", prompt="x", max_tokens=2)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_long:
        sdk.completions.create(model=ALIAS, prompt="x", max_tokens=10_000)
    assert too_long.value.param == "max_tokens"
