"""The demo model's chat template with tools, and conversations rendered as vLLM renders them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from models_registry.tokenizer import ChatMessageInvalid, Tokenizer, chat_conversation, chat_tools

# The demo model's template before it learnt tools: plain ChatML.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{{ message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "now"}}


def _call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


PLAIN = [
    [{"role": "user", "content": "Hello"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Why is the sky blue?"},
        {"role": "assistant", "content": "Rayleigh scattering."},
        {"role": "user", "content": "In Ελληνικά: {{ not a template }} <tool_call>"},
    ],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": "\n"}],
]

# (messages, tools): what a client sends, as OpenAI's API writes it.
WITH_TOOLS: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = [
    ([{"role": "user", "content": "Weather in Paris?"}], [WEATHER]),
    (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris and Oslo, and the time?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    _call("c1", "get_weather", '{"city": "Paris"}'),
                    _call("c2", "get_weather", '{"city": "Oslo", "unit": "C"}'),
                    _call("c3", "now", ""),
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "22C, sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": "3C"},
            {"role": "tool", "tool_call_id": "c3", "content": "12:00"},
            {"role": "assistant", "content": "Paris 22C, Oslo 3C, noon."},
            {"role": "user", "content": "Thanks"},
        ],
        [WEATHER, CLOCK],
    ),
    (
        # Content beside a call, arguments that are not JSON, and a call with no tools given.
        [
            {"role": "user", "content": "Paris?"},
            {
                "role": "assistant",
                "content": "Let me look.",
                "tool_calls": [_call("c1", "get_weather", "{city: Paris")],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "22C"},
        ],
        None,
    ),
    (
        # A developer message (the template has no developer role: it becomes the system's).
        [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": "Weather?", "name": "ann"},
            {"role": "assistant", "content": "", "tool_calls": []},
        ],
        [WEATHER],
    ),
]


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> Tokenizer:
    return Tokenizer(demo_model_dir)


def _chatml(messages: list[dict[str, Any]]) -> str:
    template = ImmutableSandboxedEnvironment().from_string(CHATML)
    return template.render(messages=messages, add_generation_prompt=True)


@pytest.mark.parametrize("messages", PLAIN)
def test_a_chat_without_tools_renders_as_plain_chatml(tokenizer, messages):
    assert tokenizer.render_chat(messages) == _chatml(messages)


def test_tools_are_listed_in_a_system_block_after_the_system_message(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = tokenizer.render_chat(messages, tools=[WEATHER, CLOCK])
    system = "<|im_start|>system\nBe brief.\n\n# Tools\n\n"
    assert rendered.startswith(system)
    listed = rendered.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert [json.loads(line) for line in listed.split("\n")] == chat_tools([WEATHER, CLOCK])
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n' in rendered
    assert rendered.count("Be brief.") == 1
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_tool_calls_and_their_results_are_rendered_as_hermes_blocks(tokenizer):
    messages, tools = WITH_TOOLS[1]
    rendered = tokenizer.render_chat(messages, tools=tools)
    assert (
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}\n'
        "</tool_call>\n"
        '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n"
        "<tool_response>\n22C, sunny\n</tool_response>\n"
        "<tool_response>\n3C\n</tool_response>\n"
        "<tool_response>\n12:00\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nParis 22C, Oslo 3C, noon.<|im_end|>\n"
    ) in rendered


def test_the_template_takes_arguments_as_a_json_string_or_an_object(tokenizer):
    """vLLM hands the template objects; transformers' own callers may pass the string."""
    for arguments in ('{"city": "Paris"}', {"city": "Paris"}):
        message = {"role": "assistant", "tool_calls": [_call("c1", "get_weather", arguments)]}
        rendered = tokenizer._hf.apply_chat_template([message], tokenize=False)
        assert rendered == (
            "<|im_start|>assistant\n<tool_call>\n"
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        )


def test_messages_reach_the_template_as_vllm_hands_them_over():
    messages, _ = WITH_TOOLS[2]
    conversation = chat_conversation([*messages, {"role": "user", "content": None}])
    assert conversation[1] == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [_call("c1", "get_weather", {})],
    }
    assert conversation[2] == {"role": "tool", "content": "22C", "tool_call_id": "c1"}
    assert conversation[3] == {"role": "user", "content": ""}
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == "{city: Paris"  # untouched


def test_a_tool_call_that_is_not_a_function_is_refused(tokenizer):
    call = {"id": "c1", "type": "custom", "custom": {"name": "x", "input": ""}}
    with pytest.raises(ChatMessageInvalid, match="type 'function'"):
        tokenizer.render_chat([{"role": "assistant", "content": "", "tool_calls": [call]}])


@pytest.fixture(scope="module")
def vllm_renderer(demo_model_dir: Path) -> Any:
    """vLLM's own chat renderer (what its OpenAI server runs) for the demo model."""
    from vllm.config import ModelConfig, VllmConfig
    from vllm.renderers.registry import renderer_from_config

    model = str(demo_model_dir)
    config = ModelConfig(model=model, tokenizer=model, dtype="float32", max_model_len=2048)
    return renderer_from_config(VllmConfig(model_config=config))


def _vllm_prompt(
    renderer: Any, messages: list[dict[str, Any]], tools: Any, documents: Any = None
) -> str:
    """The prompt vLLM's server renders for a chat request (its serving path, step by step)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    body: dict[str, Any] = {"model": "tiny", "messages": messages}
    if tools is not None:
        body["tools"] = tools
    if documents is not None:
        body["documents"] = documents
    request = ChatCompletionRequest(**body)
    tool_dicts = None if request.tools is None else [t.model_dump() for t in request.tools]
    params = request.build_chat_params(None, "auto").with_defaults(
        {"tools": tool_dicts, "tokenize": False},
        default_media_io_kwargs=None,
        default_mm_processor_kwargs=None,
    )
    _, prompt = renderer.render_messages(request.messages, params)
    return str(prompt["prompt"])


@pytest.mark.parametrize(("messages", "tools"), [*((m, None) for m in PLAIN), *WITH_TOOLS])
def test_a_conversation_renders_as_vllms_server_renders_it(
    tokenizer, vllm_renderer, messages, tools
):
    expected = _vllm_prompt(vllm_renderer, messages, tools)
    rendered = tokenizer.render_chat(messages, tools=tools)
    assert rendered == expected
    assert tokenizer.encode_text(rendered) == vllm_renderer.tokenizer.encode(
        expected, add_special_tokens=False
    )


DOCUMENTS = [{"title": "Queues", "text": "First in, first out."}, {"text": "Last in."}]


@pytest.mark.parametrize("documents", [DOCUMENTS, []])
def test_documents_reach_the_template_as_vllms_server_hands_them_over(
    tokenizer, vllm_renderer, documents
):
    messages = [{"role": "user", "content": "What is a queue?"}]
    rendered = tokenizer.render_chat(messages, tools=[WEATHER], documents=documents)
    assert rendered == _vllm_prompt(vllm_renderer, messages, [WEATHER], documents)
    if documents:  # the demo template lists each document's fields first
        assert rendered.startswith(
            "<|im_start|>system\n# Documents\n\ntitle: Queues\ntext: First in, first out.\n"
            "\ntext: Last in.\n<|im_end|>\n"
        )
    else:
        assert rendered == tokenizer.render_chat(messages, tools=[WEATHER])


def test_chat_template_kwargs_reach_the_template_and_only_the_variables_it_reads(tokenizer):
    messages = [{"role": "user", "content": "Hi"}]
    plain = tokenizer.render_chat(messages)
    off = tokenizer.render_chat(messages, template_kwargs={"enable_thinking": False})
    assert off == plain + "<think>\n\n</think>\n\n"  # Qwen3's switch, in the demo template
    on = tokenizer.render_chat(messages, template_kwargs={"enable_thinking": True})
    assert on == plain + "<think>\n"  # opened for the model to think in
    # A variable the template does not read changes nothing, as in vLLM's server.
    assert tokenizer.render_chat(messages, template_kwargs={"unread": 1}) == plain
    # The request's own fields win over a kwarg of the same name (vLLM's order).
    assert (
        tokenizer.render_chat(messages, template_kwargs={"add_generation_prompt": False}) == plain
    )


def test_template_variables_are_those_a_template_reads_and_does_not_set():
    from models_registry.demo_model import CHAT_TEMPLATE
    from models_registry.tokenizer import template_variables

    assert template_variables(CHAT_TEMPLATE) == {
        "messages", "tools", "documents", "add_generation_prompt", "enable_thinking",
        "reasoning_effort",
    }  # fmt: skip
    # transformers' own `generation` tag parses too.
    tracked = (
        "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    )
    assert template_variables(tracked) == {"messages"}


def test_a_template_failing_on_a_clients_variable_blames_the_variable(demo_model_dir):
    from models_registry.tokenizer import ChatTemplateKwargsRejected

    tokenizer = Tokenizer(demo_model_dir)
    tokenizer._hf.chat_template = "{{ messages[0]['content'] }}{{ 1 + count }}"
    assert tokenizer.render_chat([{"role": "user", "content": "Hi"}], template_kwargs={"count": 2})
    with pytest.raises(ChatTemplateKwargsRejected):
        tokenizer.render_chat([{"role": "user", "content": "Hi"}], template_kwargs={"count": "x"})
