# One case a line reads (and diffs) better than a wrapped one: long lines are kept here.
# ruff: noqa: E501
"""A chat template that loops over a message's content, on the platform and on vLLM's server.

vLLM's server gives such a template (conftest's PARTS_TEMPLATE, written like Llama 4's) each
message's content as a list of parts, where the demo template gets one string; what it writes
differs (it trims each part, and skips none). The platform's prompt must be vLLM's to the
token: each chat case goes to both servers' `/tokenize`, each Messages case to the platform's
`/v1/messages/count_tokens` and to vLLM's `/v1/messages/render` (the tokens vLLM's Messages
server would run), each Responses case to the platform's `/v1/responses/input_tokens` and to
vLLM's `/v1/responses/render`. Add a case by adding a line.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conformance.conftest import PARTS, Targets

pytestmark = pytest.mark.django_db(transaction=False)


def T(text: str | None, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": text, **extra}


CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "lookup", "arguments": '{"q": "x"}'},
}
ASKED = {"role": "assistant", "content": None, "tool_calls": [CALL]}
BILLING = "x-anthropic-billing-header: cc_version=2.1; cch=5f3e1"

CHAT_CASES: dict[str, list[dict[str, Any]]] = {
    "a-string-trimmed": [{"role": "user", "content": "  hello  "}],
    "parts-trimmed-and-joined": [{"role": "user", "content": [T("a "), T(" b")]}],
    "an-empty-part-kept": [{"role": "user", "content": [T("a "), T(""), T("b")]}],
    "a-null-text-skipped": [{"role": "user", "content": [T(None), T(" z")]}],
    "a-string-among-parts": [{"role": "user", "content": ["  a ", T(" b")]}],
    "other-text-parts": [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": " q "},
                {"type": "refusal", "refusal": " r "},
            ],
        }
    ],
    "extra-fields-kept": [
        {"role": "user", "content": [T("cached ", cache_control={"type": "ephemeral"})]}
    ],
    "system-and-user-parts": [
        {"role": "system", "content": [T(" be brief ")]},
        {"role": "user", "content": [T("hi ")]},
    ],
    "null-content-with-calls": [
        {"role": "user", "content": "find x"},
        ASKED,
        {"role": "tool", "tool_call_id": "call_1", "content": "found"},
    ],
    "tool-text-parts-joined": [
        {"role": "user", "content": "find x"},
        ASKED,
        {"role": "tool", "tool_call_id": "call_1", "content": [T("x "), T(""), T(" y")]},
    ],
    "tool-reference-parts": [
        {"role": "user", "content": "find x"},
        ASKED,
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": [{"type": "tool_reference", "name": "get_weather"}],
        },
    ],
    "billing-header-string": [
        {"role": "system", "content": BILLING},
        {"role": "user", "content": "u"},
    ],
    "billing-header-part": [
        {"role": "system", "content": [T(f"{BILLING}\n  stay brief "), T("more")]},
        {"role": "user", "content": "u"},
    ],
    "developer-merged": [
        {"role": "system", "content": [T(" s ")]},
        {"role": "user", "content": "u"},
        {"role": "developer", "content": [T("d"), T("")]},
    ],
    "assistant-parts-continued": [
        {"role": "user", "content": "count"},
        {"role": "assistant", "content": [T("one "), T("two ")]},
    ],
}

WEATHER = {
    "name": "get_weather",
    "description": "The weather.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
MESSAGES_CASES: dict[str, dict[str, Any]] = {
    "messages-blocks": {"system": [{"type": "text", "text": " sys "}], "messages": [{"role": "user", "content": [T("a "), T(" b")]}]},
    "messages-tools": {"tools": [WEATHER], "messages": [{"role": "user", "content": " weather? "}]},
    "messages-tool-use": {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [T(" rain "), T(" cold")]}, T(" thanks ")]},
    ]},
}  # fmt: skip

LOOKUP = {
    "type": "function",
    "name": "lookup",
    "description": "Look it up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}
RESPONSES_CASES: dict[str, dict[str, Any]] = {
    "responses-string": {"input": "  hello  "},
    "responses-parts": {"instructions": " be brief ", "input": [{"role": "user", "content": [{"type": "input_text", "text": " a "}, {"type": "input_text", "text": " b"}]}]},
    # One output part: vLLM's server keeps only the first of several (test_differences.py).
    "responses-assistant-output": {"input": [
        {"role": "user", "content": "count"},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": " one two ", "annotations": []}]},
        {"role": "user", "content": "again"},
    ]},
    "responses-developer": {"input": [{"role": "developer", "content": " d "}, {"role": "user", "content": "u"}]},
    "responses-tool-round-trip": {"tools": [LOOKUP], "input": [
        {"role": "user", "content": "find x"},
        {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"q": "x"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": " found "},
    ]},
}  # fmt: skip


def _tokens(client: Any, path: str, body: dict[str, Any]) -> list[int]:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return list(response.json()["tokens"])


@pytest.mark.parametrize("name", CHAT_CASES)
def test_a_template_that_loops_over_content_gets_the_prompt_vllm_writes(
    parts_targets: Targets, name: str
) -> None:
    messages = CHAT_CASES[name]
    body: dict[str, Any] = {"model": PARTS, "messages": messages}
    if name.endswith("-continued"):
        body |= {"add_generation_prompt": False, "continue_final_message": True}
    ours = _tokens(parts_targets.platform, "/tokenize", body)
    assert ours == _tokens(parts_targets.vllm, "/tokenize", body)


def _counted_and_rendered(
    targets: Targets, counts: str, renders: str, body: dict[str, Any], **rendering: Any
) -> tuple[int, list[int]]:
    """The platform's count of a body's input tokens, and the tokens vLLM renders it to (with
    the fields only a request to render takes)."""
    counted = targets.platform.post(counts, json=body)
    assert counted.status_code == 200, counted.text
    rendered = targets.vllm.post(renders, json={**body, **rendering})
    assert rendered.status_code == 200, rendered.text
    return int(counted.json()["input_tokens"]), list(rendered.json()["token_ids"])


@pytest.mark.parametrize("name", MESSAGES_CASES)
def test_a_messages_prompt_on_a_template_that_loops_counts_as_vllm_renders_it(
    parts_targets: Targets, name: str
) -> None:
    body = {"model": PARTS, **MESSAGES_CASES[name]}
    count, tokens = _counted_and_rendered(
        parts_targets, "/v1/messages/count_tokens", "/v1/messages/render", body, max_tokens=8
    )
    assert count == len(tokens)


@pytest.mark.parametrize("name", RESPONSES_CASES)
def test_a_responses_prompt_on_a_template_that_loops_counts_as_vllm_renders_it(
    parts_targets: Targets, name: str
) -> None:
    body = {"model": PARTS, **RESPONSES_CASES[name]}
    count, tokens = _counted_and_rendered(
        parts_targets, "/v1/responses/input_tokens", "/v1/responses/render", body
    )
    # vLLM's Responses rendering puts the tokenizer's special tokens in front of what the
    # template wrote (an intentional difference: docs/conformance.md); the rest is the prompt.
    special = _tokens(
        parts_targets.vllm, "/tokenize", {"model": PARTS, "prompt": "", "add_special_tokens": True}
    )
    assert tokens[: len(special)] == special
    assert count == len(tokens) - len(special)
