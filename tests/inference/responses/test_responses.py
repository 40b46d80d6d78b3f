"""The Responses API's translation: input items to messages, chat's errors to its fields,
and the engine's events to the Responses events in OpenAI's order."""

from __future__ import annotations

from typing import Any

import pytest

from dataplane.types import Delta, Failed, Finished, TokenLogprob, ToolCallDelta, TopLogprob
from inference.base.errors import ApiError
from inference.body.fields import CHAT
from inference.body.inputs import MAX_MESSAGES
from inference.body.parser import generation_parse
from inference.pipeline.tokenization import kept_from, turn_starts
from inference.responses.format import ResponseBuilder
from inference.responses.protocol import (
    OUTPUT_LOGPROBS,
    batch_line_parse,
    chat_error_renamed,
    count_parse,
    input_items_read,
    messages_of,
    responses_parse,
)
from inference.responses.store import Kept
from models_registry.tokenizer import CONTENT_PARTS


def test_items_become_messages_with_calls_joined_to_the_assistant_turn():
    items = input_items_read(
        [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "time?"}]},
            {"type": "function_call", "call_id": "c1", "name": "clock", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "zone", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "12:00"},
        ],
        response_id="resp_x",
    )
    assert [item["id"] for item in items] == [f"item_x_in{i}" for i in range(5)]
    assert messages_of(items) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "time?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "clock", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "zone", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    ]


def test_a_chain_rebuilds_every_earlier_turn_but_not_its_instructions():
    earlier = Kept(
        id="resp_a",
        previous_id="",
        body={
            "instructions": "old rules",
            "output": [{"type": "message", "role": "assistant", "content": [{"text": "Hi Ada."}]}],
        },
        input_items=input_items_read("I am Ada.", response_id="resp_a"),
    )
    parsed = responses_parse(
        {"model": "m", "input": "Who am I?", "instructions": "new rules"},
        response_id="resp_b",
        history=[earlier],
    )
    assert parsed.chat.messages == [
        {"role": "system", "content": "new rules"},
        {"role": "user", "content": "I am Ada."},
        {"role": "assistant", "content": "Hi Ada."},
        {"role": "user", "content": "Who am I?"},
    ]


def test_a_conversations_items_are_the_history_and_the_response_names_it():
    items = input_items_read(
        [
            {"role": "user", "content": "I am Ada."},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Hi Ada."}],
            },
        ],
        response_id="resp_c",
    )
    parsed = responses_parse(
        {
            "model": "m",
            "input": "Who am I?",
            "instructions": "rules",
            "conversation": {"id": "conv_x"},
        },
        response_id="resp_d",
        history=[],
        conversation=items,
    )
    assert parsed.chat.messages == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "I am Ada."},
        {"role": "assistant", "content": "Hi Ada."},
        {"role": "user", "content": "Who am I?"},
    ]
    assert parsed.echo["conversation"] == {"id": "conv_x"}
    # Only this turn's input is its own: the conversation's items are not input items again.
    assert [item["id"] for item in parsed.input_items] == ["item_d_in0"]
    with pytest.raises(ApiError) as refused:
        batch_line_parse({"model": "m", "input": "hi", "conversation": "conv_x"}, response_id="r")
    assert refused.value.param == "body.conversation"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_output_tokens": -1}, "max_output_tokens"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": 3}}}, "text.format"),
        ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ],
)
def test_chats_errors_name_the_responses_field(body, param):
    with pytest.raises(ApiError) as refused:
        responses_parse({"model": "m", "input": "hi", **body}, response_id="resp_x", history=[])
    assert refused.value.status == 400
    assert refused.value.param is not None and refused.value.param.startswith(param)


COUNT = {
    "model": "m",
    "input": [{"role": "user", "content": "time?"}],
    "instructions": "Be brief.",
    "tools": [{"type": "function", "name": "clock", "parameters": {"type": "object"}}],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "text": {"format": {"type": "json_object"}},
    "reasoning": {"effort": "low"},
    "truncation": "auto",
    "conversation": None,
    "personality": None,
}


def test_a_count_reads_its_fields_as_a_create_does():
    counted = count_parse(COUNT, history=[])
    created = responses_parse(
        {k: v for k, v in COUNT.items() if k not in ("conversation", "personality")},
        response_id="resp_x",
        history=[],
    ).chat
    assert counted == created
    assert counted.messages is not None and counted.messages[0]["content"] == "Be brief."


@pytest.mark.parametrize(
    ("body", "param"),
    [
        # A create's fields that have no bearing on the prompt are not a count's.
        ({"max_output_tokens": 8}, "max_output_tokens"),
        ({"stream": True}, "stream"),
        ({"temperature": 0}, "temperature"),
        ({"conversation": 5}, "conversation"),
        ({"conversation": {"id": "conv_1", "x": 1}}, "conversation"),
        ({"conversation": "conv_1", "previous_response_id": "resp_1"}, "conversation"),
        ({"personality": "friendly"}, "personality"),
        ({"colour": "red"}, "colour"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"input": None}, "input"),
    ],
)
def test_a_count_refuses_what_it_does_not_read_naming_the_field(body, param):
    with pytest.raises(ApiError) as refused:
        count_parse({"model": "m", "input": "hi", **body}, history=[])
    assert (refused.value.status, refused.value.param) == (400, param)


def _builder() -> ResponseBuilder:
    return ResponseBuilder(response_id="resp_r", model="m", echo={}, created_at=1)


def test_text_then_a_call_close_the_message_before_the_call_opens():
    builder = _builder()
    kinds = [e["type"] for e in builder.start()]
    kinds += [e["type"] for e in builder.delta(Delta(text="Let me look.", tokens=3))]
    call = ToolCallDelta(index=0, id="call_1", name="clock", arguments='{"z":')
    kinds += [e["type"] for e in builder.delta(Delta(text="", tokens=2, tool_calls=[call]))]
    more = ToolCallDelta(index=0, arguments='"utc"}')
    kinds += [e["type"] for e in builder.delta(Delta(text="", tokens=2, tool_calls=[more]))]
    ended = builder.end(Finished(finish_reason="stop", prompt_tokens=5, completion_tokens=7))
    kinds += [e["type"] for e in ended]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    body = ended[-1]["response"]
    assert body["status"] == "completed" and body["output_text"] == "Let me look."
    assert body["output"][1] == {
        "type": "function_call",
        "id": "fc_r_0",
        "call_id": "call_1",
        "name": "clock",
        "arguments": '{"z":"utc"}',
        "status": "completed",
    }
    assert body["usage"]["total_tokens"] == 12


def test_a_failed_request_ends_as_failed_with_its_error():
    builder = _builder()
    builder.delta(Delta(text="par", tokens=1))
    [*_, last] = builder.end(
        Failed(code="deadline_exceeded", message="Too slow.", prompt_tokens=3, completion_tokens=1)
    )
    assert last["type"] == "response.failed"
    assert last["response"]["error"] == {"code": "deadline_exceeded", "message": "Too slow."}
    assert last["response"]["output"][0]["status"] == "completed"  # closed, never left open


def test_truncation_drops_the_oldest_turn_with_its_tool_answers_and_keeps_the_instructions():
    system: dict[str, Any] = {"role": "system", "content": "rules"}
    call: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}
    answer: dict[str, Any] = {"role": "tool", "tool_call_id": "c", "content": "12:00"}
    last: dict[str, Any] = {"role": "user", "content": "now?"}
    conversation = [system, call, answer, last]
    assert turn_starts(conversation) == [1, 3]
    assert kept_from(conversation, 3) == [system, last]
    assert turn_starts([system, last]) == [1]  # only the newest is left: nothing to drop
    assert [kept_from([call, last], s) for s in turn_starts([call, last])] == [[call, last], [last]]
    # A conversation longer than a prompt may hold starts at its newest turns that fit it.
    many = [system] + [{"role": "user", "content": str(i)} for i in range(10)]
    assert kept_from(many, turn_starts(many, most=4)[0]) == [system, *many[-3:]]


def test_a_turn_past_the_most_messages_a_request_holds_is_refused_or_truncated():
    many = [{"role": "user", "content": "a"}] * (MAX_MESSAGES + 1)
    with pytest.raises(ApiError) as refused:
        responses_parse({"model": "m", "input": many}, response_id="resp_x", history=[])
    assert refused.value.param == "input" and refused.value.code == "array_above_max_length"
    # A long history (a conversation's items) is cut to its newest turns with truncation auto,
    # and named without it.
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]}
    ] * MAX_MESSAGES
    body = {"model": "m", "input": "and now?", "conversation": "conv_1"}
    with pytest.raises(ApiError) as refused:
        responses_parse(body, response_id="resp_x", history=[], conversation=history)
    assert refused.value.param == "conversation"
    parsed = responses_parse(
        {**body, "truncation": "auto", "instructions": "Be brief."},
        response_id="resp_x",
        history=[],
        conversation=history,
    )
    messages = parsed.chat.messages or []
    assert len(messages) == MAX_MESSAGES and parsed.chat.truncate_turns
    assert messages[0]["role"] == "system" and messages[-1]["content"] == "and now?"


def test_a_messages_text_parts_are_kept_apart_and_joined_by_a_newline_as_chat_joins_them():
    items = input_items_read(
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "hello"},
                    {"type": "input_text", "text": "there"},
                ],
            }
        ],
        response_id="resp_x",
    )
    assert [part["text"] for part in items[0]["content"]] == ["hello", "there"]
    # Chat's text parts: kept apart for a template that loops over content, and joined by
    # a newline for one that takes a string.
    parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}]
    assert messages_of(items) == [{"role": "user", "content": parts}]
    chat = generation_parse({"model": "m", "messages": messages_of(items)}, endpoint=CHAT)
    assert chat.messages == [{"role": "user", "content": "hello\nthere", CONTENT_PARTS: parts}]


# --- the output text's log probabilities (include + top_logprobs) ---


def _parsed(**body):
    return responses_parse({"model": "m", "input": "hi", **body}, response_id="resp_x", history=[])


def test_included_logprobs_ask_chat_for_them_with_their_alternatives():
    parsed = _parsed(include=[OUTPUT_LOGPROBS], top_logprobs=3)
    assert parsed.chat.logprobs == 3 and parsed.echo["top_logprobs"] == 3
    parsed = _parsed(include=[OUTPUT_LOGPROBS])
    assert parsed.chat.logprobs == 0 and parsed.echo["top_logprobs"] == 0
    parsed = _parsed(include=[], top_logprobs=0)
    assert parsed.chat.logprobs is None and parsed.echo["top_logprobs"] is None


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"include": ["reasoning.encrypted_content"]}, "include[0]", "unsupported_parameter"),
        ({"include": [OUTPUT_LOGPROBS, "file_search_call.results"]}, "include[1]", None),
        ({"include": OUTPUT_LOGPROBS}, "include", "invalid_value"),
        ({"top_logprobs": 2}, "top_logprobs", "invalid_value"),  # without include: nothing
        ({"include": [OUTPUT_LOGPROBS], "top_logprobs": 21}, "top_logprobs", None),
        ({"include": [OUTPUT_LOGPROBS], "top_logprobs": -1}, "top_logprobs", None),
        ({"include": [OUTPUT_LOGPROBS], "top_logprobs": "3"}, "top_logprobs", None),
        ({"include": [OUTPUT_LOGPROBS], "top_logprobs": True}, "top_logprobs", None),
    ],
)
def test_logprobs_asked_for_wrongly_are_a_400_naming_the_field(body, param, code):
    with pytest.raises(ApiError) as refused:
        _parsed(**body)
    assert refused.value.status == 400 and refused.value.param == param
    assert code is None or refused.value.code == code


def _lp(token: str, logprob: float, *alternatives: tuple[str, float]) -> TokenLogprob:
    top = [TopLogprob(t, lp, list(t.encode())) for t, lp in alternatives]
    return TokenLogprob(token, logprob, list(token.encode()), top)


def test_text_events_carry_their_tokens_logprobs_and_the_part_all_of_them():
    builder = ResponseBuilder(response_id="resp_r", model="m", echo={"top_logprobs": 1})
    builder.start()
    first = builder.delta(Delta(text="Hi", tokens=1, logprobs=[_lp("Hi", -0.5, ("Hi", -0.5))]))
    # A step the tool parser held back, then the text it let through: both tokens go with it.
    assert builder.delta(Delta(text="", tokens=1, logprobs=[_lp(" th", -1.0)])) == []
    second = builder.delta(
        Delta(text=" there", tokens=1, logprobs=[_lp("ere", -2.0, ("ere", -2.0), ("x", -3.0))])
    )
    # The end of sequence has no text: the part lists it, no text event carries it.
    last = builder.delta(Delta(text="", tokens=1, logprobs=[_lp("", -0.25)]))
    ended = builder.end(Finished(finish_reason="stop", prompt_tokens=3, completion_tokens=4))

    (delta,) = [e for e in first if e["type"] == "response.output_text.delta"]
    assert delta["logprobs"] == [
        {"token": "Hi", "logprob": -0.5, "top_logprobs": [{"token": "Hi", "logprob": -0.5}]}
    ]
    assert [lp["token"] for lp in second[0]["logprobs"]] == [" th", "ere"]
    assert second[0]["logprobs"][1]["top_logprobs"] == [{"token": "ere", "logprob": -2.0}]
    assert last == []
    (done,) = [e for e in ended if e["type"] == "response.output_text.done"]
    assert [lp["token"] for lp in done["logprobs"]] == ["Hi", " th", "ere", ""]
    part = ended[-1]["response"]["output"][0]["content"][0]
    assert part["logprobs"][2] == {
        "token": "ere",
        "bytes": list(b"ere"),
        "logprob": -2.0,
        "top_logprobs": [{"token": "ere", "bytes": list(b"ere"), "logprob": -2.0}],
    }
    assert [lp["logprob"] for lp in part["logprobs"]] == [-0.5, -1.0, -2.0, -0.25]
    assert ended[-1]["response"]["top_logprobs"] == 1


def test_a_function_calls_tokens_leave_the_messages_logprobs_alone():
    builder = ResponseBuilder(response_id="resp_r", model="m", echo={"top_logprobs": 0})
    builder.delta(Delta(text="Look.", tokens=1, logprobs=[_lp("Look.", -0.5)]))
    builder.delta(Delta(text="", tokens=1, logprobs=[_lp("<tool_call>", -0.1)]))
    call = ToolCallDelta(index=0, id="call_1", name="clock", arguments="{}")
    builder.delta(Delta(text="", tokens=2, tool_calls=[call], logprobs=[_lp("{}", -0.2)]))
    builder.delta(Delta(text="", tokens=1, logprobs=[_lp("", -0.3)]))
    body = builder.end(Finished(finish_reason="tool_calls", prompt_tokens=1, completion_tokens=5))
    message, function_call = body[-1]["response"]["output"]
    assert [lp["token"] for lp in message["content"][0]["logprobs"]] == ["Look."]
    assert function_call["type"] == "function_call"


def test_without_include_no_text_carries_logprobs():
    builder = _builder()
    events = builder.delta(Delta(text="Hi", tokens=1, logprobs=[_lp("Hi", -0.5)]))
    ended = builder.end(Finished(finish_reason="stop", prompt_tokens=1, completion_tokens=1))
    assert events[-1]["logprobs"] == []
    assert ended[-1]["response"]["output"][0]["content"][0]["logprobs"] == []


def test_a_refusal_of_chats_logprobs_names_the_include_that_asked_for_them():
    screened = ApiError(
        400, "unsupported_parameter", "'logprobs' is not available here.", param="logprobs"
    )
    renamed = chat_error_renamed(screened)
    assert renamed.param == "include" and renamed.message == "'include' is not available here."
    bound = ApiError(
        400, "invalid_value", "'top_logprobs' must be at most 20.", param="top_logprobs"
    )
    assert chat_error_renamed(bound).param == "top_logprobs"


def test_max_tool_calls_is_checked_and_repeated_and_prompt_cache_key_taken_as_chat_takes_it():
    parsed = _parsed(max_tool_calls=3, prompt_cache_key="team-a")
    assert parsed.echo["max_tool_calls"] == 3
    assert _parsed().echo["max_tool_calls"] is None
    for bad in (0, "3", True, 1.5):
        with pytest.raises(ApiError) as refused:
            _parsed(max_tool_calls=bad)
        assert refused.value.param == "max_tool_calls"
    with pytest.raises(ApiError) as refused:
        _parsed(prompt_cache_key=7)
    assert refused.value.param == "prompt_cache_key"


def test_thinking_is_a_reasoning_item_before_the_message():
    builder = _builder()
    kinds = [e["type"] for e in builder.start()]
    kinds += [e["type"] for e in builder.delta(Delta(text="", tokens=2, reasoning="They greet"))]
    kinds += [e["type"] for e in builder.delta(Delta(text="", tokens=1, reasoning=" me."))]
    kinds += [e["type"] for e in builder.delta(Delta(text="Hello.", tokens=2))]
    finished = Finished(
        finish_reason="stop", prompt_tokens=5, completion_tokens=5, reasoning_tokens=3
    )
    ended = builder.end(finished)
    kinds += [e["type"] for e in ended]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    body = ended[-1]["response"]
    assert body["output"][0] == {
        "type": "reasoning",
        "id": "rs_r",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "They greet me."}],
        "status": "completed",
    }
    assert body["output_text"] == "Hello."
    assert body["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}


def test_a_reasoning_item_in_a_chain_is_the_next_answers_thinking():
    items = input_items_read(
        [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "summary": [],
             "content": [{"type": "reasoning_text", "text": "They greet me."}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Look it up."}]},
            {"type": "function_call", "call_id": "c1", "name": "clock", "arguments": "{}"},
        ],
        response_id="resp_x",
    )  # fmt: skip
    assert messages_of(items) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello.", "reasoning": "They greet me."},
        {
            "role": "assistant",
            "content": "",
            "reasoning": "Look it up.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "clock", "arguments": "{}"}}
            ],
        },
    ]
    with pytest.raises(ApiError) as refused:
        input_items_read(
            [{"type": "reasoning", "content": [{"type": "summary_text", "text": "x"}]}],
            response_id="resp_x",
        )
    assert refused.value.param == "input[0].content[0].type"


def test_reasoning_effort_reaches_chat_and_a_summary_is_refused():
    parsed = responses_parse(
        {"model": "m", "input": "hi", "reasoning": {"effort": "low"}},
        response_id="resp_x",
        history=[],
    )
    assert parsed.chat.chat_template_kwargs == {"enable_thinking": True, "reasoning_effort": "low"}
    for reasoning, param in (
        ({"effort": "low", "summary": "auto"}, "reasoning.summary"),
        ({"effort": "extreme"}, "reasoning.effort"),
        ("high", "reasoning"),
    ):
        with pytest.raises(ApiError) as refused:
            responses_parse(
                {"model": "m", "input": "hi", "reasoning": reasoning},
                response_id="resp_x",
                history=[],
            )
        assert refused.value.param == param
