# One case a line reads (and diffs) better than a wrapped one: long lines are kept here.
# ruff: noqa: E501
"""`POST /v1/responses` on the platform, against vLLM's own server.

vLLM 0.32's Responses server tokenises the rendered chat template with the tokenizer's special
tokens added (a BOS in front: one more input token, and with a template that writes its own
BOS, two), where its chat server does not (a known vLLM bug: vllm-project/vllm pull request
38187). The
platform renders a Responses request exactly as the chat request it amounts to. So each case is
sent three ways:

- to the platform's `/v1/responses`;
- as the equivalent chat request (converted here, independently of the platform's own
  conversion) to vLLM's `/v1/chat/completions`: the same prompt tokens, so the same text, tool
  calls, finish (`incomplete: max_output_tokens` is `length`) and usage;
- to vLLM's `/v1/responses`: the same rendering but for its special tokens, so its input tokens
  are the platform's plus exactly what the tokenizer adds (asked of vLLM's `/tokenize`).

Both Responses requests are sent `store: false`: vLLM's server keeps responses in memory only
when told to; what the platform stores is tested in tests/e2e/test_responses.py. A streamed
case is compared through its final event. Add a case by adding a line: a unique name, the body
without `model`, and `stream=True`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conformance.answers import chat_logprobs, logprob_differences
from tests.conformance.conftest import THINKING
from tests.conftest import ALIAS

pytestmark = pytest.mark.django_db(transaction=False)

TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}  # fmt: skip
VERDICT = {"format": {"type": "json_schema", "name": "verdict", "strict": True,
                      "schema": {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}}, "required": ["answer"], "additionalProperties": False}}}  # fmt: skip


@dataclass(frozen=True)
class Case:
    name: str
    body: dict[str, Any]
    stream: bool = False


CASES = [
    Case("text", {"input": "hello", "max_output_tokens": 6, "temperature": 0}),
    Case(
        "cache-salt",
        {"input": "hello", "max_output_tokens": 6, "temperature": 0, "cache_salt": "team-a"},
    ),
    Case(
        "instructions",
        {"input": "hello", "instructions": "Be terse.", "max_output_tokens": 6, "temperature": 0},
    ),
    Case(
        "message-list",
        {"input": [{"role": "user", "content": "hello"}], "max_output_tokens": 6, "temperature": 0},
    ),
    Case(
        "turns",
        {
            "input": [
                {"role": "system", "content": "Be terse."},
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "hi there"},
                {"role": "user", "content": "what is a queue?"},
            ],
            "max_output_tokens": 6,
            "temperature": 0,
        },
    ),
    Case(
        "input-text-parts",
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "hello"},
                        {"type": "input_text", "text": " there"},
                    ],
                }
            ],
            "max_output_tokens": 6,
            "temperature": 0,
        },
    ),
    Case(
        "seeded",
        {"input": "hello", "max_output_tokens": 6, "temperature": 1.0, "top_p": 0.9, "seed": 7},
    ),
    Case(
        "json-schema",
        {
            "input": "Is a queue a list?",
            "text": VERDICT,
            "max_output_tokens": 16,
            "temperature": 0,
        },
    ),
    Case(
        "tool-required",
        {
            "input": "Weather in Paris?",
            "tools": [TOOL],
            "tool_choice": "required",
            "max_output_tokens": 64,
            "temperature": 0,
        },
    ),
    Case(
        "tool-named",
        {
            "input": "Weather in Paris?",
            "tools": [TOOL],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": 64,
            "temperature": 0,
        },
    ),
    Case(
        "text-streamed", {"input": "hello", "max_output_tokens": 6, "temperature": 0}, stream=True
    ),
    Case(
        "logprobs",
        {
            "input": "hello",
            "max_output_tokens": 6,
            "temperature": 0,
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 3,
        },
    ),
    Case(
        "logprobs-no-alternatives",
        {
            "input": "hello",
            "max_output_tokens": 6,
            "temperature": 0,
            "include": ["message.output_text.logprobs"],
        },
    ),
    Case(
        "logprobs-seeded",
        {
            "input": "hello",
            "max_output_tokens": 6,
            "temperature": 1.0,
            "seed": 11,
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 2,
        },
    ),
    Case(
        "logprobs-streamed",
        {
            "input": "hello",
            "max_output_tokens": 6,
            "temperature": 0,
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 2,
        },
        stream=True,
    ),
    Case(
        "logprobs-json-schema",
        {
            "input": "Is a queue a list?",
            "text": VERDICT,
            "max_output_tokens": 16,
            "temperature": 0,
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 1,
        },
    ),
    Case(
        "instructions-streamed",
        {"input": "hello", "instructions": "Be terse.", "max_output_tokens": 6, "temperature": 0},
        stream=True,
    ),
    # vLLM's sampling extras: a stop, and an empty one, which its Responses server reads as none.
    Case("stop", {"input": "hello", "max_output_tokens": 6, "temperature": 0, "stop": " can"}),
    Case("stop-empty", {"input": "hello", "max_output_tokens": 6, "temperature": 0, "stop": ""}),
]


def _body(case: Case) -> dict[str, Any]:
    body: dict[str, Any] = {"model": ALIAS, "store": False, **case.body}
    if case.stream:
        body["stream"] = True
    return body


def _final(client: httpx.Client, case: Case, body: dict[str, Any]) -> dict[str, Any]:
    """The response object as answered, or as its stream's last event carries it."""
    if not case.stream:
        answer = client.post("/v1/responses", json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()
    final: dict[str, Any] = {}
    with client.stream("POST", "/v1/responses", json=body) as answer:
        assert answer.status_code == 200, answer.read()
        for line in answer.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event.get("type") in (
                    "response.completed",
                    "response.incomplete",
                    "response.failed",
                ):
                    final = event["response"]
    return final


def _as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request a Responses body amounts to (OpenAI's mapping of the two APIs)."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    raw = body["input"]
    for item in [{"role": "user", "content": raw}] if isinstance(raw, str) else raw:
        content = item["content"]
        if isinstance(content, list):
            content = [{"type": "text", "text": part["text"]} for part in content]
        messages.append({"role": item["role"], "content": content})
    chat: dict[str, Any] = {
        "model": body["model"],
        "messages": messages,
        "max_tokens": body["max_output_tokens"],
    }
    for name in ("temperature", "top_p", "seed", "logit_bias"):
        if name in body:
            chat[name] = body[name]
    if "message.output_text.logprobs" in body.get("include", []):
        chat.update(logprobs=True, top_logprobs=body.get("top_logprobs", 0))
    form = (body.get("text") or {}).get("format")
    if form is not None:
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {k: form[k] for k in ("name", "schema", "strict")},
        }
    if body.get("tools"):
        chat["tools"] = [
            {
                "type": "function",
                "function": {k: tool[k] for k in ("name", "description", "parameters", "strict")},
            }
            for tool in body["tools"]
        ]
        choice = body.get("tool_choice", "auto")
        chat["tool_choice"] = (
            choice
            if isinstance(choice, str)
            else {"type": "function", "function": {"name": choice["name"]}}
        )
    return chat


def _of_response(response: dict[str, Any]) -> dict[str, Any]:
    """What is compared of a Responses answer."""
    text, calls, logprobs = "", [], []
    for item in response.get("output") or []:
        if item.get("type") == "message":
            text += "".join(part.get("text", "") for part in item.get("content") or [])
            for part in item.get("content") or []:
                logprobs += chat_logprobs(part.get("logprobs") or [])
        elif item.get("type") == "function_call":
            calls.append((item["name"], json.loads(item["arguments"])))
    usage = response.get("usage") or {}
    incomplete = (response.get("incomplete_details") or {}).get("reason")
    return {
        "text": text,
        "tool_calls": calls,
        "cut_short": incomplete == "max_output_tokens",
        "usage": (usage.get("input_tokens"), usage.get("output_tokens")),
        "logprobs": logprobs,
    }


def _of_chat(answer: dict[str, Any]) -> dict[str, Any]:
    """The same of a chat completion."""
    choice = answer["choices"][0]
    message = choice["message"]
    calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message.get("tool_calls") or []
    ]
    usage = answer["usage"]
    return {
        "text": message.get("content") or "",
        "tool_calls": calls,
        "cut_short": choice["finish_reason"] == "length",
        "usage": (usage["prompt_tokens"], usage["completion_tokens"]),
        "logprobs": chat_logprobs((choice.get("logprobs") or {}).get("content") or []),
    }


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_response_is_answered_as_vllm_answers_it(case: Case, targets: Any) -> None:
    body = _body(case)
    ours = _of_response(_final(targets.platform, case, body))
    chat = targets.vllm.post("/v1/chat/completions", json=_as_chat(body))
    assert chat.status_code == 200, chat.text
    vllms = _of_chat(chat.json())
    # Log probabilities: the same tokens, each within the suite's tolerance of vLLM's.
    logprobs, vllm_logprobs = ours.pop("logprobs"), vllms.pop("logprobs")
    assert bool(logprobs) == ("include" in body), f"{case.name}: logprobs {logprobs}"
    mismatch = logprob_differences(case.name, logprobs, vllm_logprobs)
    assert not mismatch, mismatch
    assert ours == vllms, f"{case.name}: platform {ours} vs vLLM's chat {vllms}"
    theirs = _of_response(_final(targets.vllm, case, body))
    special = len(
        targets.vllm.post(
            "/tokenize", json={"model": ALIAS, "prompt": "", "add_special_tokens": True}
        ).json()["tokens"]
    )
    assert theirs["usage"][0] == ours["usage"][0] + special, (
        f"{case.name}: vLLM's Responses server rendered {theirs['usage'][0]} input tokens, the platform {ours['usage'][0]} (+{special} special)"
    )


def test_the_responses_corpus_names_each_case_once() -> None:
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_reasoning_models_thinking_is_a_reasoning_item(
    thinking_targets: Any, stream: bool
) -> None:
    """The reasoning model's thinking comes as a reasoning item before the message: the
    thinking vLLM's chat server splits off the same prompt, and its count of thinking tokens."""
    body: dict[str, Any] = {
        "model": THINKING, "store": False, "input": "hello", "max_output_tokens": 8,
        "temperature": 0, "reasoning": {"effort": "high"},
    }  # fmt: skip
    sent = {**body, "stream": True} if stream else body
    ours = _final(thinking_targets.platform, Case("thinking", sent, stream), sent)
    chat = {**_as_chat(body), "reasoning_effort": "high"}
    theirs = thinking_targets.vllm.post("/v1/chat/completions", json=chat).json()
    message = theirs["choices"][0]["message"]
    [item] = [item for item in ours["output"] if item["type"] == "reasoning"]
    assert item["content"] == [{"type": "reasoning_text", "text": message["reasoning"]}]
    assert item["status"] == "completed" and ours["output"][0] is item
    assert ours["output_text"] == (message["content"] or "")
    details = ours["usage"]["output_tokens_details"]
    assert (
        details["reasoning_tokens"]
        == theirs["usage"]["completion_tokens_details"]["reasoning_tokens"]
    )
    assert ours["usage"]["input_tokens"] == theirs["usage"]["prompt_tokens"]
