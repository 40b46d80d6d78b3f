"""The corpus mutated: one field of a case changed, sent to the platform and to vLLM's server.

The corpus says what both answer to the requests it lists; this says what the platform answers
around them. A seeded walk changes one field of a chat or completions case (a value of another
type, out of range, empty, null, or a field of another request), sometimes a field of one of its
messages, and sends the body to both servers. The platform may refuse what vLLM's server
serves (its refusals name a field; the intentional ones are in the table of differences), but:

- it never answers a 5xx: a body is served or refused, whatever vLLM's server does with it
  (vLLM's own answers some of these with a 500);
- it serves what vLLM's server refuses only where the table of differences says it does: a
  null read as absent, content parts that are plain strings.

Found this way, and now cases of the corpus: an empty text among completions prompts, echo
with max_tokens 0, an empty suffix, empty stream options, an empty tools list.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest

from tests.conformance.cases import CASES, CHAT, COMPLETIONS, PATHS
from tests.conftest import ALIAS

pytestmark = pytest.mark.django_db(transaction=False)

SEED = 60
BODIES = 120
FIELDS = [
    "temperature", "top_p", "top_k", "min_p", "max_tokens", "n", "presence_penalty", "seed",
    "stop", "stop_token_ids", "logprobs", "top_logprobs", "logit_bias", "response_format",
    "tools", "tool_choice", "stream_options", "echo", "suffix", "prompt_logprobs", "min_tokens",
    "skip_special_tokens", "include_stop_str_in_output", "ignore_eos", "add_generation_prompt",
    "add_special_tokens", "chat_template_kwargs", "truncate_prompt_tokens", "bad_words",
    "return_token_ids", "functions", "function_call", "service_tier", "user", "metadata",
]  # fmt: skip
VALUES: list[Any] = [
    None, -1, 0, 1, 2, 0.5, 1.5, -0.5, 2**31, 1e308, "x", "", [], [1], ["a"], [[1]], {},
    {"a": 1}, True, False, "1", [None], [""], {"type": "x"}, 21, ["s"] * 40,
]  # fmt: skip
MESSAGE_FIELDS = ["role", "content", "name", "tool_calls", "tool_call_id", "reasoning"]
MESSAGE_VALUES: list[Any] = [
    *VALUES, "system", "tool", "assistant", [{"type": "text", "text": "x"}], [{"type": "x"}],
    [{"type": "text"}], ["hel", "lo"],
]  # fmt: skip
SHAPES = [case for case in CASES if case.endpoint in (CHAT, COMPLETIONS) and not case.thinking]


def _mutated(rng: random.Random) -> tuple[str, dict[str, Any], str, Any]:
    """A case's body with one field changed: the path, the body, the field and its value."""
    case = rng.choice(SHAPES)
    body: dict[str, Any] = {"model": ALIAS, **copy.deepcopy(case.body)}
    if case.stream:
        body["stream"] = True
        body.setdefault("stream_options", {"include_usage": True})
    messages = body.get("messages")
    if isinstance(messages, list) and rng.random() < 0.3:
        message = rng.choice(messages)
        name, value = rng.choice(MESSAGE_FIELDS), copy.deepcopy(rng.choice(MESSAGE_VALUES))
        message[name] = value
        return PATHS[case.endpoint], body, f"messages.{name}", value
    name, value = rng.choice(FIELDS + list(body)), copy.deepcopy(rng.choice(VALUES))
    body[name] = value
    if name != "max_tokens" and isinstance(body.get("max_tokens"), int):
        body["max_tokens"] = min(body["max_tokens"], 8)
    return PATHS[case.endpoint], body, name, value


def _documented_leniency(field: str, value: Any) -> bool:
    """What the platform serves and vLLM's server refuses, by the table of differences."""
    if value is None:
        return True  # test_a_null_field_is_read_as_absent
    # test_content_parts_that_are_all_plain_strings_are_read_as_text_parts
    return field == "messages.content" and isinstance(value, list) and bool(value)


def test_a_mutated_request_is_served_or_refused_never_failed(targets: Any) -> None:
    rng = random.Random(SEED)
    found = []
    for _ in range(BODIES):
        path, body, field, value = _mutated(rng)
        ours, theirs = targets.platform.post(path, json=body), targets.vllm.post(path, json=body)
        wrong = ours.status_code >= 500 or (
            theirs.status_code == 400
            and ours.status_code == 200
            and not _documented_leniency(field, value)
        )
        if wrong:
            found.append(
                f"{field}={json.dumps(value)[:60]}: {ours.status_code} against vLLM's "
                f"{theirs.status_code} ({ours.text[:160]} | {theirs.text[:160]}) for "
                f"{json.dumps(body)[:300]}"
            )
    assert not found, "\n".join(found)
