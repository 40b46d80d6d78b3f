# One case a line reads (and diffs) better than a wrapped one: long lines are kept here.
# ruff: noqa: E501
"""The corpus: requests sent alike to the platform and to vLLM's own server, one line each.

Add a case by adding a line: a unique name, the endpoint ("chat", "completions" or "batch"), the body
without `model`, and `stream=True` to send it as a stream (with `include_usage`). Keep answers
deterministic (temperature 0, or a seed) and short (max_tokens of a few tokens).

The demo model is trained to close JSON and tool calls, so structured and tool cases finish
with `stop` inside their max_tokens, as a real model's would; and the ids below (" How",
" can", ...) are what it says greedily to their prompts, so stop and bias cases have something
to act on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CHAT = "chat"
COMPLETIONS = "completions"
BATCH = "batch"  # vLLM's batch chat: `messages` holds conversations, each answered as a choice
PATHS = {
    CHAT: "/v1/chat/completions",
    COMPLETIONS: "/v1/completions",
    BATCH: "/v1/chat/completions/batch",
}

# Token ids of the demo tokenizer (models_registry.demo_model builds it deterministically).
HOW, CAN = 3979, 646  # greedy chat answer to "hello": "Hello! How can I help?"
PRI, OR = 2319, 273  # greedy completion of "def main(args):": 'ge", "prior": "gy"}'
IM_START, IM_END, EOS = 2, 3, 1  # <|im_start|>; <|im_end|> and <|end_of_text|> end a generation

HELLO = [{"role": "user", "content": "hello"}]
DOCUMENTS = [
    {"title": "Queues", "text": "A queue is first in, first out."},
    {"text": "A stack is last in, first out."},
]
LONG = [{"role": "system", "content": "You answer briefly and well. " * 60}, *HELLO]
TURNS = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "hi there"},
    {"role": "user", "content": "what is a queue?"},
]
PROMPT = "def main(args):"
LONG_PROMPT = "import os\nimport sys\n" * 120
G = {"temperature": 0, "max_tokens": 8}  # greedy
# With its end token ignored, the greedy answer falls into a loop: this ends it (vLLM's option).
REPEATS = {"max_pattern_size": 8, "min_count": 3}
S = {"temperature": 0.9, "seed": 7, "max_tokens": 8}  # sampled with a seed
RUNNING = {"include_usage": True, "continuous_usage_stats": True}  # usage on every chunk
GS = {"temperature": 0, "max_tokens": 64}  # greedy, structured: room to close the object
# A reasoning model's thinking, opened by the template and closed by the engine after 4 tokens.
THINK = {
    "chat_template_kwargs": {"enable_thinking": True},
    "thinking_token_budget": 4,
    "max_tokens": 14,
}


def _tool(name: str, param: str, values: list[str], strict: bool = True) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {param: {"type": "string", "enum": values}},
        "required": [param],
        "additionalProperties": False,
    }
    return {
        "type": "function",
        "function": {"name": name, "description": f"{name} by {param}", "parameters": schema, "strict": strict},
    }  # fmt: skip


WEATHER = _tool("get_weather", "unit", ["celsius", "fahrenheit"])
TIME = _tool("get_time", "zone", ["utc", "cet"])
LOOSE = _tool("get_news", "topic", ["sport", "tech"], strict=False)
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "weather in Paris, and the time?"}]
CALLED = [
    *ASK,
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"unit": "celsius"}'}},
    ]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
]  # fmt: skip
NAMED = {"type": "function", "function": {"name": "get_time"}}
UNKNOWN = {"type": "function", "function": {"name": "get_stock"}}
FUNCTIONS = [WEATHER["function"], TIME["function"]]

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "score": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["answer", "score"],
    "additionalProperties": False,
}  # fmt: skip
STRICT = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}}  # fmt: skip
LAX = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}
BAD_SCHEMA = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "objectx"}}}
REGEX = r"[a-z]{3,8}@example\.(com|org)"
CHOICES = ["red", "green", "blue"]
GRAMMAR = 'root ::= "go " direction\ndirection ::= "north" | "south" | "east" | "west"'


@dataclass(frozen=True)
class Case:
    name: str
    endpoint: str
    body: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    # Sent to the reasoning model (the demo model with vLLM's qwen3 reasoning parser).
    thinking: bool = False


# fmt: off
CASES = [
    # --- chat: sampling -----------------------------------------------------------------------
    Case("chat-greedy", CHAT, {**G, "messages": HELLO}),
    Case("chat-greedy-stream", CHAT, {**G, "messages": HELLO}, stream=True),
    # A count written as a number without a fraction is an integer (JSON Schema; vLLM's server).
    Case("chat-counts-as-whole-floats", CHAT, {**G, "max_tokens": 4.0, "n": 1.0, "top_k": 5.0, "messages": HELLO}),
    Case("chat-seed", CHAT, {**S, "messages": HELLO}),
    Case("chat-seed-stream", CHAT, {**S, "messages": HELLO}, stream=True),
    Case("chat-long-system", CHAT, {**G, "messages": LONG}),
    Case("chat-long-system-stream", CHAT, {**G, "messages": LONG}, stream=True),
    Case("chat-turns", CHAT, {**G, "messages": TURNS}),
    # Fields neither server lets change the answer.
    Case("chat-prompt-text", CHAT, {**G, "return_prompt_text": True, "messages": TURNS}),
    Case("chat-prompt-text-stream", CHAT, {**G, "return_prompt_text": True, "messages": TURNS}, stream=True),
    Case("chat-prompt-text-tools", CHAT, {**G, "return_prompt_text": True, "tools": [WEATHER], "messages": HELLO}),
    Case("chat-prompt-text-n2-stream", CHAT, {**S, "n": 2, "return_prompt_text": True, "messages": HELLO}, stream=True),
    # vLLM's documents, for a template that answers from them (the demo's lists them first).
    Case("chat-documents", CHAT, {**G, "documents": DOCUMENTS, "messages": HELLO}),
    Case("chat-documents-stream", CHAT, {**G, "documents": DOCUMENTS, "messages": HELLO}, stream=True),
    Case("chat-documents-prompt-text", CHAT, {**G, "documents": DOCUMENTS, "return_prompt_text": True, "tools": [WEATHER], "messages": TURNS}),
    Case("chat-documents-empty", CHAT, {**G, "documents": [], "messages": HELLO}),
    Case("chat-unused-fields", CHAT, {**G, "session_id": "conv-7", "prompt_cache_key": "k", "metadata": {"team": "yard"}, "messages": HELLO}),
    Case("chat-max-completion-tokens", CHAT, {"temperature": 0, "max_completion_tokens": 5, "messages": HELLO}),
    Case("chat-top-k", CHAT, {**S, "top_k": 5, "messages": HELLO}),
    Case("chat-top-p", CHAT, {**S, "top_p": 0.3, "messages": HELLO}),
    Case("chat-min-p", CHAT, {**S, "temperature": 1.0, "min_p": 0.9, "messages": HELLO}),
    Case("chat-presence-frequency", CHAT, {**G, "max_tokens": 16, "presence_penalty": 1.5, "frequency_penalty": 1.0, "messages": HELLO}),
    Case("chat-repetition-penalty", CHAT, {**G, "max_tokens": 16, "repetition_penalty": 1.5, "messages": HELLO}),
    Case("chat-logit-bias", CHAT, {**G, "logit_bias": {str(OR): 50}, "messages": HELLO}),
    Case("chat-stop", CHAT, {**G, "stop": [" can"], "messages": HELLO}),
    Case("chat-stop-stream", CHAT, {**G, "stop": [" can"], "messages": HELLO}, stream=True),
    Case("chat-stop-included", CHAT, {**G, "stop": [" can"], "include_stop_str_in_output": True, "messages": HELLO}),
    Case("chat-stop-included-stream", CHAT, {**G, "stop": [" can"], "include_stop_str_in_output": True, "messages": HELLO}, stream=True),
    Case("chat-stop-token-ids", CHAT, {**G, "stop_token_ids": [CAN], "messages": HELLO}),
    Case("chat-bad-words", CHAT, {**G, "bad_words": ["help"], "messages": HELLO}),
    Case("chat-repetition-detection", CHAT, {**G, "max_tokens": 64, "ignore_eos": True, "repetition_detection": REPEATS, "messages": HELLO}),
    Case("chat-repetition-detection-stream", CHAT, {**G, "max_tokens": 64, "ignore_eos": True, "repetition_detection": REPEATS, "messages": HELLO}, stream=True),
    Case("chat-repetition-detection-forced", CHAT, {**G, "max_tokens": 32, "logit_bias": {"300": 100}, "repetition_detection": {"max_pattern_size": 2, "min_count": 4}, "messages": HELLO}),
    Case("chat-repetition-detection-off", CHAT, {**G, "repetition_detection": {"max_pattern_size": 0, "min_count": 0}, "messages": HELLO}),
    Case("chat-allowed-token-ids", CHAT, {**G, "allowed_token_ids": [OR, PRI, CAN], "messages": HELLO}),
    Case("chat-allowed-token-ids-stream", CHAT, {**G, "allowed_token_ids": [OR, PRI], "messages": HELLO}, stream=True),
    Case("chat-add-special-tokens", CHAT, {**G, "add_special_tokens": True, "messages": HELLO}),
    Case("chat-template-kwargs", CHAT, {**G, "chat_template_kwargs": {"enable_thinking": False}, "messages": HELLO}),
    Case("chat-template-kwargs-stream", CHAT, {**G, "chat_template_kwargs": {"enable_thinking": False}, "messages": TURNS}, stream=True),
    Case("chat-template-kwargs-unread", CHAT, {**G, "chat_template_kwargs": {"enable_thinking": True, "unread": [1, 2]}, "messages": HELLO}),
    # vLLM's reasoning_effort: the template's variable, and enable_thinking unless the kwargs set it.
    Case("chat-reasoning-effort", CHAT, {**G, "reasoning_effort": "high", "return_prompt_text": True, "messages": HELLO}),
    Case("chat-reasoning-effort-none", CHAT, {**G, "reasoning_effort": "none", "return_prompt_text": True, "messages": HELLO}),
    Case("chat-reasoning-effort-stream", CHAT, {**G, "reasoning_effort": "low", "messages": TURNS}, stream=True),
    Case("chat-reasoning-effort-kwargs", CHAT, {**G, "reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "max"}, "return_prompt_text": True, "messages": HELLO}),
    Case("chat-reasoning-effort-null", CHAT, {**G, "reasoning_effort": None, "messages": HELLO}),
    Case("chat-template-kwargs-tokenize", CHAT, {**G, "chat_template_kwargs": {"tokenize": True}, "messages": HELLO}),
    Case("chat-template-kwargs-generation-prompt", CHAT, {**G, "chat_template_kwargs": {"add_generation_prompt": False}, "messages": HELLO}),
    Case("chat-logprobs-token-ids", CHAT, {**G, "logprobs": True, "top_logprobs": 3, "return_tokens_as_token_ids": True, "messages": HELLO}),
    Case("chat-logprobs-token-ids-stream", CHAT, {**G, "logprobs": True, "top_logprobs": 2, "return_tokens_as_token_ids": True, "messages": HELLO}, stream=True),
    Case("chat-cache-salt", CHAT, {**G, "cache_salt": "team-a", "messages": LONG}),
    Case("chat-cache-salt-stream", CHAT, {**G, "cache_salt": "team-b", "messages": LONG}, stream=True),
    Case("chat-eos-biased", CHAT, {**G, "logit_bias": {str(IM_END): 100}, "messages": HELLO}),
    Case("chat-min-tokens", CHAT, {**G, "min_tokens": 4, "logit_bias": {str(IM_END): 100}, "messages": HELLO}),
    Case("chat-ignore-eos", CHAT, {**G, "ignore_eos": True, "logit_bias": {str(IM_END): 100}, "messages": HELLO}),
    Case("chat-special-kept", CHAT, {**G, "logit_bias": {str(IM_START): 100}, "skip_special_tokens": False, "messages": HELLO}),
    Case("chat-special-skipped", CHAT, {**G, "logit_bias": {str(IM_START): 100}, "messages": HELLO}),
    Case("chat-special-unspaced", CHAT, {**G, "logit_bias": {str(IM_START): 100}, "skip_special_tokens": False, "spaces_between_special_tokens": False, "messages": HELLO}),
    # --- chat: logprobs and n -----------------------------------------------------------------
    Case("chat-logprobs", CHAT, {**G, "logprobs": True, "messages": HELLO}),
    Case("chat-top-logprobs", CHAT, {**G, "logprobs": True, "top_logprobs": 3, "messages": HELLO}),
    Case("chat-top-logprobs-stream", CHAT, {**G, "logprobs": True, "top_logprobs": 3, "messages": HELLO}, stream=True),
    Case("chat-n2", CHAT, {**S, "n": 2, "messages": HELLO}),
    Case("chat-n3-stream", CHAT, {**S, "n": 3, "messages": HELLO}, stream=True),
    # vLLM's logprob_token_ids: each position lists the sampled token and exactly these.
    Case("chat-logprob-token-ids", CHAT, {**G, "logprobs": True, "logprob_token_ids": [HOW, CAN, IM_END], "messages": HELLO}),
    Case("chat-logprob-token-ids-stream", CHAT, {**G, "logprobs": True, "logprob_token_ids": [OR, IM_END], "messages": HELLO}, stream=True),
    Case("chat-logprob-token-ids-n2", CHAT, {**S, "n": 2, "logprobs": True, "top_logprobs": 0, "logprob_token_ids": [HOW, CAN], "messages": HELLO}),
    Case("chat-n2-logprobs", CHAT, {**S, "n": 2, "logprobs": True, "top_logprobs": 2, "messages": HELLO}),
    # --- chat: structured output --------------------------------------------------------------
    Case("chat-json-object", CHAT, {**GS, "response_format": {"type": "json_object"}, "messages": HELLO}),
    Case("chat-json-object-stream", CHAT, {**GS, "response_format": {"type": "json_object"}, "messages": HELLO}, stream=True),
    Case("chat-json-schema-strict", CHAT, {**GS, "response_format": STRICT, "messages": HELLO}),
    Case("chat-json-schema-strict-stream", CHAT, {**GS, "response_format": STRICT, "messages": HELLO}, stream=True),
    Case("chat-json-schema", CHAT, {**GS, "response_format": LAX, "messages": HELLO}),
    Case("chat-response-format-text", CHAT, {**G, "response_format": {"type": "text"}, "messages": HELLO}),
    Case("chat-so-json", CHAT, {**GS, "structured_outputs": {"json": SCHEMA}, "messages": HELLO}),
    Case("chat-so-regex", CHAT, {**G, "max_tokens": 16, "structured_outputs": {"regex": REGEX}, "messages": HELLO}),
    Case("chat-so-regex-stream", CHAT, {**G, "max_tokens": 16, "structured_outputs": {"regex": REGEX}, "messages": HELLO}, stream=True),
    Case("chat-so-choice", CHAT, {**G, "structured_outputs": {"choice": CHOICES}, "messages": HELLO}),
    Case("chat-so-choice-stream", CHAT, {**G, "structured_outputs": {"choice": CHOICES}, "messages": HELLO}, stream=True),
    Case("chat-so-grammar", CHAT, {**G, "structured_outputs": {"grammar": GRAMMAR}, "messages": HELLO}),
    Case("chat-so-grammar-stream", CHAT, {**G, "structured_outputs": {"grammar": GRAMMAR}, "messages": HELLO}, stream=True),
    Case("chat-so-choice-seed-n2", CHAT, {**S, "n": 2, "structured_outputs": {"choice": CHOICES}, "messages": HELLO}),
    # --- chat: tools --------------------------------------------------------------------------
    Case("chat-tools-auto", CHAT, {**G, "tools": TOOLS, "messages": ASK}),
    Case("chat-tools-auto-stream", CHAT, {**G, "tools": TOOLS, "tool_choice": "auto", "messages": ASK}, stream=True),
    Case("chat-tools-none", CHAT, {**G, "tools": TOOLS, "tool_choice": "none", "messages": ASK}),
    Case("chat-tools-required", CHAT, {**GS, "max_tokens": 64, "tools": TOOLS, "tool_choice": "required", "messages": ASK}),
    Case("chat-tools-required-single", CHAT, {**GS, "max_tokens": 64, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "messages": ASK}),
    Case("chat-tools-required-single-stream", CHAT, {**GS, "max_tokens": 64, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "messages": ASK}, stream=True),
    Case("chat-tools-named", CHAT, {**GS, "max_tokens": 64, "tools": TOOLS, "tool_choice": NAMED, "messages": ASK}),
    Case("chat-tools-named-stream", CHAT, {**GS, "max_tokens": 64, "tools": TOOLS, "tool_choice": NAMED, "messages": ASK}, stream=True),
    Case("chat-tools-named-loose", CHAT, {**GS, "max_tokens": 64, "tools": [LOOSE], "tool_choice": {"type": "function", "function": {"name": "get_news"}}, "messages": ASK}),
    Case("chat-tools-required-n2", CHAT, {**GS, **S, "max_tokens": 64, "n": 2, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "messages": ASK}),
    Case("chat-tools-history", CHAT, {**G, "tools": TOOLS, "messages": CALLED}),
    Case("chat-tools-history-stream", CHAT, {**G, "tools": TOOLS, "messages": CALLED}, stream=True),
    Case("chat-tools-history-named", CHAT, {**GS, "max_tokens": 64, "tools": TOOLS, "tool_choice": NAMED, "messages": CALLED}),
    # Tools a tool search defers (vLLM's defer_loading, on the tool or its function): to the template.
    Case("chat-tools-deferred", CHAT, {**G, "return_prompt_text": True, "tools": [{**WEATHER, "defer_loading": True}, {"type": "function", "function": {**TIME["function"], "defer_loading": False}}], "messages": ASK}),
    # --- chat: content parts, as vLLM's server writes them for a template that reads strings ----
    Case("chat-parts-text-kinds", CHAT, {**G, "return_prompt_text": True, "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "input_text", "text": "there"}, {"type": "output_text", "text": "you"}]}]}),
    Case("chat-parts-empty-text", CHAT, {**G, "return_prompt_text": True, "messages": [{"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "hello"}]}]}),
    Case("chat-parts-refusal-thinking", CHAT, {**G, "return_prompt_text": True, "messages": [*HELLO, {"role": "assistant", "content": [{"type": "thinking", "thinking": "they greet"}, {"type": "refusal", "refusal": "I cannot."}]}, *HELLO]}),
    Case("chat-parts-tool-reference", CHAT, {**G, "return_prompt_text": True, "tools": TOOLS, "messages": [*CALLED[:2], {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "tool_reference", "name": "get_time"}, {"type": "text", "text": "found"}]}]}),
    Case("chat-parts-billing-header", CHAT, {**G, "return_prompt_text": True, "messages": [{"role": "system", "content": [{"type": "text", "text": "x-anthropic-billing-header: cch=1;\nBe terse."}, {"type": "text", "text": "x-anthropic-billing-header: cch=2;"}]}, *HELLO]}),
    Case("chat-parts-billing-header-string", CHAT, {**G, "return_prompt_text": True, "messages": [{"role": "system", "content": "x-anthropic-billing-header: cch=1;\nBe terse."}, *HELLO]}),
    Case("chat-parts-billing-header-user", CHAT, {**G, "return_prompt_text": True, "messages": [{"role": "user", "content": [{"type": "text", "text": "x-anthropic-billing-header: cch=1;\nhello"}]}]}),
    Case("chat-parts-bare-string", CHAT, {**G, "return_prompt_text": True, "messages": [{"role": "user", "content": ["hello", {"type": "text", "text": "there"}]}]}),
    Case("chat-parts-null-text", CHAT, {**G, "return_prompt_text": True, "messages": [{"role": "user", "content": [{"type": "text", "text": None}, {"type": "text", "text": "hello"}]}]}),
    Case("bad-chat-parts-image", CHAT, {**G, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}),
    Case("bad-chat-parts-unknown", CHAT, {**G, "messages": [{"role": "user", "content": [{"type": "sticker", "text": "hello"}]}]}),
    # --- completions --------------------------------------------------------------------------
    Case("cmpl-greedy", COMPLETIONS, {**G, "prompt": PROMPT}),
    Case("cmpl-greedy-stream", COMPLETIONS, {**G, "prompt": PROMPT}, stream=True),
    Case("cmpl-seed", COMPLETIONS, {**S, "prompt": PROMPT}),
    Case("cmpl-seed-stream", COMPLETIONS, {**S, "prompt": PROMPT}, stream=True),
    Case("cmpl-long-prompt", COMPLETIONS, {**G, "prompt": LONG_PROMPT}),
    Case("cmpl-long-prompt-stream", COMPLETIONS, {**G, "prompt": LONG_PROMPT}, stream=True),
    Case("cmpl-token-ids", COMPLETIONS, {**G, "prompt": [PRI, OR, HOW]}),
    Case("cmpl-list", COMPLETIONS, {**G, "prompt": [PROMPT, "hello", "import os"]}),
    Case("cmpl-list-stream", COMPLETIONS, {**G, "prompt": [PROMPT, "hello"]}, stream=True),
    Case("cmpl-list-token-ids", COMPLETIONS, {**G, "prompt": [[PRI, OR], [HOW, CAN, HOW]]}),
    # An empty text in an array is the tokenizer's BOS alone (a bare "" is refused, below).
    Case("cmpl-list-empty-text", COMPLETIONS, {**G, "prompt": ["", PROMPT]}),
    Case("cmpl-empty-stream-options-unstreamed", COMPLETIONS, {**G, "prompt": PROMPT, "stream_options": {}}),
    Case("cmpl-list-empty-text-stream", COMPLETIONS, {**G, "prompt": [""]}, stream=True),
    Case("cmpl-n2", COMPLETIONS, {**S, "n": 2, "prompt": PROMPT}),
    Case("cmpl-n2-list-stream", COMPLETIONS, {**S, "n": 2, "prompt": [PROMPT, "hello"]}, stream=True),
    Case("cmpl-logprobs", COMPLETIONS, {**G, "logprobs": 3, "prompt": PROMPT}),
    Case("cmpl-logprobs-0", COMPLETIONS, {**G, "logprobs": 0, "prompt": PROMPT}),
    Case("cmpl-logprobs-stream", COMPLETIONS, {**G, "logprobs": 2, "prompt": PROMPT}, stream=True),
    Case("cmpl-echo", COMPLETIONS, {**G, "echo": True, "prompt": PROMPT}),
    Case("cmpl-echo-logprobs", COMPLETIONS, {**G, "echo": True, "logprobs": 2, "prompt": PROMPT}),
    Case("cmpl-echo-logprobs-stream", COMPLETIONS, {**G, "echo": True, "logprobs": 2, "prompt": PROMPT}, stream=True),
    # Echo with max_tokens 0 scores the prompt alone (the engine's one token counted in usage).
    Case("cmpl-echo-prompt-only", COMPLETIONS, {**G, "max_tokens": 0, "echo": True, "logprobs": 2, "prompt": PROMPT}),
    Case("cmpl-echo-prompt-only-stream", COMPLETIONS, {**G, "max_tokens": 0, "echo": True, "logprobs": 1, "prompt": PROMPT}, stream=True),
    Case("cmpl-echo-prompt-only-list", COMPLETIONS, {**G, "max_tokens": 0, "echo": True, "prompt": [PROMPT, "hello"]}),
    Case("bad-cmpl-max-tokens-0", COMPLETIONS, {**G, "max_tokens": 0, "prompt": PROMPT}),
    Case("bad-cmpl-echo-prompt-only-logprob-token-ids", COMPLETIONS, {**G, "max_tokens": 0, "echo": True, "logprobs": 0, "logprob_token_ids": [OR], "prompt": PROMPT}),
    Case("cmpl-logprob-token-ids", COMPLETIONS, {**G, "logprobs": 0, "logprob_token_ids": [PRI, OR, EOS], "prompt": PROMPT}),
    Case("cmpl-logprob-token-ids-stream", COMPLETIONS, {**G, "logprobs": 0, "logprob_token_ids": [OR], "prompt": PROMPT}, stream=True),
    Case("cmpl-echo-logprob-token-ids", COMPLETIONS, {**G, "echo": True, "logprobs": 2, "logprob_token_ids": [PRI, HOW], "prompt": PROMPT}),
    Case("cmpl-list-logprobs-n2", COMPLETIONS, {**S, "n": 2, "logprobs": 1, "prompt": [PROMPT, "hello"]}),
    Case("cmpl-stop", COMPLETIONS, {**G, "stop": ["pri"], "prompt": PROMPT}),
    Case("cmpl-stop-included", COMPLETIONS, {**G, "stop": ["pri"], "include_stop_str_in_output": True, "prompt": PROMPT}),
    Case("cmpl-stop-token-ids", COMPLETIONS, {**G, "stop_token_ids": [OR], "prompt": PROMPT}),
    Case("cmpl-bad-words", COMPLETIONS, {**G, "bad_words": ["pri"], "prompt": PROMPT}),
    Case("cmpl-repetition-detection", COMPLETIONS, {**G, "max_tokens": 64, "ignore_eos": True, "repetition_detection": {**REPEATS, "min_pattern_size": 2}, "prompt": PROMPT}),
    Case("cmpl-repetition-detection-stream", COMPLETIONS, {**G, "max_tokens": 64, "ignore_eos": True, "repetition_detection": REPEATS, "prompt": PROMPT}, stream=True),
    Case("cmpl-allowed-token-ids", COMPLETIONS, {**S, "allowed_token_ids": [HOW, CAN, EOS], "prompt": PROMPT}),
    Case("cmpl-no-special-tokens", COMPLETIONS, {**G, "add_special_tokens": False, "prompt": PROMPT}),
    Case("cmpl-no-special-tokens-stream", COMPLETIONS, {**G, "add_special_tokens": False, "prompt": PROMPT}, stream=True),
    Case("cmpl-special-tokens-token-ids", COMPLETIONS, {**G, "add_special_tokens": True, "prompt": [PRI, OR, HOW]}),
    Case("cmpl-logprobs-token-ids", COMPLETIONS, {**G, "logprobs": 2, "return_tokens_as_token_ids": True, "prompt": PROMPT}),
    Case("cmpl-echo-logprobs-token-ids-stream", COMPLETIONS, {**G, "echo": True, "logprobs": 1, "return_tokens_as_token_ids": True, "prompt": PROMPT}, stream=True),
    Case("cmpl-cache-salt", COMPLETIONS, {**G, "cache_salt": "team-a", "prompt": LONG_PROMPT}),
    Case("cmpl-return-token-ids", COMPLETIONS, {**G, "return_token_ids": True, "prompt": PROMPT}),
    Case("cmpl-token-ids-stream", COMPLETIONS, {**G, "return_token_ids": True, "prompt": PROMPT}, stream=True),
    Case("cmpl-token-ids-prompts-n", COMPLETIONS, {**S, "n": 2, "return_token_ids": True, "prompt": [PROMPT, "hello there, world"]}),
    Case("cmpl-token-ids-prompts-n-stream", COMPLETIONS, {**S, "n": 2, "return_token_ids": True, "prompt": [[PRI, OR], [PRI, OR, HOW]]}, stream=True),
    Case("cmpl-token-ids-echo-truncated", COMPLETIONS, {**G, "return_token_ids": True, "echo": True, "truncate_prompt_tokens": 3, "prompt": PROMPT}),
    Case("chat-token-ids", CHAT, {**G, "return_token_ids": True, "messages": TURNS}),
    Case("chat-token-ids-stream", CHAT, {**G, "return_token_ids": True, "messages": TURNS}, stream=True),
    Case("chat-token-ids-n-stream", CHAT, {**S, "n": 2, "return_token_ids": True, "messages": HELLO}, stream=True),
    # 64 tokens, so the call is whole: a call cut mid-arguments parses by how the tokens were
    # grouped into outputs, which varies with load on either server (a clean clone's run got
    # "{}" from the platform and "" from vLLM for the same 24 tokens).
    Case("chat-token-ids-tools-stream", CHAT, {**GS, "max_tokens": 64, "return_token_ids": True, "tools": TOOLS, "tool_choice": "required", "messages": ASK}, stream=True),
    Case("cmpl-truncate", COMPLETIONS, {**G, "truncate_prompt_tokens": 3, "prompt": PROMPT}),
    Case("cmpl-truncate-left", COMPLETIONS, {**G, "truncate_prompt_tokens": 3, "truncation_side": "left", "prompt": PROMPT}),
    Case("cmpl-truncate-right-stream", COMPLETIONS, {**G, "truncate_prompt_tokens": 3, "truncation_side": "right", "prompt": PROMPT}, stream=True),
    Case("cmpl-truncate-token-ids", COMPLETIONS, {**G, "truncate_prompt_tokens": 2, "prompt": [PRI, OR, HOW]}),
    Case("cmpl-truncate-token-ids-left", COMPLETIONS, {**G, "truncate_prompt_tokens": 2, "truncation_side": "left", "prompt": [PRI, OR, HOW]}),
    Case("cmpl-truncate-to-context", COMPLETIONS, {**G, "truncate_prompt_tokens": -1, "truncation_side": "left", "prompt": LONG_PROMPT * 4}),
    Case("cmpl-truncate-prompts", COMPLETIONS, {**G, "truncate_prompt_tokens": 4, "prompt": [PROMPT, "hello there, world"]}),
    Case("cmpl-truncate-echo", COMPLETIONS, {**G, "truncate_prompt_tokens": 3, "echo": True, "prompt": PROMPT}),
    Case("cmpl-truncate-longer", COMPLETIONS, {**G, "truncate_prompt_tokens": 500, "prompt": PROMPT}),
    Case("chat-truncate", CHAT, {**G, "truncate_prompt_tokens": 6, "messages": TURNS}),
    Case("chat-truncate-left-stream", CHAT, {**G, "truncate_prompt_tokens": 6, "truncation_side": "left", "messages": TURNS}, stream=True),
    Case("chat-truncate-special", CHAT, {**G, "truncate_prompt_tokens": 4, "add_special_tokens": True, "messages": HELLO}),
    Case("cmpl-logit-bias", COMPLETIONS, {**G, "logit_bias": {str(HOW): 50}, "prompt": PROMPT}),
    Case("cmpl-min-tokens", COMPLETIONS, {**G, "min_tokens": 3, "logit_bias": {str(EOS): 100}, "prompt": PROMPT}),
    Case("cmpl-ignore-eos", COMPLETIONS, {**G, "ignore_eos": True, "logit_bias": {str(EOS): 100}, "prompt": PROMPT}),
    Case("cmpl-special-kept", COMPLETIONS, {**G, "logit_bias": {str(IM_START): 100}, "skip_special_tokens": False, "prompt": PROMPT}),
    Case("cmpl-penalties", COMPLETIONS, {**G, "max_tokens": 16, "presence_penalty": 1.0, "frequency_penalty": 1.5, "prompt": PROMPT}),
    Case("cmpl-repetition-penalty", COMPLETIONS, {**G, "max_tokens": 16, "repetition_penalty": 1.4, "prompt": PROMPT}),
    Case("cmpl-min-p", COMPLETIONS, {**S, "temperature": 1.0, "min_p": 0.9, "prompt": PROMPT}),
    Case("cmpl-so-regex", COMPLETIONS, {**G, "max_tokens": 16, "structured_outputs": {"regex": REGEX}, "prompt": PROMPT}),
    Case("cmpl-so-choice", COMPLETIONS, {**G, "structured_outputs": {"choice": CHOICES}, "prompt": PROMPT}),
    Case("cmpl-so-json", COMPLETIONS, {**GS, "structured_outputs": {"json": SCHEMA}, "prompt": PROMPT}),
    Case("cmpl-json-schema-strict", COMPLETIONS, {**GS, "response_format": STRICT, "prompt": PROMPT}),
    # --- vLLM's beam search: n beams, each step's likeliest kept -------------------------------
    Case("chat-beam", CHAT, {"temperature": 0, "max_tokens": 6, "n": 2, "use_beam_search": True, "messages": HELLO}),
    Case("chat-beam-stream", CHAT, {"temperature": 0, "max_tokens": 6, "n": 3, "use_beam_search": True, "messages": HELLO}, stream=True),
    Case("chat-beam-one", CHAT, {"max_tokens": 6, "use_beam_search": True, "messages": TURNS}),
    Case("chat-beam-length-penalty", CHAT, {"max_tokens": 8, "n": 2, "use_beam_search": True, "length_penalty": 0.2, "ignore_eos": True, "messages": HELLO}),
    Case("cmpl-beam", COMPLETIONS, {"max_tokens": 6, "n": 3, "use_beam_search": True, "prompt": PROMPT}),
    Case("chat-beam-token-ids", CHAT, {"max_tokens": 5, "n": 2, "use_beam_search": True, "return_token_ids": True, "messages": HELLO}),
    Case("cmpl-beam-truncated-salted", COMPLETIONS, {"max_tokens": 5, "n": 2, "use_beam_search": True, "truncate_prompt_tokens": 3, "cache_salt": "s1", "prompt": PROMPT}),
    Case("cmpl-beam-prompts", COMPLETIONS, {"max_tokens": 5, "n": 2, "use_beam_search": True, "prompt": [PROMPT, "hello"]}),
    Case("cmpl-beam-stop-included", COMPLETIONS, {"max_tokens": 6, "n": 2, "use_beam_search": True, "include_stop_str_in_output": True, "skip_special_tokens": False, "prompt": PROMPT}),
    # --- bad input: the same status ------------------------------------------------------------
    Case("bad-chat-n0", CHAT, {**G, "n": 0, "messages": HELLO}),
    Case("bad-chat-tools-empty", CHAT, {**G, "tools": [], "messages": HELLO}),
    Case("bad-chat-n2-greedy", CHAT, {**G, "n": 2, "messages": HELLO}),
    Case("bad-cmpl-n0", COMPLETIONS, {**G, "n": 0, "prompt": PROMPT}),
    Case("bad-chat-schema", CHAT, {**G, "response_format": BAD_SCHEMA, "messages": HELLO}),
    Case("bad-chat-json-schema-missing", CHAT, {**G, "response_format": {"type": "json_schema"}, "messages": HELLO}),
    Case("bad-chat-regex", CHAT, {**G, "structured_outputs": {"regex": "(unclosed"}, "messages": HELLO}),
    Case("bad-chat-grammar", CHAT, {**G, "structured_outputs": {"grammar": "root ::= missing"}, "messages": HELLO}),
    Case("bad-chat-two-constraints", CHAT, {**G, "structured_outputs": {"regex": REGEX, "choice": CHOICES}, "messages": HELLO}),
    Case("bad-chat-tool-choice-unknown", CHAT, {**G, "tools": TOOLS, "tool_choice": UNKNOWN, "messages": ASK}),
    Case("bad-chat-tool-choice-without-tools", CHAT, {**G, "tool_choice": NAMED, "messages": ASK}),
    Case("bad-chat-tool-choice-word", CHAT, {**G, "tools": TOOLS, "tool_choice": "sometimes", "messages": ASK}),
    Case("bad-chat-top-logprobs-alone", CHAT, {**G, "top_logprobs": 3, "messages": HELLO}),
    Case("bad-chat-top-logprobs-21", CHAT, {**G, "logprobs": True, "top_logprobs": 21, "messages": HELLO}),
    Case("bad-cmpl-logprobs-21", COMPLETIONS, {**G, "logprobs": 21, "prompt": PROMPT}),
    Case("bad-chat-logprob-token-ids-alone", CHAT, {**G, "logprob_token_ids": [HOW], "messages": HELLO}),
    Case("bad-cmpl-logprob-token-ids-alone", COMPLETIONS, {**G, "logprob_token_ids": [HOW], "prompt": PROMPT}),
    Case("bad-cmpl-logprob-token-ids-vocab", COMPLETIONS, {**G, "logprobs": 0, "logprob_token_ids": [HOW, 999999], "prompt": PROMPT}),
    Case("bad-chat-logprob-token-ids-129", CHAT, {**G, "logprobs": True, "logprob_token_ids": list(range(129)), "messages": HELLO}),
    Case("bad-chat-reasoning-effort", CHAT, {**G, "reasoning_effort": "extreme", "messages": HELLO}),
    Case("bad-chat-reasoning-effort-number", CHAT, {**G, "reasoning_effort": 3, "messages": HELLO}),
    Case("bad-chat-documents-number", CHAT, {**G, "documents": [{"title": "x", "pages": 5}], "messages": HELLO}),
    Case("bad-chat-documents-object", CHAT, {**G, "documents": {"title": "x"}, "messages": HELLO}),
    Case("bad-cmpl-beam-stream", COMPLETIONS, {"max_tokens": 6, "n": 2, "use_beam_search": True, "prompt": PROMPT}, stream=True),
    Case("bad-chat-beam-n11", CHAT, {"max_tokens": 4, "n": 11, "use_beam_search": True, "messages": HELLO}),
    Case("bad-chat-logit-bias-vocab", CHAT, {**G, "logit_bias": {"999999": 5}, "messages": HELLO}),
    Case("bad-chat-min-p", CHAT, {**G, "min_p": 1.5, "messages": HELLO}),
    Case("bad-chat-repetition-count", CHAT, {**G, "repetition_detection": {"max_pattern_size": 4, "min_count": 1}, "messages": HELLO}),
    Case("bad-chat-repetition-sizes", CHAT, {**G, "repetition_detection": {"max_pattern_size": 2, "min_pattern_size": 4, "min_count": 3}, "messages": HELLO}),
    Case("bad-chat-repetition-penalty", CHAT, {**G, "repetition_penalty": 0, "messages": HELLO}),
    Case("bad-cmpl-min-tokens", COMPLETIONS, {**G, "min_tokens": 20, "prompt": PROMPT}),
    Case("bad-cmpl-empty-list", COMPLETIONS, {**G, "prompt": []}),
    Case("bad-cmpl-empty-prompt", COMPLETIONS, {**G, "prompt": ""}),
    Case("bad-cmpl-empty-suffix", COMPLETIONS, {**G, "prompt": PROMPT, "suffix": ""}),
    Case("bad-cmpl-empty-text-no-tokens", COMPLETIONS, {**G, "prompt": [""], "add_special_tokens": False}),
    Case("bad-cmpl-empty-token-ids", COMPLETIONS, {**G, "prompt": [[], [PRI]]}),
    Case("bad-chat-allowed-token-ids-empty", CHAT, {**G, "allowed_token_ids": [], "messages": HELLO}),
    Case("bad-cmpl-allowed-token-ids-vocab", COMPLETIONS, {**G, "allowed_token_ids": [HOW, 999999], "prompt": PROMPT}),
    Case("bad-chat-template-kwargs-template", CHAT, {**G, "chat_template_kwargs": {"chat_template": "{{ 'x' }}"}, "messages": HELLO}),
    Case("bad-chat-cache-salt-empty", CHAT, {**G, "cache_salt": "", "messages": HELLO}),
    Case("bad-chat-cache-salt-slash", CHAT, {**G, "cache_salt": "a/b", "messages": HELLO}),
    Case("bad-cmpl-cache-salt-long", COMPLETIONS, {**G, "cache_salt": "x" * 129, "prompt": PROMPT}),
    Case("bad-cmpl-mixed-prompts", COMPLETIONS, {**G, "prompt": [PROMPT, [PRI, OR, HOW]]}),
    Case("bad-cmpl-truncate-over-context", COMPLETIONS, {**G, "truncate_prompt_tokens": 4096, "prompt": PROMPT}),
    Case("bad-chat-truncate-below-minus-one", CHAT, {**G, "truncate_prompt_tokens": -2, "messages": HELLO}),
    Case("bad-cmpl-truncation-side", COMPLETIONS, {**G, "truncate_prompt_tokens": 2, "truncation_side": "middle", "prompt": PROMPT}),
    Case("bad-cmpl-truncate-zero", COMPLETIONS, {**G, "truncate_prompt_tokens": 0, "prompt": PROMPT}),
    # --- vLLM's prompt_logprobs (and the prompt scoring an echo asks for) -----------------------
    Case("cmpl-prompt-logprobs", COMPLETIONS, {**G, "prompt_logprobs": 2, "prompt": PROMPT}),
    Case("cmpl-prompt-logprobs-zero", COMPLETIONS, {**G, "prompt_logprobs": 0, "prompt": PROMPT}),
    Case("cmpl-prompt-logprobs-echo", COMPLETIONS, {**G, "prompt_logprobs": 1, "echo": True, "logprobs": 3, "prompt": PROMPT}),
    Case("cmpl-prompt-logprobs-prompts-n", COMPLETIONS, {**S, "n": 2, "prompt_logprobs": 1, "prompt": ["hello", PROMPT]}),
    Case("cmpl-prompt-logprobs-token-ids", COMPLETIONS, {**G, "prompt_logprobs": 3, "prompt": [PRI, OR, HOW]}),
    Case("cmpl-prompt-logprobs-truncated", COMPLETIONS, {**G, "prompt_logprobs": 1, "truncate_prompt_tokens": 3, "prompt": PROMPT}),
    Case("cmpl-prompt-logprobs-zero-stream", COMPLETIONS, {**G, "prompt_logprobs": 0, "prompt": PROMPT}, stream=True),
    Case("chat-prompt-logprobs", CHAT, {**G, "prompt_logprobs": 2, "messages": HELLO}),
    Case("chat-prompt-logprobs-n", CHAT, {**S, "n": 2, "prompt_logprobs": 1, "messages": TURNS}),
    Case("chat-prompt-logprobs-logprobs", CHAT, {**G, "prompt_logprobs": 1, "logprobs": True, "top_logprobs": 2, "messages": HELLO}),
    Case("chat-prompt-logprobs-zero-stream", CHAT, {**G, "prompt_logprobs": 0, "messages": HELLO}, stream=True),
    Case("chat-echo", CHAT, {**G, "echo": True, "messages": HELLO}),
    Case("chat-echo-top-logprobs", CHAT, {**G, "echo": True, "logprobs": True, "top_logprobs": 2, "messages": HELLO}),
    Case("chat-echo-assistant", CHAT, {**G, "echo": True, "add_generation_prompt": False, "continue_final_message": True, "messages": [*HELLO, {"role": "assistant", "content": "hi"}]}),
    Case("chat-echo-stream", CHAT, {**G, "echo": True, "messages": HELLO}, stream=True),
    # vLLM's continuous_usage_stats: every chunk carries its choice's usage so far.
    Case("chat-running-usage-stream", CHAT, {**S, "n": 2, "stream_options": RUNNING, "messages": TURNS}, stream=True),
    Case("cmpl-running-usage-stream", COMPLETIONS, {**G, "stream_options": RUNNING, "prompt": [PROMPT, "hello there"]}, stream=True),
    Case("cmpl-running-usage-echo-stream", COMPLETIONS, {**G, "echo": True, "stream_options": RUNNING, "prompt": PROMPT}, stream=True),
    Case("bad-chat-stream-option-not-boolean", CHAT, {**G, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": [1]}, "messages": HELLO}),
    # Without a generation prompt the answer is in the last message's role, and an echo opens with it.
    Case("chat-echo-user-turn", CHAT, {**G, "echo": True, "add_generation_prompt": False, "messages": TURNS}),
    Case("chat-echo-user-turn-stream", CHAT, {**G, "echo": True, "add_generation_prompt": False, "messages": TURNS}, stream=True),
    Case("chat-no-generation-prompt", CHAT, {**G, "add_generation_prompt": False, "messages": TURNS}),
    Case("bad-cmpl-prompt-logprobs-stream", COMPLETIONS, {**G, "prompt_logprobs": 1, "prompt": PROMPT}, stream=True),
    Case("bad-chat-prompt-logprobs-stream", CHAT, {**G, "prompt_logprobs": 2, "messages": HELLO}, stream=True),
    Case("bad-cmpl-prompt-logprobs-above-max", COMPLETIONS, {**G, "prompt_logprobs": 21, "prompt": PROMPT}),
    Case("bad-cmpl-prompt-logprobs-vocabulary", COMPLETIONS, {**G, "prompt_logprobs": -1, "prompt": PROMPT}),
    Case("bad-chat-prompt-logprobs-negative", CHAT, {**G, "prompt_logprobs": -2, "messages": HELLO}),
    # An earlier answer's thinking in the history (vLLM's `reasoning`, or its older name): to the template.
    Case("chat-history-reasoning", CHAT, {**G, "return_prompt_text": True, "messages": [*HELLO, {"role": "assistant", "content": "hi", "reasoning": "they greet"}, *HELLO]}),
    Case("chat-history-reasoning-content", CHAT, {**G, "return_prompt_text": True, "messages": [*HELLO, {"role": "assistant", "content": "hi", "reasoning_content": "they greet"}, *HELLO]}),
    Case("bad-chat-thinking-budget-no-parser", CHAT, {**G, "thinking_token_budget": 4, "messages": HELLO}),
    # --- a reasoning model (vLLM's qwen3 parser) -----------------------------------------------
    # Qwen3 thinks unless told not to: an answer without </think> is all thinking.
    Case("think-default", CHAT, {**G, "messages": HELLO}, thinking=True),
    Case("think-default-stream", CHAT, {**G, "messages": HELLO}, stream=True, thinking=True),
    # The template opens <think> and the engine closes it after the budget: thinking, then the answer.
    Case("think-budget", CHAT, {**G, **THINK, "messages": HELLO}, thinking=True),
    Case("think-budget-stream", CHAT, {**G, **THINK, "messages": HELLO}, stream=True, thinking=True),
    Case("think-budget-n", CHAT, {**S, **THINK, "max_tokens": 14, "n": 2, "messages": TURNS}, thinking=True),
    Case("think-budget-n-stream", CHAT, {**S, **THINK, "max_tokens": 14, "n": 2, "messages": TURNS}, stream=True, thinking=True),
    Case("think-budget-zero", CHAT, {**G, **THINK, "thinking_token_budget": 0, "messages": HELLO}, thinking=True),
    Case("think-budget-unbounded", CHAT, {**G, **THINK, "thinking_token_budget": -1, "messages": HELLO}, thinking=True),
    Case("think-off", CHAT, {**G, "chat_template_kwargs": {"enable_thinking": False}, "messages": HELLO}, thinking=True),
    Case("think-off-stream", CHAT, {**G, "chat_template_kwargs": {"enable_thinking": False}, "messages": HELLO}, stream=True, thinking=True),
    Case("think-effort-none", CHAT, {**G, "reasoning_effort": "none", "messages": HELLO}, thinking=True),
    Case("think-effort-high", CHAT, {**G, **THINK, "reasoning_effort": "high", "messages": HELLO}, thinking=True),
    # include_reasoning false: no thinking, and no logprobs or token ids that would show it.
    Case("think-hidden", CHAT, {**G, **THINK, "include_reasoning": False, "logprobs": True, "top_logprobs": 2, "return_token_ids": True, "messages": HELLO}, thinking=True),
    Case("think-hidden-stream", CHAT, {**G, **THINK, "include_reasoning": False, "logprobs": True, "messages": HELLO}, stream=True, thinking=True),
    Case("think-running-usage-stream", CHAT, {**G, **THINK, "stream_options": RUNNING, "messages": HELLO}, stream=True, thinking=True),
    Case("think-running-usage-n-stream", CHAT, {**S, **THINK, "n": 2, "include_reasoning": False, "stream_options": RUNNING, "messages": TURNS}, stream=True, thinking=True),
    Case("think-logprobs", CHAT, {**G, **THINK, "logprobs": True, "top_logprobs": 2, "messages": HELLO}, thinking=True),
    Case("think-history", CHAT, {**G, **THINK, "return_prompt_text": True, "messages": [*HELLO, {"role": "assistant", "content": "hi", "reasoning": "they greet"}, *HELLO]}, thinking=True),
    # A grammar or a forced tool call starts once the thinking ends.
    Case("think-json-schema", CHAT, {**GS, **THINK, "max_tokens": 40, "response_format": STRICT, "messages": HELLO}, thinking=True),
    Case("think-tools-required", CHAT, {**GS, **THINK, "max_tokens": 40, "tools": TOOLS, "tool_choice": "required", "messages": ASK}, thinking=True),
    Case("think-tools-auto-stream", CHAT, {**G, **THINK, "tools": TOOLS, "messages": ASK}, stream=True, thinking=True),
    Case("think-completions-budget", COMPLETIONS, {**G, "thinking_token_budget": 4, "max_tokens": 14, "prompt": "<think>\n" + PROMPT}, thinking=True),
    Case("bad-think-budget-negative", CHAT, {**G, "thinking_token_budget": -2, "messages": HELLO}, thinking=True),
    Case("bad-think-budget-string", CHAT, {**G, "thinking_token_budget": "4", "messages": HELLO}, thinking=True),
    # --- vLLM's batch chat: a choice per conversation, every other field a chat's ----------------
    Case("batch-greedy", BATCH, {**G, "messages": [HELLO, TURNS]}),
    Case("batch-seed", BATCH, {**S, "messages": [HELLO, TURNS, HELLO]}),
    Case("batch-long-system", BATCH, {**G, "messages": [LONG, HELLO]}),
    Case("batch-logprobs", BATCH, {**G, "logprobs": True, "top_logprobs": 2, "messages": [HELLO, TURNS]}),
    Case("batch-echo", BATCH, {**G, "echo": True, "add_generation_prompt": False, "continue_final_message": True, "messages": [[*HELLO, {"role": "assistant", "content": "hi"}], TURNS]}),
    Case("batch-token-ids", BATCH, {**G, "return_token_ids": True, "messages": [HELLO, TURNS]}),
    Case("batch-stop", BATCH, {**G, "stop": [" can"], "stop_token_ids": [HOW], "messages": [HELLO, TURNS]}),
    Case("batch-min-tokens", BATCH, {**G, "min_tokens": 6, "ignore_eos": True, "bad_words": ["help"], "messages": [HELLO, TURNS]}),
    Case("batch-json-schema", BATCH, {**GS, "response_format": STRICT, "messages": [HELLO, TURNS]}),
    Case("batch-choice", BATCH, {**G, "structured_outputs": {"choice": CHOICES}, "messages": [HELLO, TURNS]}),
    Case("batch-documents", BATCH, {**G, "documents": DOCUMENTS, "messages": [HELLO, TURNS]}),
    Case("bad-batch-n2", BATCH, {**S, "n": 2, "messages": [HELLO]}),
    Case("bad-batch-beam", BATCH, {**G, "use_beam_search": True, "messages": [HELLO]}),
    Case("bad-batch-empty", BATCH, {**G, "messages": []}),
    Case("bad-batch-empty-conversation", BATCH, {**G, "messages": [HELLO, []]}),
    Case("bad-batch-one-chats-messages", BATCH, {**G, "messages": HELLO}),
    Case("think-batch", BATCH, {**G, **THINK, "messages": [HELLO, TURNS]}, thinking=True),
]
# fmt: on
