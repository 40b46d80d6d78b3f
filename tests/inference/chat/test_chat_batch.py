"""vLLM's /v1/chat/completions/batch, as the frontend reads it: conversations, each one chat."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from inference.base.errors import ApiError
from inference.chat.format import shape_of
from inference.chat.protocol import CHAT_BATCH_FIELDS, chat_batch_parse
from inference.pipeline.submission import prompt_logprobs_asked
from tests.inference.body.test_parser import _pydantic_fields

HELLO = [{"role": "user", "content": "hello"}]
TURNS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure:"}]


def _batch(*conversations, **fields):
    return {"model": "m", "messages": list(conversations) or [HELLO, TURNS], **fields}


def _error(body) -> ApiError:
    with pytest.raises(ApiError) as caught:
        chat_batch_parse(body)
    return caught.value


def test_each_conversation_is_read_as_a_chats_messages():
    request = chat_batch_parse(_batch(temperature=0, max_tokens=4, stop_token_ids=[7]))
    assert request.chats() == (HELLO, TURNS)
    assert request.messages == HELLO  # the first, as `prompt` is a completions' first prompt
    assert (request.temperature, request.max_tokens, request.stop_token_ids) == (0, 4, (7,))
    assert (request.n, request.stream) == (1, False)


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (None, "messages"),
        ([], "messages"),
        (HELLO, "messages[0]"),  # one chat's messages, not conversations
        ([HELLO, []], "messages[1]"),
        ([HELLO, [{"role": "robot", "content": "x"}]], "messages[1][0].role"),
        ([HELLO, [{"role": "user", "content": 7}]], "messages[1][0].content"),
        ([HELLO] * 129, "messages"),
    ],
)
def test_a_bad_conversation_is_refused_naming_it(messages, param):
    body = {"model": "m"} if messages is None else {"model": "m", "messages": messages}
    error = _error(body)
    assert (error.status, error.param) == (400, param)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stream", True),
        ("stream_options", {"include_usage": True}),
        ("n", 2),
        ("use_beam_search", True),
        ("early_stopping", True),
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("tool_choice", "required"),
        ("functions", [{"name": "f"}]),
        ("prompt_logprobs", 1),
        ("return_prompt_text", True),
        ("suffix", "x"),
        ("colour", "red"),
    ],
)
def test_what_its_answer_has_no_place_for_is_refused_naming_it(field, value):
    error = _error(_batch(**{field: value}))
    assert (error.status, error.code, error.param) == (400, "unsupported_parameter", field)


def test_the_values_that_ask_for_nothing_pass():
    chat_batch_parse(_batch(stream=False, n=1, tool_choice="none", use_beam_search=False))


def test_the_rules_between_a_chats_fields_hold():
    error = _error(_batch(continue_final_message=True))  # add_generation_prompt is true
    assert error.param == "continue_final_message"
    assert _error(_batch(top_logprobs=2)).param == "top_logprobs"  # without logprobs


def test_each_choice_echoes_and_answers_in_the_role_of_its_own_conversation():
    request = chat_batch_parse(
        _batch(HELLO, TURNS, echo=True, add_generation_prompt=False, continue_final_message=True)
    )
    shape = shape_of(request, decode=lambda ids: "")
    # Without a generation prompt each answer continues its last message, in that one's role.
    assert (shape.prompts, shape.choices, shape.echo) == (2, 2, ("hello", "Sure:"))
    assert (shape.role(0), shape.role(1)) == ("user", "assistant")
    assert shape.batch
    plain = shape_of(chat_batch_parse(_batch(HELLO, TURNS, echo=True)), decode=lambda ids: "")
    assert plain.echo == ("", "Sure:") and plain.role(0) == plain.role(1) == "assistant"


def test_an_echo_does_not_score_the_prompts_it_has_no_place_to_show():
    request = chat_batch_parse(_batch(echo=True, logprobs=True, top_logprobs=2))
    assert prompt_logprobs_asked(request) is None


def test_every_field_of_vllms_batch_request_has_a_decision():
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    protocol = Path(spec.origin).parent / "entrypoints/openai/chat_completion/protocol.py"
    fields = _pydantic_fields([protocol], "BatchChatCompletionRequest")
    assert {"messages", "n", "echo", "use_beam_search"} <= fields
    assert fields - set(CHAT_BATCH_FIELDS) == set()
