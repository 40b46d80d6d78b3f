# One case a line reads better than a wrapped one: long lines are kept here.
# ruff: noqa: E501
"""The Messages API's conversion to chat and its answer's shape, without a server.

tests/conformance/test_messages_parity.py holds the same requests against vLLM's own server;
these pin the rules one at a time.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from dataplane.types import Delta, Failed, Finished, ToolCallDelta
from inference.base.errors import ApiError
from inference.messages.format import MessageBuilder, stop_reason_of, usage_of
from inference.messages.protocol import messages_chat, needs_of, thinking_shown
from models_registry.tokenizer import CONTENT_PARTS

HELLO = [{"role": "user", "content": "Hello"}]


def _chat(**body: Any) -> Any:
    return messages_chat({"model": "m", "max_tokens": 8, "messages": HELLO, **body})


def _refused(param: str, **body: Any) -> ApiError:
    with pytest.raises(ApiError) as refused:
        messages_chat({"model": "m", "max_tokens": 8, **body})
    assert refused.value.status == 400 and refused.value.param == param, refused.value.message
    return refused.value


def test_the_system_prompt_leads_and_claude_codes_billing_header_is_left_out():
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2; cch=ab;"},
        {"type": "text", "text": "Be terse. ", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Answer."},
    ]
    assert _chat(system=system).messages[0] == {"role": "system", "content": "Be terse. Answer."}
    assert _chat(system="Plain.").messages[0] == {"role": "system", "content": "Plain."}


def test_tool_use_and_tool_result_blocks_become_chats_tool_calls_and_tool_messages():
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Look it up.", "signature": "s"},
                {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "text", "text": "Sunny"}, {"type": "text", "text": "21C"}]},
                {"type": "text", "text": "Tomorrow?"},
            ],
        },
    ]  # fmt: skip
    chat = _chat(messages=messages).messages
    assert chat[1]["tool_calls"][0]["function"] == {"name": "w", "arguments": '{"city": "Paris"}'}
    assert chat[1]["reasoning"] == "Look it up."
    # The tool's answer comes first, then what the user wrote beside it.
    assert chat[2] == {"role": "tool", "tool_call_id": "t1", "content": "Sunny\n21C"}
    assert chat[3] == {"role": "user", "content": "Tomorrow?"}


def test_a_user_message_of_tool_results_only_is_no_user_turn():
    messages = [
        *HELLO,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "w", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]},
    ]
    assert [m["role"] for m in _chat(messages=messages).messages] == ["user", "assistant", "tool"]


def test_an_inline_system_message_stays_in_place_or_joins_the_leading_one():
    messages = [*HELLO, {"role": "system", "content": "Now be brief."}, *HELLO]
    kept = messages_chat({"model": "m", "max_tokens": 8, "system": "Hi. ", "messages": messages})
    assert [m["role"] for m in kept.messages or []] == ["system", "user", "system", "user"]
    merged = messages_chat(
        {"model": "m", "max_tokens": 8, "system": "Hi. ", "messages": messages},
        merge_inline_system=True,
    )
    assert (merged.messages or [])[0] == {"role": "system", "content": "Hi. Now be brief."}
    assert [m["role"] for m in merged.messages or []] == ["system", "user", "user"]
    assert needs_of({"messages": messages}).inline_system
    assert not needs_of({"messages": HELLO}).inline_system


def test_thinking_asks_for_a_budget_or_the_effort_that_turns_it_off():
    assert _chat(max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 1024})
    disabled = messages_chat(
        {"model": "m", "max_tokens": 8, "messages": HELLO, "thinking": {"type": "disabled"}},
        disabled_effort="low",
    )
    assert disabled.chat_template_kwargs == {"enable_thinking": True, "reasoning_effort": "low"}
    assert needs_of({"thinking": {"type": "disabled"}}).thinking_disabled
    _refused(
        "thinking.budget_tokens", messages=HELLO, thinking={"type": "enabled", "budget_tokens": 512}
    )
    _refused(
        "thinking.budget_tokens",
        messages=HELLO,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )


def test_tool_choice_maps_onto_chats():
    tools = [{"name": "w", "input_schema": {"properties": {}}}]
    assert _chat(tools=tools).tools is not None
    for choice, mapped in [
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto"),
    ]:
        chat = _chat(tools=tools, tool_choice=choice)
        assert chat.tools is not None and chat.tools.choice == mapped, choice


def test_what_is_unknown_or_not_built_is_refused_naming_it():
    _refused("container", messages=HELLO, container="c")
    _refused(
        "messages[0].content[0].type", messages=[{"role": "user", "content": [{"type": "video"}]}]
    )
    _refused("messages[0].content[0].type", messages=[{"role": "user", "content": [{"type": "tool_reference", "tool_name": "x"}]}])  # fmt: skip
    _refused("messages[0].content[0].colour", messages=[{"role": "user", "content": [{"type": "text", "text": "x", "colour": "red"}]}])  # fmt: skip
    _refused("tools[0].type", messages=HELLO, tools=[{"type": "web_search_20250305", "name": "s"}])
    _refused("tools[0].defer_loading", messages=HELLO, tools=[{"name": "s", "input_schema": {}, "defer_loading": "yes"}])  # fmt: skip
    _refused(
        "thinking.display", messages=HELLO, thinking={"type": "adaptive", "display": "updates"}
    )
    _refused("metadata.tier", messages=HELLO, metadata={"tier": "gold"})
    _refused("max_tokens", messages=HELLO, max_tokens="8")
    _refused("system[0].type", messages=HELLO, system=[{"type": "image", "source": {"type": "url", "url": "u"}}])  # fmt: skip
    _refused("stop_sequences", messages=HELLO, stop_sequences="end")
    nested = {
        "type": "tool_result",
        "tool_use_id": "t",
        "content": [{"type": "thinking", "thinking": "x"}],
    }
    _refused(
        "messages[0].content[0].content[0].type", messages=[{"role": "user", "content": [nested]}]
    )
    # A chat field's error names the Messages field the client sent.
    bad_schema = {"format": {"type": "json_schema", "schema": {"type": "object", "properties": 5}}}
    assert _refused("output_config.format.schema", messages=HELLO, output_config=bad_schema)


WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}, "defer_loading": True}
TIME = {"name": "get_time", "input_schema": {"type": "object"}}


def _change(kind: str, tool: dict[str, Any]) -> dict[str, Any]:
    return {"role": "system", "content": [{"type": kind, "tool": tool}]}


def _ref(name: str) -> dict[str, Any]:
    return {"type": "tool_reference", "name": name}


def _tools_of(chat: Any) -> list[dict[str, Any]]:
    assert chat.tools is not None
    return [tool["function"] for tool in chat.tools.tools]


def test_a_tool_search_resolves_the_tools_in_effect_at_the_conversations_end():
    # Deferred tools reach the template marked so, as vLLM's server passes them.
    assert [f.get("defer_loading") for f in _tools_of(_chat(tools=[WEATHER, TIME]))] == [True, None]
    # Added by reference: no longer deferred; removed: gone; added by definition: declared.
    messages = [*HELLO, _change("tool_addition", _ref("get_weather")), _change("tool_removal", _ref("get_time"))]  # fmt: skip
    [weather] = _tools_of(_chat(tools=[WEATHER, TIME], messages=messages))
    assert weather["name"] == "get_weather" and "defer_loading" not in weather
    added = _tools_of(_chat(messages=[*HELLO, _change("tool_addition", {"type": "tool_definition", "definition": TIME})]))  # fmt: skip
    assert [f["name"] for f in added] == ["get_time"]
    # Removed, then added again: in effect.
    again = [*HELLO, _change("tool_removal", _ref("get_time")), _change("tool_addition", _ref("get_time"))]  # fmt: skip
    assert [f["name"] for f in _tools_of(_chat(tools=[TIME], messages=again))] == ["get_time"]


def test_a_tool_result_names_the_tools_it_found_in_a_tool_message_of_references():
    found = {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "One."}, {"type": "tool_reference", "tool_name": "get_weather"}]}  # fmt: skip
    chat = _chat(tools=[WEATHER], messages=[{"role": "user", "content": [found]}])
    assert chat.messages is not None
    # Written as vLLM's server writes a reference for a template that reads text (its name),
    # and for one that loops over content (the reference).
    reference = [{"type": "tool_reference", "name": "get_weather"}]
    assert chat.messages[-2:] == [
        {"role": "tool", "content": "One.", "tool_call_id": "t1"},
        {"role": "tool", "content": "get_weather", CONTENT_PARTS: reference, "tool_call_id": "t1"},
    ]


def test_a_tool_schema_that_cannot_compile_is_refused_naming_where_the_request_holds_it():
    bad = {"name": "get_rain", "input_schema": {"type": "object", "properties": {"x": {"type": 5}}}}
    _refused("tools[1].input_schema", messages=HELLO, tools=[TIME, bad])
    added = _change("tool_addition", {"type": "tool_definition", "definition": bad})
    _refused("messages[1].content[0].tool.definition.input_schema", messages=[*HELLO, added], tools=[TIME])  # fmt: skip


def test_a_tool_search_block_out_of_its_place_is_refused_naming_it():
    addition = {"type": "tool_addition", "tool": _ref("get_weather")}
    _refused("messages[0].content[0].type", messages=[{"role": "user", "content": [addition]}])
    _refused("messages[1].content[0].type", messages=[*HELLO, {"role": "system", "content": [_ref("x")]}])  # fmt: skip
    _refused("system[0].type", messages=HELLO, tools=[WEATHER], system=[addition])
    _refused("tools", messages=[*HELLO, _change("tool_removal", _ref("get_time"))], tools=[WEATHER])  # fmt: skip
    removal_by_value = _change("tool_removal", {"type": "tool_definition", "definition": TIME})
    _refused("messages[1].content[0].tool.type", messages=[*HELLO, removal_by_value])
    nameless = {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "tool_reference"}]}
    _refused("messages[0].content[0].content[0].tool_name", messages=[{"role": "user", "content": [nameless]}])  # fmt: skip


def test_usage_counts_the_prompt_in_three_parts_as_vllm_does():
    finished = Finished(
        finish_reason="stop", prompt_tokens=300, completion_tokens=5, cached_tokens=128,
        cache_created_tokens=160,
    )  # fmt: skip
    assert usage_of(finished) == {
        "input_tokens": 12,
        "output_tokens": 5,
        "cache_creation_input_tokens": 160,
        "cache_read_input_tokens": 128,
    }


def test_the_stop_reason_names_a_cut_a_tool_call_or_the_stop_sequence():
    assert stop_reason_of("length", "x", tool_used=True, tool_complete=True) == ("max_tokens", None)
    assert stop_reason_of("stop", "END", tool_used=False, tool_complete=False) == (
        "stop_sequence",
        "END",
    )
    assert stop_reason_of("tool_calls", None, tool_used=True, tool_complete=True) == (
        "tool_use",
        None,
    )
    # A named tool call ends as "stop" in chat: it is still a tool use.
    assert stop_reason_of("stop", None, tool_used=True, tool_complete=False) == ("tool_use", None)
    assert stop_reason_of("stop", None, tool_used=False, tool_complete=False) == ("end_turn", None)
    assert stop_reason_of("content_filter", None, tool_used=False, tool_complete=False) == (
        None,
        None,
    )


def _kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] + (":" + e["delta"]["type"] if "delta" in e and "type" in e["delta"] else "") for e in events]  # fmt: skip


def test_a_stream_opens_a_block_per_kind_and_text_after_a_tool_call_follows_it():
    builder = MessageBuilder(message_id="msg_1", model="m", prompt_tokens=10)
    events = builder.start()
    events += builder.delta(Delta(text="", tokens=1, reasoning="Hmm."))
    events += builder.delta(Delta(text="Let me look.", tokens=1))
    events += builder.delta(Delta(text="", tokens=1, tool_calls=[ToolCallDelta(index=0, id="c1", name="w")]))  # fmt: skip
    events += builder.delta(Delta(text="(aside)", tokens=1, tool_calls=[ToolCallDelta(index=0, arguments='{"a": 1}')]))  # fmt: skip
    events += builder.end(
        Finished(finish_reason="tool_calls", prompt_tokens=10, completion_tokens=4)
    )
    assert _kinds(events) == [
        "message_start",
        "content_block_start", "content_block_delta:thinking_delta",
        "content_block_delta:signature_delta", "content_block_stop",
        "content_block_start", "content_block_delta:text_delta", "content_block_stop",
        "content_block_start", "content_block_delta:input_json_delta", "content_block_stop",
        "content_block_start", "content_block_delta:text_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    assert [e["index"] for e in events if e["type"] == "content_block_start"] == [0, 1, 2, 3]
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    body = builder.body(Finished(finish_reason="tool_calls", prompt_tokens=10, completion_tokens=4))
    assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use"]
    assert body["content"][2]["input"] == {"a": 1}


def test_omitted_thinking_keeps_its_blocks_and_signatures_without_their_text():
    finished = Finished(finish_reason="stop", prompt_tokens=10, completion_tokens=5)
    builder = MessageBuilder(message_id="m", model="m", prompt_tokens=10, thinking_shown=False)
    events = builder.start()
    events += builder.delta(Delta(text="", tokens=2, reasoning="Hmm, "))
    events += builder.delta(Delta(text="", tokens=2, reasoning="let me see."))
    events += builder.delta(Delta(text="Hi.", tokens=1))
    events += builder.end(finished)
    assert _kinds(events) == [
        "message_start",
        "content_block_start", "content_block_delta:signature_delta", "content_block_stop",
        "content_block_start", "content_block_delta:text_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    assert events[1]["content_block"] == {"type": "thinking", "thinking": ""}
    assert "Hmm" not in json.dumps(events)
    thinking, text = builder.body(finished)["content"]
    assert thinking["thinking"] == "" and thinking["signature"]
    assert text == {"type": "text", "text": "Hi."}
    # The request's validation lets it through; an unknown display is still refused.
    assert not thinking_shown({"thinking": {"type": "adaptive", "display": "omitted"}})
    assert thinking_shown({"thinking": {"type": "adaptive", "display": "summarized"}})
    assert thinking_shown({})


def test_an_empty_answer_is_one_empty_text_block_and_a_cut_tool_call_keeps_its_text():
    empty = MessageBuilder(message_id="m", model="m", prompt_tokens=1)
    body = empty.body(Finished(finish_reason="length", prompt_tokens=1, completion_tokens=0))
    assert body["content"] == [{"type": "text", "text": ""}] and "stop_sequence" not in body
    cut = MessageBuilder(message_id="m", model="m", prompt_tokens=1)
    cut.delta(Delta(text="", tokens=2, tool_calls=[ToolCallDelta(index=0, id="c", name="w", arguments='{"ci')]))  # fmt: skip
    body = cut.body(Finished(finish_reason="length", prompt_tokens=1, completion_tokens=2))
    assert body["content"][0]["input"] == {"_partial_arguments": '{"ci'}


def test_errors_take_anthropics_shape_with_the_field_named():
    body = ApiError(400, "invalid_value", "bad", param="x").anthropic_body()
    assert body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "bad",
            "code": "invalid_value",
            "param": "x",
        },
    }
    assert (
        ApiError(503, "queue_full", "busy").anthropic_body()["error"]["type"] == "overloaded_error"
    )
    assert ApiError(502, "bad_gateway", "?").anthropic_body()["error"]["type"] == "api_error"
    # The same body answers the request, on the Messages API's paths only.
    error = ApiError(400, "invalid_value", "bad", param="x")
    assert json.loads(error.response("/v1/messages").content) == error.anthropic_body()
    assert json.loads(error.response("/v1/chat/completions").content) == error.body()


def test_a_failed_stream_ends_with_one_error_event_in_anthropics_shape():
    builder = MessageBuilder(message_id="m", model="m", prompt_tokens=1)
    failed = Failed(code="deadline_exceeded", message="The deadline passed.", prompt_tokens=1, completion_tokens=0)  # fmt: skip
    late = ApiError(504, "deadline_exceeded", "The deadline passed.")
    (event,) = builder.end(failed, error=late)
    assert event["type"] == "error"
    assert event["error"] == {
        "type": "api_error",
        "message": "The deadline passed.",
        "code": "deadline_exceeded",
        "param": None,
    }


def test_a_template_that_wants_its_system_message_first_gets_the_inline_ones_merged():
    from inference.messages.views import _rejects_inline_system

    strict = (
        "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
        "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
        "{{ m.content }}{% endfor %}"
    )
    lenient = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    assert _rejects_inline_system(strict)  # raise_exception is not even defined in the probe
    assert not _rejects_inline_system(lenient)
    assert _rejects_inline_system(None)  # no template: nothing to keep the turns apart
