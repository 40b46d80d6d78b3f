"""`POST /tokenize` and `/detokenize` on the platform, against vLLM's own server.

Each case goes to both servers. Compared: the status (a refusal: only that), and for an answer
the whole body: the token ids, their count, the token strings when asked for and
`max_model_len` (/tokenize), the text (/detokenize).
Add a case by adding a line: a unique name and the body without `model` (names of refusals
begin with `bad-`). Where /tokenize differs on purpose (what a chat request would refuse, or a
field it would drop), the test is in test_differences.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conformance.cases import CALLED, HELLO, PROMPT, TOOLS, TURNS
from tests.conformance.conftest import Targets
from tests.conftest import ALIAS

pytestmark = pytest.mark.django_db(transaction=False)

CASES: dict[str, dict[str, Any]] = {
    "prompt": {"prompt": PROMPT},
    "prompt-without-special-tokens": {"prompt": PROMPT, "add_special_tokens": False},
    "prompt-token-strings": {"prompt": PROMPT, "return_token_strs": True},
    "messages": {"messages": TURNS},
    "messages-with-special-tokens": {"messages": HELLO, "add_special_tokens": True},
    "messages-without-generation-prompt": {"messages": TURNS, "add_generation_prompt": False},
    "messages-continued": {
        "messages": [*HELLO, {"role": "assistant", "content": "One, two"}],
        "add_generation_prompt": False,
        "continue_final_message": True,
    },
    "messages-token-strings": {"messages": HELLO, "return_token_strs": True},
    "messages-with-tools": {"messages": HELLO, "tools": TOOLS},
    "messages-with-a-tool-round-trip": {"messages": CALLED, "tools": TOOLS},
    "messages-with-no-tools": {"messages": HELLO, "tools": []},
    "messages-thinking-on": {"messages": HELLO, "chat_template_kwargs": {"enable_thinking": True}},
    "messages-thinking-off": {
        "messages": HELLO,
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "messages-unread-template-variable": {
        "messages": HELLO,
        "chat_template_kwargs": {"house_style": "terse"},
    },
    "bad-neither": {},
    "bad-template": {"messages": HELLO, "chat_template": "{{ 'x' }}"},
    "bad-template-variable-messages": {"messages": HELLO, "chat_template_kwargs": {"messages": []}},
    "bad-generation-and-continued": {
        "messages": HELLO,
        "add_generation_prompt": True,
        "continue_final_message": True,
    },
    "bad-tool-without-function": {"messages": HELLO, "tools": [{"type": "function"}]},
}


def _answered_alike(targets: Targets, path: str, name: str, fields: dict[str, Any]) -> None:
    body = {"model": ALIAS, **fields}
    ours, theirs = targets.platform.post(path, json=body), targets.vllm.post(path, json=body)
    expected = 400 if name.startswith("bad-") else 200
    assert (ours.status_code, theirs.status_code) == (expected, expected), (
        f"{ours.text} vs vLLM's {theirs.text}"
    )
    if expected == 200:
        assert ours.json() == theirs.json()


@pytest.mark.parametrize("name", CASES)
def test_tokenize_answers_as_vllm_does(targets: Targets, name: str) -> None:
    _answered_alike(targets, "/tokenize", name, CASES[name])


DETOKENIZE_CASES: dict[str, dict[str, Any]] = {
    "tokens": {"tokens": [2430, 203, 407]},
    "special-tokens": {"tokens": [2, 2430, 203, 407, 3, 1]},
    "no-tokens": {"tokens": []},
    "bad-negative": {"tokens": [-1]},
    "bad-missing": {},
}


@pytest.mark.parametrize("name", DETOKENIZE_CASES)
def test_detokenize_answers_as_vllm_does(targets: Targets, name: str) -> None:
    _answered_alike(targets, "/detokenize", name, DETOKENIZE_CASES[name])
