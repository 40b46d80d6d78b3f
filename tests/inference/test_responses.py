"""The Responses API's translation: input items to messages, chat's errors to its fields,
and the engine's events to the Responses events in OpenAI's order."""

from __future__ import annotations

import pytest

from dataplane.types import Delta, Failed, Finished, ToolCallDelta
from inference.errors import ApiError
from inference.response_events import ResponseBuilder
from inference.responses import (
    input_items_read,
    messages_of,
    oldest_dropped,
    responses_parse,
)
from inference.responses_store import Kept


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
    system = {"role": "system", "content": "rules"}
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}
    answer = {"role": "tool", "tool_call_id": "c", "content": "12:00"}
    last = {"role": "user", "content": "now?"}
    assert oldest_dropped([system, call, answer, last]) == [system, last]
    assert oldest_dropped([system, last]) is None
    assert oldest_dropped([call, last]) == [last]


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
    assert messages_of(items) == [{"role": "user", "content": "hello\nthere"}]
