"""Tools, structured output, logprobs, n and vLLM's sampling options: parsed, or a 400."""

from __future__ import annotations

import json

import pytest

from dataplane.types import Structured
from inference.base.errors import ApiError
from inference.body.fields import CHAT, COMPLETIONS
from inference.body.parser import generation_parse
from inference.pipeline.submission import prompt_logprobs_asked
from models_registry.tokenizer import CONTENT_PARTS

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _chat(**fields):
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def _error(body, endpoint=CHAT) -> ApiError:
    with pytest.raises(ApiError) as caught:
        generation_parse(body, endpoint=endpoint)
    assert caught.value.status == 400
    return caught.value


def test_tools_default_to_auto_and_keep_what_the_template_reads():
    parsed = generation_parse(_chat(tools=[WEATHER]), endpoint=CHAT)
    assert parsed.tools is not None and parsed.tools.choice == "auto"
    assert parsed.tools.tools[0]["function"]["name"] == "get_weather"
    assert json.loads(parsed.tools.choice_json) == "auto"


def test_a_named_tool_choice_must_name_a_given_tool():
    named = {"type": "function", "function": {"name": "get_weather"}}
    parsed = generation_parse(_chat(tools=[WEATHER], tool_choice=named), endpoint=CHAT)
    assert parsed.tools is not None and parsed.tools.named
    assert json.loads(parsed.tools.choice_json)["function"]["name"] == "get_weather"
    other = {"type": "function", "function": {"name": "nope"}}
    assert _error(_chat(tools=[WEATHER], tool_choice=other)).param == "tool_choice"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1]"),
        ({"tools": "get_weather"}, "tools"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "nonsense"}},
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        ({"functions": [WEATHER["function"]], "tools": [WEATHER]}, "functions"),
    ],
)
def test_bad_tools_are_refused_naming_the_field(fields, param):
    assert _error(_chat(**fields)).param == param


def test_legacy_functions_map_onto_tools():
    parsed = generation_parse(
        _chat(functions=[WEATHER["function"]], function_call={"name": "get_weather"}),
        endpoint=CHAT,
    )
    assert parsed.tools is not None
    assert parsed.tools.tools == [WEATHER] and parsed.tools.named
    assert parsed.tools.choice == "get_weather"


def test_tool_history_is_kept_for_the_template():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    parsed = generation_parse(
        _chat(
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ]
        ),
        endpoint=CHAT,
    )
    assert parsed.messages is not None
    assert parsed.messages[1]["tool_calls"] == [call] and parsed.messages[1]["content"] == ""
    assert parsed.messages[2]["tool_call_id"] == "c1"
    missing = [{"role": "tool", "content": "sunny"}]
    assert _error(_chat(messages=missing)).param == "messages[0].tool_call_id"
    bad_args = {"type": "function", "function": {"name": "f", "arguments": {}}}
    wrong = [{"role": "assistant", "tool_calls": [bad_args]}]
    assert _error(_chat(messages=wrong)).param == "messages[0].tool_calls[0].function.arguments"


def test_text_parts_join_one_per_line_as_vllm_renders_them():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    parsed = generation_parse(_chat(messages=[{"role": "user", "content": parts}]), endpoint=CHAT)
    assert parsed.messages == [{"role": "user", "content": "a\nb", CONTENT_PARTS: parts}]


def test_response_formats_become_engine_constraints():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    parsed = generation_parse(_chat(response_format=fmt), endpoint=CHAT)
    assert parsed.structured == Structured(json=json.dumps(schema))
    parsed = generation_parse(_chat(response_format={"type": "json_object"}), endpoint=CHAT)
    assert parsed.structured == Structured(json_object=True)
    text = generation_parse(_chat(response_format={"type": "text"}), endpoint=CHAT)
    assert text.structured is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"structured_outputs": {"regex": "(ab"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "root ::= "}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"sql": "x"}}, "structured_outputs.sql"),
        (
            {"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
            "structured_outputs",
        ),
    ],
)
def test_a_constraint_the_engine_cannot_compile_is_refused_before_queueing(fields, param):
    assert _error(_chat(**fields)).param == param


def test_vllm_structured_outputs_are_honoured():
    parsed = generation_parse(_chat(structured_outputs={"choice": ["yes", "no"]}), endpoint=CHAT)
    assert parsed.structured == Structured(choice=["yes", "no"])
    parsed = generation_parse(
        _chat(structured_outputs={"regex": "[a-z]+", "disable_any_whitespace": False}),
        endpoint=CHAT,
    )
    assert parsed.structured == Structured(regex="[a-z]+")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("disable_any_whitespace", True),
        ("disable_additional_properties", True),
        ("disable_fallback", True),
        ("whitespace_pattern", " *"),
    ],
)
def test_switches_the_engine_reads_only_from_its_configuration_are_refused(name, value):
    error = _error(_chat(structured_outputs={"regex": "a+", name: value}))
    assert (error.code, error.param) == ("unsupported_parameter", f"structured_outputs.{name}")


def test_logprobs_are_a_switch_on_chat_and_a_count_on_completions():
    assert generation_parse(_chat(logprobs=True, top_logprobs=3), endpoint=CHAT).logprobs == 3
    assert generation_parse(_chat(logprobs=True), endpoint=CHAT).logprobs == 0
    assert generation_parse(_chat(logprobs=False), endpoint=CHAT).logprobs is None
    assert _error(_chat(top_logprobs=3)).param == "top_logprobs"
    assert _error(_chat(logprobs=True, top_logprobs=21)).param == "top_logprobs"
    completion = {"model": "m", "prompt": "x", "logprobs": 2, "echo": True}
    parsed = generation_parse(completion, endpoint=COMPLETIONS)
    assert parsed.logprobs == 2 and parsed.echo
    assert _error({**completion, "logprobs": True}, endpoint=COMPLETIONS).param == "logprobs"


def test_prompt_logprobs_are_a_count_and_not_for_streams():
    assert generation_parse(_chat(prompt_logprobs=2), endpoint=CHAT).prompt_logprobs == 2
    # 0 asks for nothing a stream would carry: vLLM's server takes it, and so does this.
    assert generation_parse(_chat(prompt_logprobs=0, stream=True), endpoint=CHAT).stream
    for bad in (-1, 21, True, "2", 1.5):
        assert _error(_chat(prompt_logprobs=bad)).param == "prompt_logprobs"
    error = _error(_chat(prompt_logprobs=1, stream=True))
    assert error.param == "prompt_logprobs" and "stream" in error.message


@pytest.mark.parametrize(
    ("endpoint", "fields", "asked"),
    [
        (CHAT, {}, None),
        (CHAT, {"prompt_logprobs": 3}, 3),
        # vLLM's server: an echo scores the prompt with the output's alternatives (chat's
        # top_logprobs, 0 by default), unless prompt_logprobs says otherwise.
        (CHAT, {"echo": True}, 0),
        (CHAT, {"echo": True, "logprobs": True, "top_logprobs": 2}, 2),
        (CHAT, {"echo": True, "prompt_logprobs": 4}, 4),
        (COMPLETIONS, {"echo": True}, None),
        (COMPLETIONS, {"echo": True, "logprobs": 2}, 2),
        (COMPLETIONS, {"echo": True, "logprobs": 2, "prompt_logprobs": 0}, 0),
    ],
)
def test_the_engine_scores_the_prompt_when_asked_or_echoed(endpoint, fields, asked):
    body = _chat(**fields) if endpoint == CHAT else {"model": "m", "prompt": "x", **fields}
    assert prompt_logprobs_asked(generation_parse(body, endpoint=endpoint)) == asked


def test_chat_fields_are_refused_on_completions():
    body = {"model": "m", "prompt": "x", "tools": [WEATHER]}
    error = _error(body, endpoint=COMPLETIONS)
    assert (error.code, error.param) == ("unsupported_parameter", "tools")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"5": "up"}}, "logit_bias.5"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": 5e-324}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"stop_token_ids": [-1]}, "stop_token_ids[0]"),
        ({"stop_token_ids": [1, "2"]}, "stop_token_ids[1]"),
        ({"stop_token_ids": 3}, "stop_token_ids"),
        ({"bad_words": [""]}, "bad_words[0]"),
        ({"bad_words": ["a", 7]}, "bad_words[1]"),
        ({"skip_special_tokens": "no"}, "skip_special_tokens"),
        ({"add_generation_prompt": True, "continue_final_message": True}, "continue_final_message"),
    ],
)
def test_bad_sampling_options_are_refused_naming_the_field(fields, param):
    assert _error(_chat(**fields)).param == param


def test_vllm_sampling_options_are_kept():
    parsed = generation_parse(
        _chat(
            n=3,
            logit_bias={"7": -100, "9": 2.5},
            repetition_penalty=1.1,
            min_p=0.05,
            stop_token_ids=[1, 2],
            bad_words=["import"],
            skip_special_tokens=False,
            include_stop_str_in_output=True,
        ),
        endpoint=CHAT,
    )
    assert parsed.n == 3 and parsed.logit_bias == {7: -100.0, 9: 2.5}
    assert parsed.repetition_penalty == 1.1 and parsed.min_p == 0.05
    assert parsed.stop_token_ids == (1, 2) and parsed.bad_words == ("import",)
    assert not parsed.skip_special_tokens and parsed.include_stop_str_in_output


def test_an_empty_prompt_is_refused_as_vllm_refuses_it():
    assert _error({"model": "m", "prompt": ""}, endpoint=COMPLETIONS).param == "prompt"
    assert _error({"model": "m", "prompt": [[1], []]}, endpoint=COMPLETIONS).param == "prompt[1]"


def test_an_empty_text_in_an_array_is_read_as_vllm_reads_it():
    # Its tokens are what the tokenizer adds (BOS); none at all is refused once tokenised.
    parsed = generation_parse({"model": "m", "prompt": ["a", ""]}, endpoint=COMPLETIONS)
    assert parsed.prompts == ("a", "")


def test_echo_with_no_output_tokens_asks_for_the_prompt_alone():
    body = {"model": "m", "prompt": "a", "echo": True, "max_tokens": 0}
    parsed = generation_parse(body, endpoint=COMPLETIONS)
    assert parsed.prompt_only and parsed.max_tokens == 1  # the engine makes one, left out
    assert _error({**body, "echo": False}, endpoint=COMPLETIONS).param == "max_tokens"
    with_ids = {**body, "logprobs": 0, "logprob_token_ids": [3]}
    assert _error(with_ids, endpoint=COMPLETIONS).param == "logprob_token_ids"
    chat = {"model": "m", "messages": [{"role": "user", "content": "a"}], "echo": True}
    assert _error({**chat, "max_tokens": 0}).param == "max_tokens"


def test_choices_across_prompts_are_capped_as_n_is():
    body = {"model": "m", "prompt": ["a"] * 4, "n": 33}
    assert _error(body, endpoint=COMPLETIONS).param == "n"
    assert generation_parse({**body, "n": 32}, endpoint=COMPLETIONS).n == 32


def test_a_schema_sent_again_is_not_compiled_again(monkeypatch):
    from inference.body import tools as structured

    compiled: list[str] = []
    grammar = structured._compiler().Grammar
    real = grammar.from_json_schema

    def counting(text: str) -> object:
        compiled.append(text)
        return real(text)

    monkeypatch.setattr(grammar, "from_json_schema", counting)
    schema = json.dumps({"type": "object", "properties": {"once": {"type": "integer"}}})
    structured.schema_check(schema, "tools[0].function.parameters")
    structured.schema_check(schema, "tools[0].function.parameters")
    assert compiled == [schema]
    with pytest.raises(ApiError):
        structured.schema_check('{"type": "nonsense"}', "x")
    with pytest.raises(ApiError):  # a failure is not kept: it is refused every time
        structured.schema_check('{"type": "nonsense"}', "x")
