from __future__ import annotations

import ast
import importlib.util
import uuid
from pathlib import Path
from typing import Any

import pytest

from config.json_body import MAX_DEPTH, BodyProblem, json_document, shown
from inference.base.errors import ApiError
from inference.body.fields import CHAT, COMPLETIONS, GENERATION_FIELDS
from inference.body.parser import body_parse, generation_parse
from inference.chat.protocol import CHAT_BATCH_FIELDS
from inference.embeddings.protocol import EMBEDDING_FIELDS, embeddings_parse
from inference.operations.protocol import (
    DETOKENIZE_FIELDS,
    TOKENIZE_FIELDS,
    detokenize_parse,
    tokenize_parse,
)
from models_registry.tokenizer import CONTENT_PARTS


def _chat(**fields):
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def _error(body, endpoint=CHAT) -> ApiError:
    with pytest.raises(ApiError) as caught:
        generation_parse(body, endpoint=endpoint)
    return caught.value


@pytest.mark.parametrize("raw", [b"", b"{", b"[1, 2]", b"\xff\xfe"])
def test_it_rejects_bodies_that_are_not_a_json_object(raw):
    with pytest.raises(ApiError) as caught:
        body_parse(raw)
    assert caught.value.status == 400 and caught.value.code == "invalid_json"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", "hot"),
        ("max_tokens", 1.5),
        ("max_tokens", True),
        ("stream", "yes"),
        ("top_p", [1]),
        ("seed", "1"),
        ("stop", 5),
        ("messages", "hello"),
        ("model", 7),
        # Fields that cannot change the answer still hold their declared JSON type.
        ("metadata", "team-a"),
        ("prompt_cache_key", 7),
        ("safety_identifier", ["u"]),
        ("stream_interval", True),
    ],
)
def test_it_names_a_field_of_the_wrong_type(field, value):
    error = _error(_chat(**{field: value}))
    assert error.status == 400 and error.param == field and error.code == "invalid_type"


def test_a_count_written_without_a_fraction_is_an_integer():
    parsed = generation_parse(_chat(max_tokens=4.0, n=2.0, seed=7.0), endpoint=CHAT)
    assert (parsed.max_tokens, parsed.n, parsed.seed) == (4, 2, 7)
    assert type(parsed.max_tokens) is int and type(parsed.seed) is int
    assert _error(_chat(max_tokens=1e308)).code == "invalid_value"  # whole, out of range


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 3), ("top_p", -0.1), ("top_p", 0), ("max_tokens", 0), ("presence_penalty", 9)],
)
def test_it_names_a_field_out_of_range(field, value):
    error = _error(_chat(**{field: value}))
    assert error.param == field and error.code == "invalid_value"


def test_it_requires_model_and_messages():
    assert _error({"messages": []}).param == "model"
    assert _error({"model": "m"}).param == "messages"
    assert _error({"model": "m", "messages": []}).param == "messages"


def test_it_names_the_bad_message():
    error = _error(_chat(messages=[{"role": "user", "content": "a"}, {"role": "robot"}]))
    assert error.param == "messages[1].role"


def test_an_older_function_call_and_its_result_are_read_as_a_tool_call_and_its_answer():
    called = {"name": "get_time", "arguments": '{"zone": "utc"}'}
    messages = [
        {"role": "user", "content": "the time?"},
        {"role": "assistant", "content": None, "function_call": called},
        {"role": "function", "name": "get_time", "content": "12:00"},
    ]
    read = generation_parse(_chat(messages=messages), endpoint=CHAT).messages
    assert read is not None
    assert read[1]["tool_calls"] == [
        {"id": "call_get_time", "type": "function", "function": called}
    ]
    assert read[2] == {
        "role": "tool",
        "content": "12:00",
        "name": "get_time",
        "tool_call_id": "call_get_time",
    }


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "function", "content": "12:00"}, "messages[0].name"),
        (
            {"role": "user", "content": "a", "function_call": {"name": "f"}},
            "messages[0].function_call",
        ),
        (
            {"role": "assistant", "function_call": {"name": "f"}},
            "messages[0].function_call.arguments",
        ),
        ({"role": "assistant", "function_call": "f"}, "messages[0].function_call"),
        (
            {
                "role": "assistant",
                "function_call": {"name": "f", "arguments": "{}"},
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
            },
            "messages[0].function_call",
        ),
    ],
)
def test_an_older_function_message_that_cannot_be_read_is_refused_naming_it(message, param):
    assert _error(_chat(messages=[message])).param == param


@pytest.mark.parametrize("field", ["tools", "functions"])
def test_an_empty_list_of_tools_is_refused_as_vllm_and_openai_refuse_it(field):
    assert _error(_chat(**{field: []})).param == field


def test_it_refuses_unsupported_parameters():
    assert _error(_chat(best_of=2)).code == "unsupported_parameter"
    assert _error(_chat(watermarking={"key": 1})).param == "watermarking"


def test_stream_options_need_stream():
    assert _error(_chat(stream_options={"include_usage": True})).param == "stream_options"


def test_stream_options_are_read_as_vllms_server_reads_them_and_no_other_is_taken():
    def options(**given):
        request = generation_parse(_chat(stream=True, stream_options=given), endpoint=CHAT)
        return request.include_usage, request.continuous_usage

    assert options(include_usage=True) == (True, False)
    assert options(include_usage=True, continuous_usage_stats=True) == (True, True)
    # As on vLLM's server, running usage comes only with the usage chunk itself.
    assert options(continuous_usage_stats=True) == (False, False)
    error = _error(_chat(stream=True, stream_options={"include_usage": True, "every": 2}))
    assert (error.code, error.param) == ("unsupported_parameter", "stream_options.every")
    error = _error(_chat(stream=True, stream_options={"continuous_usage_stats": "yes"}))
    assert (error.code, error.param) == ("invalid_type", "stream_options.continuous_usage_stats")


def test_it_accepts_a_full_chat_request():
    parsed = generation_parse(
        _chat(
            max_tokens=10,
            temperature=0.5,
            stop="\n",
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        ),
        endpoint=CHAT,
    )
    assert parsed.max_tokens == 10 and parsed.stop == ["\n"] and parsed.include_usage
    assert parsed.messages == [{"role": "user", "content": "hi"}]


def test_content_parts_are_written_as_vllms_server_writes_them_for_a_text_template():
    parts = [
        {"type": "text", "text": ""},
        {"type": "text", "text": None},
        {"type": "input_text", "text": "a"},
        "b",
        {"type": "output_text", "text": "c"},
        {"type": "refusal", "refusal": "d"},
        {"type": "thinking", "thinking": "e"},
        {"type": "tool_reference", "name": "get_time"},
    ]
    header = "x-anthropic-billing-header: cch=1;"
    system = [{"type": "text", "text": f"{header}\nBe terse."}, {"type": "text", "text": header}]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": parts}]
    parsed = generation_parse(_chat(messages=messages), endpoint=CHAT)
    # Empty and null parts left out, Claude Code's header line dropped from a system part only;
    # for a template that loops over content, the parts (the empty one kept, a reference as
    # such). The system message's one part left is its string: nothing more to keep.
    text = [{"type": "text", "text": t} for t in ("", "a", "b", "c", "d", "e")]
    assert parsed.messages == [
        {"role": "system", "content": "Be terse."},
        {
            "role": "user",
            "content": "a\nb\nc\nd\ne\nget_time",
            CONTENT_PARTS: [*text, {"type": "tool_reference", "name": "get_time"}],
        },
    ]
    kept = generation_parse(_chat(messages=[{"role": "user", "content": header}]), endpoint=CHAT)
    assert kept.messages == [{"role": "user", "content": header}]


@pytest.mark.parametrize(
    ("part", "param"),
    [
        (
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
            "messages[0].content[0].type",
        ),
        ({"text": "no type"}, "messages[0].content[0].type"),
        ({"type": "refusal", "refusal": 5}, "messages[0].content[0].refusal"),
        ({"type": "tool_reference", "name": ["get_time"]}, "messages[0].content[0].name"),
        (5, "messages[0].content[0]"),
    ],
)
def test_a_content_part_this_model_cannot_read_is_refused_naming_it(part, param):
    assert _error(_chat(messages=[{"role": "user", "content": [part]}])).param == param


def test_a_deferred_tool_reaches_the_template_marked_as_the_request_marked_it():
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    later = {"type": "function", "function": {"name": "g", "defer_loading": False}}
    tools = [{**tool, "defer_loading": True}, later]
    parsed = generation_parse(_chat(tools=tools), endpoint=CHAT)
    assert parsed.tools is not None
    assert [t["function"].get("defer_loading") for t in parsed.tools.tools] == [True, False]
    assert parsed.tools.tools[0]["defer_loading"] is True
    bad = [{**tool, "defer_loading": "yes"}]
    assert _error(_chat(tools=bad)).param == "tools[0].defer_loading"


def test_completions_take_text_or_token_ids():
    assert generation_parse({"model": "m", "prompt": "x"}, endpoint=COMPLETIONS).prompt == "x"
    by_ids = generation_parse({"model": "m", "prompt": [1, 2]}, endpoint=COMPLETIONS)
    assert by_ids.prompt == [1, 2]
    several = generation_parse({"model": "m", "prompt": ["a", "b"]}, endpoint=COMPLETIONS)
    assert several.prompts == ("a", "b") and several.prompt is None
    by_lists = generation_parse({"model": "m", "prompt": [[1], [3, 4]]}, endpoint=COMPLETIONS)
    assert by_lists.prompts == ([1], [3, 4])
    # Texts and token lists together are refused, as vLLM's server and OpenAI's API refuse them.
    assert _error({"model": "m", "prompt": ["a", [3, 4]]}, endpoint=COMPLETIONS).param == (
        "prompt[1]"
    )
    nested = generation_parse({"model": "m", "prompt": [[1, 2]]}, endpoint=COMPLETIONS)
    assert nested.prompt == [1, 2]
    assert _error({"model": "m", "prompt": []}, endpoint=COMPLETIONS).param == "prompt"
    # A token id list that holds something else is refused naming the item.
    for prompt, param in [
        ([["a"]], "prompt[0][0]"),
        ([1, "a"], "prompt[1]"),
        ([1, True], "prompt[1]"),
        ([[1], [2, "a"]], "prompt[1][1]"),
        ([[1], "a"], "prompt[1]"),
    ]:
        error = _error({"model": "m", "prompt": prompt}, endpoint=COMPLETIONS)
        assert (error.code, error.param) == ("invalid_type", param)


# Hostile bodies: every one is a 400 naming the field, before anything is admitted.

DEEP = 10_000


def _parse_error(raw: str | bytes) -> ApiError:
    with pytest.raises(ApiError) as caught:
        body_parse(raw.encode() if isinstance(raw, str) else raw)
    return caught.value


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ('{"model": "m", "user": "\\ud800"}', "user"),
        ('{"model": "\\udfff"}', "model"),
        ('{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages[0].content"),
        (
            '{"messages": [{"role": "user", "content": [{"text": "\\ud800"}]}]}',
            "messages[0].content[0].text",
        ),
        ('{"stop": ["ok", "\\ud800"]}', "stop[1]"),
        ('{"prompt": "\\ud800"}', "prompt"),
        ('{"input": ["fine", "\\udbff"]}', "input[1]"),
        ('{"metadata": {"\\ud800": "x"}}', "metadata.\ufffd"),
    ],
)
def test_it_refuses_a_lone_surrogate_anywhere_naming_the_field(raw, param):
    error = _parse_error(raw)
    assert (error.status, error.code, error.param) == (400, "invalid_value", param)
    assert "surrogate" in error.message


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ('{"model": "m", "messages": ' + "[" * DEEP + "]" * DEEP + "}", "messages"),
        ('{"model": "m", "messages": ' + "[" * 40 + "]" * 40 + "}", "messages"),
        ('{"a": ' * DEEP + "1" + "}" * DEEP, "a"),
        ("[" * DEEP + "]" * DEEP, None),
    ],
)
def test_it_refuses_deep_nesting_naming_the_field(raw, param):
    error = _parse_error(raw)
    assert (error.status, error.code, error.param) == (400, "invalid_json", param)
    assert "32 levels" in error.message


def test_it_takes_nesting_as_deep_as_the_limit():
    assert body_parse(('{"a": ' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "}").encode())


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ('{"temperature": NaN}', "temperature"),
        ('{"top_p": Infinity}', "top_p"),
        ('{"temperature": 1e999}', "temperature"),
        ('{"temperature": 1' + "0" * 400 + "}", "temperature"),
        ('{"seed": 18446744073709551616}', "seed"),
        ('{"prompt": [1, 2, -18446744073709551616]}', "prompt[2]"),
    ],
)
def test_it_refuses_numbers_no_field_can_hold(raw, param):
    error = _parse_error(raw)
    assert (error.code, error.param) == ("invalid_value", param)


def test_an_integer_of_thousands_of_digits_is_invalid_json_with_a_short_message():
    error = _parse_error('{"max_tokens": 1' + "0" * 5_000 + "}")
    assert error.code == "invalid_json" and len(error.message) < 100


def test_a_model_name_is_never_echoed_whole():
    error = _error(_chat(model="m" * 10_000))
    assert error.param == "model" and len(error.message) < 200
    with pytest.raises(ApiError) as caught:
        embeddings_parse({"model": "m\x00", "input": "x"})
    assert caught.value.param == "model"


def test_a_range_error_echoes_a_short_value():
    error = _error(_chat(max_tokens=10**40))
    assert error.param == "max_tokens" and len(error.message) < 150


def test_shown_truncates_and_replaces_lone_surrogates():
    assert shown("x" * 100) == "x" * 64 + "…"
    assert shown("a\ud800") == "a\ufffd"


def test_a_nul_is_refused_anywhere_only_where_bodies_are_stored():
    assert json_document('{"a": ["\\u0000"]}') == {"a": ["\x00"]}
    with pytest.raises(BodyProblem) as caught:
        json_document('{"a": ["\\u0000"]}', nul=False)
    assert caught.value.param == "a[0]"


# Every field is honoured, ignored or refused; a refused one is a 400 naming it.

REFUSED_VALUES = {
    "best_of": 2,
    "suffix": "tail",
    "guided_json": {"type": "object"},
    "guided_choice": ["a", "b"],
    "store": True,
    "priority": 5,
    "chat_template": "{{ 1 }}",
}


@pytest.mark.parametrize(("field", "value"), sorted(REFUSED_VALUES.items()))
def test_it_refuses_a_parameter_it_would_otherwise_ignore(field, value):
    error = _error(_chat(**{field: value}))
    assert (error.status, error.code, error.param) == (400, "unsupported_parameter", field)


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", 1), ("logprobs", False), ("top_logprobs", 0), ("logit_bias", {}), ("tools", None),
     ("tool_choice", "none"), ("repetition_penalty", 1), ("min_p", 0), ("stop_token_ids", []),
     ("response_format", {"type": "text"}), ("guided_json", None), ("metadata", {"a": "b"})],
)  # fmt: skip
def test_it_accepts_a_refused_parameter_at_the_value_that_asks_for_nothing(field, value):
    assert generation_parse(_chat(**{field: value}), endpoint=CHAT).model == "m"


def test_a_true_is_not_the_unused_value_one():
    assert _error(_chat(n=True)).param == "n"


def test_every_refused_field_is_refused():
    for field, decision in GENERATION_FIELDS.items():
        if decision.decision == "refused":
            assert _error(_chat(**{field: "something"})).param == field, field


def test_embeddings_refuse_what_they_do_not_honour():
    with pytest.raises(ApiError) as caught:
        embeddings_parse({"model": "m", "input": "x", "normalize": False})
    assert caught.value.code == "unsupported_parameter"
    assert caught.value.param == "normalize"


def test_embeddings_read_vllms_output_fields():
    parsed = embeddings_parse(
        {"model": "m", "input": "x", "embed_dtype": "bfloat16", "endianness": "big",
         "use_activation": False}
    )  # fmt: skip
    assert (parsed.embed_dtype, parsed.endianness, parsed.use_activation) == (
        "bfloat16", "big", False,
    )  # fmt: skip
    unset = embeddings_parse({"model": "m", "input": "x", "use_activation": None})
    assert (unset.embed_dtype, unset.endianness, unset.use_activation) == (
        "float32", "native", True,
    )  # fmt: skip


def test_embeddings_read_the_truncation_fields():
    parsed = embeddings_parse(
        {"model": "m", "input": "x", "truncate_prompt_tokens": 8, "truncation_side": "left"}
    )
    assert (parsed.truncate_prompt_tokens, parsed.truncation_side) == (8, "left")
    with pytest.raises(ApiError) as caught:
        embeddings_parse({"model": "m", "input": "x", "truncation_side": "middle"})
    assert caught.value.param == "truncation_side"


def test_an_unknown_field_is_refused_as_openai_refuses_it():
    error = _error(_chat(some_future_field=1))
    assert (error.code, error.param) == ("unsupported_parameter", "some_future_field")
    assert "Unrecognized request argument" in error.message


def _pydantic_fields(files: list[Path], name: str) -> set[str]:
    """The fields a pydantic model declares, read from source (importing vLLM takes long)."""
    classes = {
        node.name: node
        for file in files
        for node in ast.parse(file.read_text()).body
        if isinstance(node, ast.ClassDef)
    }
    fields: set[str] = set()
    todo = [name]
    while todo:
        found = classes.get(todo.pop())
        if found is None:
            continue
        for statement in found.body:
            if not isinstance(statement, ast.AnnAssign) or not isinstance(
                statement.target, ast.Name
            ):
                continue
            field = statement.target.id
            # Pydantic's fields: not class variables, not private attributes.
            if not field.startswith("_") and "ClassVar" not in ast.unparse(statement.annotation):
                fields.add(field)
        todo += [base.id for base in found.bases if isinstance(base, ast.Name)]
    return fields


def test_every_field_of_vllms_requests_has_a_decision():
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    entrypoints = Path(spec.origin).parent / "entrypoints"
    chat = _pydantic_fields(
        [entrypoints / "openai/chat_completion/protocol.py"], "ChatCompletionRequest"
    )
    completion = _pydantic_fields(
        [entrypoints / "openai/completion/protocol.py"], "CompletionRequest"
    )
    embedding = _pydantic_fields(
        [entrypoints / "pooling/base/protocol.py", entrypoints / "pooling/embed/protocol.py"],
        "EmbeddingCompletionRequest",
    )
    assert len(chat) > 40 and len(completion) > 40 and len(embedding) > 5
    assert (chat | completion) - set(GENERATION_FIELDS) == set()
    assert embedding - set(EMBEDDING_FIELDS) == set()
    tokenize_protocol = [entrypoints / "serve/tokenize/protocol.py"]
    tokenize = _pydantic_fields(tokenize_protocol, "TokenizeCompletionRequest") | (
        _pydantic_fields(tokenize_protocol, "TokenizeChatRequest")
    )
    detokenize = _pydantic_fields(tokenize_protocol, "DetokenizeRequest")
    assert {"prompt", "messages", "add_generation_prompt"} <= tokenize and "tokens" in detokenize
    assert tokenize - set(TOKENIZE_FIELDS) == set()
    assert detokenize - set(DETOKENIZE_FIELDS) == set()


@pytest.mark.parametrize("value", [10**400, -(10**400), float("nan"), float("inf")])
def test_a_parsed_body_with_a_number_no_float_holds_is_out_of_range(value):
    """A body not read by body_parse (a batch line's) is still refused, not an OverflowError."""
    error = _error(_chat(temperature=value))
    assert (error.code, error.param) == ("invalid_value", "temperature")


@pytest.mark.parametrize("salt", ["", "a@b", "a/b", "a\\b", "a\x00b", "x" * 129, 7, ["s"]])
def test_a_cache_salt_is_refused_where_vllm_refuses_it(salt):
    error = _error(_chat(cache_salt=salt))
    assert (error.status, error.code, error.param) == (400, "invalid_value", "cache_salt")


def test_a_cache_salt_reaches_the_request_and_embeddings_accept_one():
    assert generation_parse(_chat(cache_salt="user-1"), endpoint=CHAT).cache_salt == "user-1"
    assert generation_parse(_chat(cache_salt="x" * 128), endpoint=CHAT).cache_salt == "x" * 128
    assert generation_parse(_chat(), endpoint=CHAT).cache_salt is None
    embeddings_parse({"model": "m", "input": "hi", "cache_salt": "user-1"})


def test_the_api_docs_name_every_refused_and_ignored_field():
    docs = (Path(__file__).resolve().parents[3] / "docs" / "api.md").read_text()
    tables = (
        GENERATION_FIELDS,
        CHAT_BATCH_FIELDS,
        EMBEDDING_FIELDS,
        TOKENIZE_FIELDS,
        DETOKENIZE_FIELDS,
    )
    for table in tables:
        for field, decision in table.items():
            assert f"`{field}`" in docs, (field, decision.decision)


def test_tokenize_takes_a_prompt_or_messages_with_vllms_defaults():
    prompt = tokenize_parse({"model": "m", "prompt": "hi"})
    assert (prompt.prompt, prompt.messages, prompt.add_special_tokens) == ("hi", None, True)
    chat = tokenize_parse({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.messages == [{"role": "user", "content": "hi"}] and chat.prompt is None
    assert (chat.add_special_tokens, chat.add_generation_prompt) == (False, True)
    assert chat.continue_final_message is False and chat.return_token_strs is False


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "invalid_value",
         "prompt"),
        ({"prompt": ["a"]}, "invalid_type", "prompt"),
        ({"messages": [{"role": "user", "content": "b"}], "continue_final_message": True},
         "invalid_value", "continue_final_message"),
        ({"prompt": "a", "tools": [{"type": "function"}]}, "invalid_value", "tools"),
        ({"prompt": "a", "chat_template_kwargs": {"x": 1}}, "invalid_value",
         "chat_template_kwargs"),
        ({"messages": [{"role": "user", "content": "b"}], "chat_template": "{{ 1 }}"},
         "unsupported_parameter", "chat_template"),
        ({"prompt": "a", "add_special_tokens": 1}, "invalid_type", "add_special_tokens"),
    ],
)  # fmt: skip
def test_tokenize_refuses_a_bad_body_naming_the_field(body, code, param):
    with pytest.raises(ApiError) as caught:
        tokenize_parse({"model": "m", **body})
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, code, param)


@pytest.mark.parametrize(
    ("tokens", "code", "param"),
    [(None, "missing_required_parameter", "tokens"), ([1, True], "invalid_type", "tokens[1]"),
     ([0, -3], "invalid_value", "tokens[1]"), ({"a": 1}, "invalid_type", "tokens")],
)  # fmt: skip
def test_detokenize_takes_token_ids_only(tokens, code, param):
    assert detokenize_parse({"model": "m", "tokens": []}).tokens == []
    with pytest.raises(ApiError) as caught:
        detokenize_parse({"model": "m", "tokens": tokens})
    assert (caught.value.code, caught.value.param) == (code, param)


def test_compiled_schemas_are_kept_per_tenant():
    """A schema another tenant sent is compiled again for this one: no answering sooner."""
    import inference.body.tools as structured

    schema = {"type": "object", "properties": {"k": {"type": "integer"}}, "$id": uuid.uuid4().hex}
    body = _chat(response_format={"type": "json_schema",
                                  "json_schema": {"name": "n", "schema": schema}})  # fmt: skip
    before = structured._compiles.cache_info()
    generation_parse(body, endpoint=CHAT, tenant_id=1)
    generation_parse(body, endpoint=CHAT, tenant_id=1)
    generation_parse(body, endpoint=CHAT, tenant_id=2)
    after = structured._compiles.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (2, 1)
    # The same schema elsewhere in a request (a tool's parameters) is the same compiled text.
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    generation_parse(_chat(tools=[tool]), endpoint=CHAT, tenant_id=1)
    again = structured._compiles.cache_info()
    assert (again.misses - after.misses, again.hits - after.hits) == (0, 1)


def test_allowed_token_ids_and_add_special_tokens_reach_the_request_as_vllm_reads_them():
    chat = generation_parse(_chat(allowed_token_ids=[5, 7], add_special_tokens=True), endpoint=CHAT)
    assert chat.allowed_token_ids == (5, 7) and chat.add_special_tokens is True
    plain = generation_parse(_chat(), endpoint=CHAT)
    assert plain.allowed_token_ids is None and plain.add_special_tokens is None
    error = _error(_chat(allowed_token_ids=[]))
    assert (error.code, error.param) == ("invalid_value", "allowed_token_ids")
    for bad, param in (([-1], "[0]"), ([1, "5"], "[1]"), (5, ""), ([True], "[0]")):
        assert _error(_chat(allowed_token_ids=bad)).param == f"allowed_token_ids{param}"
    assert _error(_chat(add_special_tokens="yes")).param == "add_special_tokens"


def test_chat_template_kwargs_reach_the_request_unless_they_name_what_the_platform_sets():
    parsed = generation_parse(_chat(chat_template_kwargs={"enable_thinking": False}), endpoint=CHAT)
    assert parsed.chat_template_kwargs == {"enable_thinking": False}
    for name in ("messages", "conversation", "tools", "documents", "chat_template"):
        error = _error(_chat(chat_template_kwargs={name: 1}))
        assert (error.code, error.param) == ("invalid_value", "chat_template_kwargs")
    assert _error(_chat(chat_template_kwargs=[1])).code == "invalid_type"
    completions = {"model": "m", "prompt": "hi", "chat_template_kwargs": {}}
    assert _error(completions, endpoint=COMPLETIONS).code == "unsupported_parameter"


def test_return_tokens_as_token_ids_reaches_the_request():
    assert generation_parse(_chat(return_tokens_as_token_ids=True), endpoint=CHAT).tokens_as_ids
    assert not generation_parse(_chat(), endpoint=CHAT).tokens_as_ids
    assert _error(_chat(return_tokens_as_token_ids="yes")).param == "return_tokens_as_token_ids"


def test_repetition_detection_is_read_as_vllm_reads_it():
    rule = {"max_pattern_size": 8, "min_pattern_size": 2, "min_count": 3}
    assert generation_parse(
        _chat(repetition_detection=rule), endpoint=CHAT
    ).repetition_detection == (
        8,
        2,
        3,
    )
    off = {"max_pattern_size": 0, "min_count": 0}
    assert (
        generation_parse(_chat(repetition_detection=off), endpoint=CHAT).repetition_detection
        is None
    )
    assert generation_parse(_chat(), endpoint=CHAT).repetition_detection is None


@pytest.mark.parametrize(
    ("rule", "param", "code"),
    [
        ("on", "repetition_detection", "invalid_type"),
        (
            {"max_pattern_size": 4, "min_count": 1},
            "repetition_detection.min_count",
            "invalid_value",
        ),
        ({"max_pattern_size": 4}, "repetition_detection.min_count", "invalid_value"),
        (
            {"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 3},
            "repetition_detection.min_pattern_size",
            "invalid_value",
        ),
        ({"max_pattern_size": -1}, "repetition_detection.max_pattern_size", "invalid_value"),
        (
            {"max_pattern_size": "4", "min_count": 3},
            "repetition_detection.max_pattern_size",
            "invalid_type",
        ),
        (
            {"max_pattern_size": 4, "min_count": 3, "window": 9},
            "repetition_detection.window",
            "unsupported_parameter",
        ),
        # Bounded: the engine checks every running choice after every step.
        (
            {"max_pattern_size": 33, "min_count": 3},
            "repetition_detection.max_pattern_size",
            "invalid_value",
        ),
        (
            {"max_pattern_size": 4, "min_count": 17},
            "repetition_detection.min_count",
            "invalid_value",
        ),
    ],
)
def test_a_bad_repetition_detection_is_a_400_naming_its_field(rule, param, code):
    error = _error(_chat(repetition_detection=rule))
    assert (error.status, error.param, error.code) == (400, param, code)


def test_return_prompt_text_is_chats_alone():
    assert generation_parse(_chat(return_prompt_text=True), endpoint=CHAT).return_prompt_text
    assert not generation_parse(_chat(), endpoint=CHAT).return_prompt_text
    body = {"model": "m", "prompt": "hi", "return_prompt_text": True}
    error = _error(body, endpoint=COMPLETIONS)
    assert (error.param, error.code) == ("return_prompt_text", "unsupported_parameter")


def test_logprob_token_ids_need_logprobs_and_no_count_of_alternatives_beside_them():
    asked = generation_parse(_chat(logprobs=True, logprob_token_ids=[5, 6]), endpoint=CHAT)
    assert asked.logprob_token_ids == (5, 6) and asked.logprobs == 0
    # An empty list asks for nothing, as vLLM reads it.
    assert generation_parse(_chat(logprob_token_ids=[]), endpoint=CHAT).logprob_token_ids is None
    for body, param in [
        (_chat(logprob_token_ids=[5]), "logprob_token_ids"),
        (_chat(logprobs=True, top_logprobs=2, logprob_token_ids=[5]), "top_logprobs"),
        (_chat(logprobs=True, logprob_token_ids=list(range(129))), "logprob_token_ids"),
        (_chat(logprobs=True, logprob_token_ids=["5"]), "logprob_token_ids[0]"),
    ]:
        error = _error(body)
        assert (error.status, error.param) == (400, param)
    completion = {"model": "m", "prompt": "x", "logprob_token_ids": [7]}
    assert _error(completion, endpoint=COMPLETIONS).param == "logprob_token_ids"
    assert _error({**completion, "logprobs": 2}, endpoint=COMPLETIONS).param == "logprobs"
    echoed = generation_parse({**completion, "logprobs": 2, "echo": True}, endpoint=COMPLETIONS)
    assert (echoed.logprobs, echoed.logprob_token_ids) == (2, (7,))


def test_documents_are_objects_of_strings_for_the_chat_template():
    documents = [{"title": "Queues", "text": "First in, first out."}]
    assert generation_parse(_chat(documents=documents), endpoint=CHAT).documents == (documents[0],)
    for value, param in [
        ({"title": "x"}, "documents"),
        (["x"], "documents[0]"),
        ([{"title": "x"}, {"pages": 5}], "documents[1].pages"),
    ]:
        error = _error(_chat(documents=value))
        assert (error.status, error.code, error.param) == (400, "invalid_type", param)
    completion = {"model": "m", "prompt": "x", "documents": documents}
    assert _error(completion, endpoint=COMPLETIONS).param == "documents"  # chat's alone


def test_beam_search_takes_its_own_fields_and_refuses_what_it_would_drop():
    beams = generation_parse(
        _chat(use_beam_search=True, n=3, length_penalty=0.5, temperature=0), endpoint=CHAT
    )
    assert (beams.beam_search, beams.n, beams.length_penalty) == (True, 3, 0.5)
    dropped: list[tuple[dict[str, Any], str]] = [
        ({"top_p": 0.5}, "top_p"),
        ({"stop": ["x"]}, "stop"),
        ({"seed": 1}, "seed"),
        ({"logprobs": True}, "logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs"),
    ]
    for fields, param in dropped:
        error = _error(_chat(use_beam_search=True, **fields))
        assert (error.status, error.code, error.param) == (400, "unsupported_parameter", param)
    # Fields at the values that ask for nothing are fine.
    assert generation_parse(_chat(use_beam_search=True, top_p=1.0, stop=[]), endpoint=CHAT)
    assert _error(_chat(use_beam_search=True, n=11)).param == "n"  # 2 x 11 > max_logprobs
    assert _error(_chat(use_beam_search=True, length_penalty=11)).param == "length_penalty"
    error = _error(_chat(length_penalty=0.5))
    assert (error.code, error.param) == ("unsupported_parameter", "length_penalty")
