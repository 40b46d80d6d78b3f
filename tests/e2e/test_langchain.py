"""LangChain's ChatOpenAI against Roundhouse, as a team on LangChain points it at the platform.

`with_structured_output` and `bind_tools` are how LangChain users ask for JSON and tool calls;
every field LangChain sends must be one the platform honours (an unknown one is refused). The
demo model was trained to close what a grammar opens, so no request needs a `logit_bias`.
"""

from __future__ import annotations

from typing import Literal

import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.conftest import ALIAS


class Verdict(BaseModel):
    """A yes or no with a score."""

    answer: Literal["yes", "no"]
    score: int = Field(ge=0, le=9)


class GetTime(BaseModel):
    """The time in a zone."""

    zone: Literal["utc", "cet"]


@pytest.fixture
def chat(stack, world) -> ChatOpenAI:
    return ChatOpenAI(
        model=ALIAS,
        base_url=f"{stack.base_url}/v1",
        api_key=world.acme_key,
        max_retries=0,
        temperature=0,
        max_completion_tokens=64,
    )


def test_with_structured_output_returns_the_pydantic_object(chat):
    structured = chat.with_structured_output(Verdict, method="json_schema", strict=True)
    verdict = structured.invoke("Is a queue a list?")
    assert isinstance(verdict, Verdict)


def test_with_structured_output_by_function_calling(chat):
    # strict: vLLM (and so the platform) constrains a forced call to a strict tool's schema.
    structured = chat.with_structured_output(Verdict, method="function_calling", strict=True)
    verdict = structured.invoke("Is a queue a list?")
    assert isinstance(verdict, Verdict)


def test_bind_tools_with_a_forced_tool_returns_a_valid_call(chat):
    bound = chat.bind_tools([GetTime], tool_choice="GetTime", strict=True)
    message = bound.invoke("What time is it in Paris?")
    [call] = message.tool_calls
    assert call["name"] == "GetTime"
    assert GetTime.model_validate(call["args"]).zone in ("utc", "cet")
    assert message.response_metadata["finish_reason"] == "stop"


def test_a_streamed_answer_reports_usage(chat):
    chunks = list(chat.stream("hello", stream_usage=True))
    usage = [c.usage_metadata for c in chunks if c.usage_metadata]
    assert usage and usage[-1]["output_tokens"] > 0
    assert "cache_read" in usage[-1].get("input_token_details", {})
