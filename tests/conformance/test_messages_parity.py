# One case a line reads (and diffs) better than a wrapped one: long lines are kept here.
# ruff: noqa: E501
"""`POST /v1/messages` and `/v1/messages/count_tokens` on the platform, against vLLM's own server.

Each case goes to both servers' Messages API. Compared: the status (a refusal: only that); the
content blocks in order (type; text and thinking; a tool_use's name and input, parsed), the
stop_reason and stop_sequence, and the usage. What a prefix cache holds differs between the two
engines, so the first answers' prompt is compared as a whole (input, cache read and cache
creation tokens together) and the case is sent again: the second answers' four counts must be
equal. A streamed case is reassembled first (each block from its start event and its deltas,
the end from `message_delta`), and must begin with `message_start` and end with
`message_stop`. Ids and signatures are random on both sides and are not compared. Add a case by
adding a line: a unique name, the body without `model`, `stream=True` for a stream and
`thinking=True` for the reasoning model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conformance.conftest import THINKING
from tests.conftest import ALIAS

pytestmark = pytest.mark.django_db(transaction=False)

HELLO = [{"role": "user", "content": "Hello there"}]
G = {"temperature": 0, "max_tokens": 6}
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip
TIME = {"name": "get_time", "description": "The time in a zone.", "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}  # fmt: skip
# A tool search (vLLM's): deferred tools, added and removed by system messages, found by a tool.
ADD_WEATHER = {
    "role": "system",
    "content": [
        {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "get_weather"}}
    ],
}
DROP_TIME = {
    "role": "system",
    "content": [
        {"type": "text", "text": "Fewer tools now."},
        {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "get_time"}},
    ],
}
DEFINE_TIME = {
    "role": "system",
    "content": [{"type": "tool_addition", "tool": {"type": "tool_definition", "definition": TIME}}],
}
FOUND = [
    {"role": "user", "content": "Find a weather tool."},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_2", "name": "tool_search", "input": {"query": "weather"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "One found."}, {"type": "tool_reference", "tool_name": "get_weather"}]}]},
]  # fmt: skip
ROUND_TRIP = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}, {"type": "text", "text": "21C"}]}, {"type": "text", "text": "And tomorrow?"}]},
]  # fmt: skip


@dataclass(frozen=True)
class Case:
    name: str
    body: dict[str, Any]
    stream: bool = False
    thinking: bool = False
    count: bool = False  # a count_tokens body


# fmt: off
CASES = [
    Case("text", {**G, "messages": HELLO}),
    Case("text-stream", {**G, "messages": HELLO}, stream=True),
    Case("system", {**G, "system": "Be terse.", "messages": HELLO}),
    Case("system-blocks", {**G, "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=5f1a;"}, {"type": "text", "text": "Be terse. "}, {"type": "text", "text": "Answer well.", "cache_control": {"type": "ephemeral"}}], "messages": HELLO}),
    Case("text-blocks", {**G, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}]}),
    Case("turns", {**G, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "what is a queue?"}]}),
    Case("inline-system", {**G, "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "Be terse."}, {"role": "user", "content": "what is a queue?"}]}),
    Case("top-k", {"temperature": 1.0, "top_k": 1, "max_tokens": 6, "messages": HELLO}),
    Case("top-p", {"temperature": 1.0, "top_p": 1e-06, "max_tokens": 6, "messages": HELLO}),
    Case("stop-sequence", {**G, "max_tokens": 8, "stop_sequences": ["odule"], "messages": HELLO}),
    Case("stop-sequence-stream", {**G, "max_tokens": 8, "stop_sequences": ["odule"], "messages": HELLO}, stream=True),
    Case("stop-sequence-unmet", {**G, "stop_sequences": ["zzzz"], "messages": HELLO}),
    Case("tool-history", {**G, "tools": [WEATHER], "messages": ROUND_TRIP}),
    Case("tool-auto", {**G, "max_tokens": 40, "tools": [WEATHER], "messages": HELLO}),
    Case("tool-any", {**G, "max_tokens": 40, "tools": [WEATHER], "tool_choice": {"type": "any"}, "messages": HELLO}),
    Case("tool-any-stream", {**G, "max_tokens": 40, "tools": [WEATHER], "tool_choice": {"type": "any"}, "messages": HELLO}, stream=True),
    Case("tool-named", {**G, "max_tokens": 40, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"}, "messages": HELLO}),
    Case("tool-named-stream", {**G, "max_tokens": 40, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"}, "messages": HELLO}, stream=True),
    Case("tool-none", {**G, "tools": [WEATHER], "tool_choice": {"type": "none"}, "messages": HELLO}),
    Case("tool-not-parallel", {**G, "max_tokens": 40, "tools": [WEATHER], "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "messages": HELLO}),
    Case("json-schema", {**G, "max_tokens": 12, "output_config": {"format": {"type": "json_schema", "schema": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}, "messages": HELLO}),
    Case("effort", {**G, "output_config": {"effort": "low"}, "messages": HELLO}),
    Case("thinking-disabled", {**G, "thinking": {"type": "disabled"}, "messages": HELLO}),
    Case("thinking-adaptive", {**G, "thinking": {"type": "adaptive"}, "messages": HELLO}),
    Case("history-thinking", {**G, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "thinking", "thinking": "They greet me.", "signature": "abc"}, {"type": "redacted_thinking", "data": "opaque"}, {"type": "text", "text": "hello"}]}, {"role": "user", "content": "and?"}]}),
    Case("assistant-tool-result", {**G, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "done"}]}, {"role": "user", "content": "and?"}]}),
    Case("chat-template-kwargs", {**G, "chat_template_kwargs": {"enable_thinking": False}, "messages": HELLO}),
    Case("cache-salt", {**G, "cache_salt": "team-a", "messages": HELLO}),
    Case("assistant-prefill", {**G, "messages": [*HELLO, {"role": "assistant", "content": "Well,"}]}),
    Case("assistant-empty-blocks", {**G, "messages": [*HELLO, {"role": "assistant", "content": []}, {"role": "user", "content": "and?"}]}),
    Case("user-empty-text-block", {**G, "messages": [{"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "hi"}]}]}),
    Case("count", {"messages": HELLO}, count=True),
    Case("count-tools", {"tools": [WEATHER], "system": "Be terse.", "messages": ROUND_TRIP}, count=True),
    Case("count-thinking-disabled", {"thinking": {"type": "disabled"}, "messages": HELLO}, count=True),
    Case("count-tools-deferred", {"tools": [{**WEATHER, "defer_loading": True}, {**TIME, "defer_loading": False}], "messages": HELLO}, count=True),
    Case("count-tool-search-changes", {"tools": [{**WEATHER, "defer_loading": True}, TIME], "messages": [*HELLO, ADD_WEATHER, DROP_TIME, {"role": "user", "content": "and?"}]}, count=True),
    Case("count-tool-search-definition", {"tools": [WEATHER], "messages": [*HELLO, DEFINE_TIME, {"role": "user", "content": "and?"}]}, count=True),
    Case("count-tool-search-no-tools", {"messages": [*HELLO, DEFINE_TIME, {"role": "user", "content": "and?"}]}, count=True),
    Case("count-tool-reference", {"tools": [{**WEATHER, "defer_loading": True}], "messages": FOUND}, count=True),
    Case("tool-search", {**G, "tools": [{**WEATHER, "defer_loading": True}, TIME], "messages": [*FOUND, ADD_WEATHER, DROP_TIME, {"role": "user", "content": "and?"}]}),
    Case("tool-search-stream", {**G, "tools": [{**WEATHER, "defer_loading": True}], "messages": [*FOUND, ADD_WEATHER]}, stream=True),
    # Refused by both.
    Case("bad-tool-removal-undeclared", {**G, "tools": [WEATHER], "messages": [*HELLO, {"role": "system", "content": [{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "get_time"}}]}]}),
    Case("bad-tool-addition-in-user", {**G, "tools": [WEATHER], "messages": [{"role": "user", "content": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "get_weather"}}]}]}),
    Case("bad-tool-removal-definition", {**G, "messages": [*HELLO, {"role": "system", "content": [{"type": "tool_removal", "tool": {"type": "tool_definition", "definition": TIME}}]}]}),
    Case("bad-max-tokens-zero", {**G, "max_tokens": 0, "messages": HELLO}),
    Case("bad-max-tokens-missing", {"temperature": 0, "messages": HELLO}),
    Case("bad-messages-missing", {**G}),
    Case("bad-messages-empty", {**G, "messages": []}),
    Case("bad-system-type", {**G, "system": 5, "messages": HELLO}),
    Case("bad-role", {**G, "messages": [{"role": "tool", "content": "x"}]}),
    Case("bad-block-type", {**G, "messages": [{"role": "user", "content": [{"type": "video"}]}]}),
    Case("bad-thinking-budget-small", {**G, "max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 1000}, "messages": HELLO}),
    Case("bad-thinking-budget-over-max", {**G, "max_tokens": 1024, "thinking": {"type": "enabled", "budget_tokens": 1024}, "messages": HELLO}),
    Case("bad-thinking-without-parser", {**G, "max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 1024}, "messages": HELLO}),
    Case("bad-tool-choice-without-name", {**G, "tools": [WEATHER], "tool_choice": {"type": "tool"}, "messages": HELLO}),
    Case("bad-tool-choice-type", {**G, "tools": [WEATHER], "tool_choice": {"type": "sometimes"}, "messages": HELLO}),
    Case("bad-tool-without-schema", {**G, "tools": [{"name": "f"}], "messages": HELLO}),
    Case("bad-effort", {**G, "output_config": {"effort": "extreme"}, "messages": HELLO}),
    # A reasoning model: its thinking is a thinking block before the text.
    Case("think-adaptive", {**G, "max_tokens": 8, "thinking": {"type": "adaptive"}, "messages": HELLO}, thinking=True),
    Case("think-default-stream", {**G, "max_tokens": 8, "messages": HELLO}, stream=True, thinking=True),
    Case("think-disabled", {**G, "thinking": {"type": "disabled"}, "messages": HELLO}, thinking=True),
    Case("think-disabled-stream", {**G, "thinking": {"type": "disabled"}, "messages": HELLO}, stream=True, thinking=True),
    Case("think-history", {**G, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "thinking", "thinking": "A greeting.", "signature": "s"}, {"type": "text", "text": "hello"}]}, {"role": "user", "content": "and?"}]}, thinking=True),
]
# fmt: on


def _events(text: str) -> list[dict[str, Any]]:
    """A stream's events, each the JSON of its `data:` line."""
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


def _input_of(partial: str) -> Any:
    try:
        return json.loads(partial)
    except ValueError:
        return partial  # cut off: compared as the text written


def _blocks(content: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    shaped: list[tuple[Any, ...]] = []
    for block in content:
        if block["type"] == "tool_use":
            shaped.append(("tool_use", block["name"], block["input"]))
        else:
            shaped.append((block["type"], block.get(block["type"])))
    return shaped


@dataclass(frozen=True)
class Answer:
    status: int
    blocks: list[tuple[Any, ...]]
    stop: tuple[Any, Any]
    usage: dict[str, int]
    started_with: int | None = None  # a stream's message_start input tokens


def _answer(response: Any, case: Case) -> Answer:
    if response.status_code != 200:
        return Answer(response.status_code, [], (None, None), {})
    if case.count:
        return Answer(200, [], (None, None), {"input_tokens": response.json()["input_tokens"]})
    if not case.stream:
        body = response.json()
        stop = (body["stop_reason"], body.get("stop_sequence"))
        return Answer(200, _blocks(body["content"]), stop, body["usage"])
    events = _events(response.text)
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    blocks: dict[int, dict[str, Any]] = {}
    end: dict[str, Any] = {}
    for event in events:
        if event["type"] == "content_block_start":
            start = event["content_block"]
            blocks[event["index"]] = {**start, "partial": ""}
        elif event["type"] == "content_block_delta":
            block, delta = blocks[event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                block["partial"] += delta["partial_json"]
            else:
                assert delta["type"] == "signature_delta" and block["type"] == "thinking"
                block["signed"] = True
        elif event["type"] == "message_delta":
            end = event
    content = []
    for index in sorted(blocks):
        block = blocks[index]
        if block["type"] == "tool_use":
            block["input"] = _input_of(block["partial"])
        if block["type"] == "thinking":
            assert block.get("signed"), "a thinking block ends with its signature"
        content.append(block)
    stop = (end["delta"]["stop_reason"], end["delta"]["stop_sequence"])
    started = events[0]["message"]["usage"]["input_tokens"]
    return Answer(200, _blocks(content), stop, end["usage"], started_with=started)


def _sent(targets: Any, case: Case) -> tuple[Answer, Answer]:
    path = "/v1/messages/count_tokens" if case.count else "/v1/messages"
    model = THINKING if case.thinking else ALIAS
    body = {"model": model, **case.body} | ({"stream": True} if case.stream else {})
    ours = targets.platform.post(path, json=body)
    theirs = targets.vllm.post(path, json=body)
    return _answer(ours, case), _answer(theirs, case)


def _prompt(usage: dict[str, int]) -> int:
    parts = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    return sum(usage.get(part, 0) for part in parts)


def _differences(case: Case, ours: Answer, theirs: Answer) -> list[str]:
    if ours.status != theirs.status:
        return [f"status {ours.status} vs vLLM's {theirs.status}"]
    if ours.status != 200:
        return []
    found = []
    if ours.blocks != theirs.blocks:
        found.append(f"content {ours.blocks} vs vLLM's {theirs.blocks}")
    if ours.stop != theirs.stop:
        found.append(f"stop {ours.stop} vs vLLM's {theirs.stop}")
    if _prompt(ours.usage) != _prompt(theirs.usage):
        found.append(f"prompt tokens {ours.usage} vs vLLM's {theirs.usage}")
    if ours.usage.get("output_tokens") != theirs.usage.get("output_tokens"):
        found.append(f"output tokens {ours.usage} vs vLLM's {theirs.usage}")
    if ours.started_with != theirs.started_with:
        found.append(
            f"message_start input tokens {ours.started_with} vs vLLM's {theirs.started_with}"
        )
    return found


def _compare(case: Case, targets: Any) -> None:
    ours, theirs = _sent(targets, case)
    found = _differences(case, ours, theirs)
    if not found and ours.status == 200 and not case.count:
        again, theirs_again = _sent(targets, case)
        if again.usage != theirs_again.usage:
            found.append(f"usage of a repeat {again.usage} vs vLLM's {theirs_again.usage}")
    assert not found, f"{case.name}: " + "; ".join(found)


@pytest.mark.parametrize("case", [c for c in CASES if not c.thinking], ids=lambda c: c.name)
def test_messages_are_answered_as_vllm_answers_them(case: Case, targets: Any) -> None:
    _compare(case, targets)


@pytest.mark.parametrize("case", [c for c in CASES if c.thinking], ids=lambda c: c.name)
def test_a_reasoning_models_messages_are_answered_as_vllm_answers_them(
    case: Case, thinking_targets: Any
) -> None:
    _compare(case, thinking_targets)


def test_the_messages_corpus_names_each_case_once() -> None:
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))
