"""The fields that carry a request's input: model, chat messages, completion prompts, stops.

Each is declared here as a `Kind` (its JSON Schema and its reader, together); inference.body.fields
puts them in the request tables, so the parsers and the OpenAPI document share them.
"""

from __future__ import annotations

from typing import Any

from config.json_body import shown
from inference.base.errors import ApiError, invalid
from inference.body.types import TOKEN_IDS, Schema, custom, is_token
from inference.body.types import type_error as _type_error
from models_registry.tokenizer import CONTENT_PARTS

ROLES = {"system", "developer", "user", "assistant", "tool"}
# OpenAI's older function calling, in a conversation sent back: an assistant message's
# `function_call` is read as its one tool call, and a message of role `function` (the call's
# result, named by the function) as the tool message answering it. The older form has no call
# ids; both sides get the same one, made from the function's name (legacy_call_id).
FUNCTION_ROLE = "function"
MAX_STOP_SEQUENCES = 4
MAX_LOGIT_BIAS = 300  # OpenAI's limit on logit_bias entries


def _string_required(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if value is None:
        raise invalid(
            name, f"Missing required parameter: '{name}'.", code="missing_required_parameter"
        )
    if not isinstance(value, str):
        raise _type_error(name, "a string", value)
    return value


MAX_MODEL_CHARS = 256  # model names are slugs of at most 100 characters, plus @version


def model_read(body: dict[str, Any], name: str = "model") -> str:
    """The model a request names; one no model can have is a 404, as an unknown one is."""
    model = _string_required(body, name)
    if len(model) > MAX_MODEL_CHARS or "\x00" in model:
        message = f"The model '{shown(model)}' does not exist or you do not have access to it."
        raise ApiError(404, "model_not_found", message, param="model")
    return model


MODEL = custom(
    {"type": "string", "description": "A model or alias name; `name@version` pins a version."},
    model_read,
)


def _stop(body: dict[str, Any], name: str) -> list[str]:
    value = body.get(name)
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _type_error("stop", "a string or an array of strings", value)
    if len(stops) > MAX_STOP_SEQUENCES:
        raise invalid("stop", f"'stop' takes at most {MAX_STOP_SEQUENCES} sequences.")
    if any(s == "" for s in stops):
        raise invalid("stop", "'stop' sequences cannot be empty.")
    return stops


STOP = custom(
    {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {
                "type": "array",
                "maxItems": MAX_STOP_SEQUENCES,
                "items": {"type": "string", "minLength": 1},
            },
            {"type": "null"},
        ]
    },
    _stop,
)


# The content parts vLLM's server reads as text, and the field each keeps its text in. For a
# template that takes content as a string, a tool search's `tool_reference` is written as the
# name of the tool it refers to.
_TEXT_PARTS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
    "tool_reference": "name",
}
# Text parts whose text may be null (then left out), as vLLM's server skips them; a template that
# takes parts gets the others' null text as it is.
_SKIPPED_WHEN_NULL = frozenset({"text", "refusal"})
# The fields that make up a content part of any type vLLM's server knows. A text part's other
# fields (`cache_control`, say) reach a template that takes parts, as vLLM's server passes
# them on.
_PART_FIELDS = frozenset(
    {
        "audio_embeds", "audio_url", "closed", "data", "file", "image_embeds", "image_pil",
        "image_url", "input_audio", "name", "prompt_cache_breakpoint", "refusal", "text",
        "thinking", "type", "uuid", "video_embeds", "video_url",
    }
)  # fmt: skip
# A system message's first line that Claude Code changes on every request: vLLM's server drops it
# so that the prompt's prefix stays cacheable, and so does this.
BILLING_HEADER = "x-anthropic-billing-header"


def _content_read(
    content: Any, where: str, *, role: str
) -> tuple[str, list[dict[str, Any]] | None]:
    """A message's content as the two forms vLLM's server gives a chat template.

    The string form: its parts' texts joined by newlines, empty and null ones left out. The
    parts form, for a template that loops over content (models_registry.content_format):
    `{"type": "text", "text": ...}` per part (with a text part's own extra fields), a tool
    reference as `{"type": "tool_reference", "name": ...}`; None when that is the string form
    as one text part (most messages: the template gets the string as one part). In a system
    message, a text part's first line is dropped when it is Claude Code's billing header (the
    part too, if nothing is left).
    """
    if content is None:
        return "", []
    if isinstance(content, str):
        content = [content]
    elif not isinstance(content, list):
        raise _type_error(f"{where}.content", "a string or an array of content parts", content)
    texts: list[str] = []
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        at = f"{where}.content[{i}]"
        kind: Any
        text: Any
        extra: dict[str, Any] = {}
        if isinstance(part, str):
            kind, text = "text", part
        else:
            if not isinstance(part, dict):
                raise _type_error(at, "an object", part)
            kind = part.get("type")
            if not isinstance(kind, str) or kind not in _TEXT_PARTS:
                raise invalid(
                    f"{at}.type",
                    f"A content part's type must be one of {', '.join(_TEXT_PARTS)} "
                    f"(this model reads text); got {shown(str(kind))}.",
                )
            text = part.get(_TEXT_PARTS[kind])
            if text is not None and not isinstance(text, str):
                raise _type_error(f"{at}.{_TEXT_PARTS[kind]}", "a string", text)
            if kind == "tool_reference":
                parts.append({"type": "tool_reference", "name": text})
                if text:
                    texts.append(text)
                continue
            if text is None and kind in _SKIPPED_WHEN_NULL:
                continue  # no text: nothing to write, as vLLM's server skips it
            extra = {k: v for k, v in part.items() if k not in _PART_FIELDS}
        if role == "system" and kind == "text" and text.startswith(BILLING_HEADER):
            text = text.partition("\n")[2]
            if not text:
                continue
        parts.append({"type": "text", "text": text, **extra})
        if text:
            texts.append(text)
    joined = "\n".join(texts)
    return joined, None if parts == [{"type": "text", "text": joined}] else parts


def _array(value: Any, where: str, *, of: str, required: bool = True) -> list[Any]:
    """A non-empty array (of messages, or of conversations), or the 400 that names it."""
    if value is None and required:
        raise invalid(
            where, f"Missing required parameter: '{where}'.", code="missing_required_parameter"
        )
    if not isinstance(value, list):
        raise _type_error(where, f"an array of {of}s", value)
    if not value:
        raise invalid(where, f"'{where}' must contain at least one {of}.")
    return value


# The most messages one prompt's conversation may hold (all of a batch chat's conversations
# together): every message is read, rendered and tokenised on the frontend, so their number
# bounds a request's work however short each one is. A conversation (the Conversations API)
# holds as many items.
MAX_MESSAGES = 4096


def messages_count_check(count: int, where: str) -> None:
    """Refuse a conversation of more than MAX_MESSAGES messages, naming the field."""
    if count > MAX_MESSAGES:
        raise invalid(
            where,
            f"'{where}' holds {count} messages; a request may hold at most {MAX_MESSAGES}.",
            code="array_above_max_length",
        )


def _messages(body: dict[str, Any], name: str) -> list[dict[str, Any]]:
    value = _array(body.get(name), "messages", of="message")
    messages_count_check(len(value), "messages")
    return [_message(message, f"messages[{i}]") for i, message in enumerate(value)]


def _conversations(body: dict[str, Any], name: str) -> list[list[dict[str, Any]]]:
    """vLLM's /v1/chat/completions/batch `messages`: conversations, each one chat's messages."""
    value = _array(body.get(name), "messages", of="conversation")
    if len(value) > MAX_PROMPTS:
        raise invalid("messages", f"At most {MAX_PROMPTS} conversations, got {len(value)}.")
    messages_count_check(sum(len(c) if isinstance(c, list) else 0 for c in value), "messages")
    conversations = []
    for i, conversation in enumerate(value):
        where = f"messages[{i}]"
        messages = _array(conversation, where, of="message", required=False)
        conversations.append([_message(m, f"{where}[{j}]") for j, m in enumerate(messages)])
    return conversations


def _message(message: Any, where: str) -> dict[str, Any]:
    """One chat message as the template reads it; what it cannot hold is refused, naming it."""
    if not isinstance(message, dict):
        raise _type_error(where, "an object", message)
    role = message.get("role")
    legacy_result = role == FUNCTION_ROLE
    if legacy_result:
        role = "tool"
    elif not isinstance(role, str) or role not in ROLES:
        raise invalid(f"{where}.role", f"'role' must be one of {', '.join(sorted(ROLES))}.")
    content, parts = _content_read(message.get("content"), where, role=role)
    kept: dict[str, Any] = {"role": role, "content": content}
    if parts is not None:
        # For a template that loops over content; never shown or retained (CONTENT_PARTS).
        kept[CONTENT_PARTS] = parts
    name = message.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise _type_error(f"{where}.name", "a string", name)
        kept["name"] = name
    thought = message.get("reasoning")
    if thought is None:
        thought = message.get("reasoning_content")  # its older name, as vLLM renames it
    if thought is not None and role == "assistant":
        # An earlier answer's thinking, for a template that shows it (interleaved thinking).
        if not isinstance(thought, str):
            field = "reasoning" if message.get("reasoning") is not None else "reasoning_content"
            raise _type_error(f"{where}.{field}", "a string", thought)
        kept["reasoning"] = thought
    calls = message.get("tool_calls")
    if message.get("function_call") is not None:
        at = f"{where}.function_call"
        if role != "assistant":
            raise invalid(at, "Only assistant messages carry 'function_call'.")
        if calls is not None:
            raise invalid(at, "Send either 'tool_calls' or the older 'function_call', not both.")
        kept["tool_calls"] = [_function_call(message["function_call"], at)]
    if calls is not None:
        if role != "assistant":
            raise invalid(f"{where}.tool_calls", "Only assistant messages carry 'tool_calls'.")
        if not isinstance(calls, list):
            raise _type_error(f"{where}.tool_calls", "an array", calls)
        if calls:
            kept["tool_calls"] = [
                _tool_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(calls)
            ]
    if legacy_result:
        if not isinstance(name, str):
            raise invalid(
                f"{where}.name",
                "A 'function' message needs the 'name' of the function it answers.",
                code="missing_required_parameter",
            )
        kept["tool_call_id"] = legacy_call_id(name)
    elif role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise invalid(
                f"{where}.tool_call_id",
                "A 'tool' message needs the 'tool_call_id' it answers.",
                code="missing_required_parameter",
            )
        kept["tool_call_id"] = call_id
    return kept


def legacy_call_id(name: str) -> str:
    """The tool call id an older `function_call` and its `function` result are read with."""
    return f"call_{name}"


def _function_call(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise _type_error(where, "an object", call)
    name, arguments = call.get("name"), call.get("arguments")
    if not isinstance(name, str):
        raise _type_error(f"{where}.name", "a string", name)
    if not isinstance(arguments, str):
        raise _type_error(f"{where}.arguments", "a JSON string", arguments)
    function = {"name": name, "arguments": arguments}
    return {"id": legacy_call_id(name), "type": "function", "function": function}


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise _type_error(where, "an object", call)
    if call.get("type", "function") != "function":
        raise invalid(f"{where}.type", f"'{where}.type' must be 'function'.")
    function = call.get("function")
    if not isinstance(function, dict):
        raise _type_error(f"{where}.function", "an object", function)
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str):
        raise _type_error(f"{where}.function.name", "a string", name)
    if not isinstance(arguments, str):
        raise _type_error(f"{where}.function.arguments", "a JSON string", arguments)
    call_id = call.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise _type_error(f"{where}.id", "a string", call_id)
    kept: dict[str, Any] = {
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    if call_id is not None:
        kept["id"] = call_id
    return kept


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_ids(value: Any) -> bool:
    """Whether a prompt is token ids (ones outside the vocabulary are refused later, saying so)."""
    return isinstance(value, list) and bool(value) and all(_is_id(t) for t in value)


def _token_ids_check(value: list[Any], where: str) -> None:
    """Refuse a prompt of token ids that holds something else, naming the item."""
    for i, token in enumerate(value):
        if not _is_id(token):
            raise _type_error(f"{where}[{i}]", "a token id", token)


MAX_PROMPTS = 128


def _prompts(body: dict[str, Any], name: str) -> tuple[str | list[int], ...]:
    """A completions body's prompts: one text or token list, or an array of them."""
    value = body.get(name)
    if value is None:
        raise invalid(
            "prompt", "Missing required parameter: 'prompt'.", code="missing_required_parameter"
        )
    if value == "":
        # As vLLM's server answers. An empty text in an array is a prompt of the special
        # tokens the tokenizer adds (BOS), as vLLM's server serves it; one of no tokens at all
        # is refused once it is tokenised (inference.pipeline.tokenization).
        raise invalid("prompt", "'prompt' is empty: send a prompt of at least one character.")
    if isinstance(value, str):
        return (value,)
    if _token_ids(value):
        return (list(value),)
    if isinstance(value, list) and value and _is_id(value[0]):
        _token_ids_check(value, "prompt")  # one prompt of token ids, one of them not
    if isinstance(value, list) and value:
        if len(value) > MAX_PROMPTS:
            raise invalid("prompt", f"'prompt' takes at most {MAX_PROMPTS} prompts.")
        prompts: list[str | list[int]] = []
        texts = isinstance(value[0], str)
        # All texts or all token lists, as OpenAI's API and vLLM's server take them.
        wanted = "a string, as the first prompt is" if texts else "an array of token ids"
        for i, item in enumerate(value):
            if texts and isinstance(item, str):
                prompts.append(item)
            elif not texts and _token_ids(item):
                prompts.append(list(item))
            elif not texts and item == []:
                raise invalid(
                    f"prompt[{i}]", f"'prompt[{i}]' is empty: send at least one token id."
                )
            elif not texts and isinstance(item, list):
                _token_ids_check(item, f"prompt[{i}]")
            else:
                raise _type_error(f"prompt[{i}]", wanted, item)
        return tuple(prompts)
    if isinstance(value, list):
        raise invalid("prompt", "'prompt' cannot be an empty array.")
    raise _type_error("prompt", "a string or an array of token ids", value)


_TEXT_PART: Schema = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"enum": sorted(_TEXT_PARTS)}},
            "description": "Text in `text` (text, input_text, output_text), `refusal`, "
            "`thinking`, or a tool_reference's tool `name`.",
        },
    ]
}
_TOOL_CALL: Schema = {
    "type": "object",
    "required": ["function"],
    "properties": {
        "id": {"type": ["string", "null"]},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {
                "name": {"type": "string"},
                "arguments": {"type": "string", "description": "The arguments as JSON text."},
            },
        },
    },
}
MESSAGES = custom(
    {
        "type": "array",
        "minItems": 1,
        "maxItems": MAX_MESSAGES,
        "items": {
            "type": "object",
            "required": ["role"],
            "properties": {
                "role": {
                    "type": "string",
                    "enum": sorted({*ROLES, FUNCTION_ROLE}),
                    "description": "function: OpenAI's older role for a function's result "
                    "(with its name), read as a tool message.",
                },
                "content": {
                    "anyOf": [
                        {"type": "string"},
                        {"type": "array", "items": _TEXT_PART},
                        {"type": "null"},
                    ]
                },
                "name": {"type": ["string", "null"]},
                "tool_calls": {
                    "type": ["array", "null"],
                    "items": _TOOL_CALL,
                    "description": "Assistant messages only.",
                },
                "tool_call_id": {
                    "type": ["string", "null"],
                    "description": "Required in a tool message: the call it answers.",
                },
                "function_call": {
                    "type": ["object", "null"],
                    "required": ["name", "arguments"],
                    "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
                    "description": "OpenAI's older form of one tool call (assistant messages "
                    "only), read as tool_calls.",
                },
            },
        },
    },
    _messages,
)
CONVERSATIONS = custom(
    {
        "type": "array",
        "minItems": 1,
        "maxItems": MAX_PROMPTS,
        "description": "Conversations, each answered on its own as one choice (its index).",
        "items": MESSAGES.schema,
    },
    _conversations,
)
PROMPT = custom(
    {
        "description": "A prompt (text or token ids), or an array of prompts; each prompt "
        "gets its own n choices.",
        "anyOf": [
            {"type": "string"},
            TOKEN_IDS,
            {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS, "items": {"type": "string"}},
            {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS, "items": TOKEN_IDS},
        ],
    },
    _prompts,
)


def _logit_bias(body: dict[str, Any], name: str) -> dict[int, float] | None:
    """OpenAI's logit_bias: token id (as a string) to a bias from -100 to 100."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _type_error("logit_bias", "an object", value)
    if len(value) > MAX_LOGIT_BIAS:
        raise invalid("logit_bias", f"'logit_bias' takes at most {MAX_LOGIT_BIAS} tokens.")
    bias: dict[int, float] = {}
    for key, weight in value.items():
        where = f"logit_bias.{shown(key)}"
        if not key.isdigit():
            raise invalid("logit_bias", f"'logit_bias' keys are token ids, got '{shown(key)}'.")
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise _type_error(where, "a number", weight)
        if not -100 <= weight <= 100:
            raise invalid("logit_bias", f"'{where}' must be between -100 and 100.")
        bias[int(key)] = float(weight)
    return bias


LOGIT_BIAS = custom(
    {
        "type": ["object", "null"],
        "maxProperties": MAX_LOGIT_BIAS,
        "propertyNames": {"pattern": "^[0-9]+$"},
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
        "description": "Token id to a bias added to its logit.",
    },
    _logit_bias,
)


# --- embeddings and detokenize ----------------------------------------------------------------

MAX_EMBEDDING_INPUTS = 2048


def _embedding_inputs(body: dict[str, Any], name: str) -> list[str] | list[list[int]]:
    """Return `input` as a list of texts or of token-id lists, or raise a 400 naming it."""
    value = body.get(name)
    if value is None:
        raise invalid(name, f"Missing required parameter: '{name}'.", "missing_required_parameter")
    single_tokens = isinstance(value, list) and value and all(is_token(t) for t in value)
    if isinstance(value, str) or single_tokens:
        value = [value]  # one input
    if not isinstance(value, list):
        raise _type_error(name, "a string, an array of strings or of token arrays", value)
    if not value:
        raise invalid(name, f"'{name}' cannot be an empty array.")
    if len(value) > MAX_EMBEDDING_INPUTS:
        raise invalid(
            name, f"'{name}' takes at most {MAX_EMBEDDING_INPUTS} items, got {len(value)}."
        )
    if all(isinstance(item, str) for item in value):
        for index, item in enumerate(value):
            if not item.strip():
                raise invalid(f"{name}[{index}]", f"'{name}[{index}]' cannot be an empty string.")
        return value
    if all(isinstance(item, list) for item in value):
        for index, item in enumerate(value):
            if not item:
                raise invalid(f"{name}[{index}]", f"'{name}[{index}]' cannot be an empty array.")
            if not all(is_token(t) for t in item):
                raise invalid(f"{name}[{index}]", f"'{name}[{index}]' must hold token ids (>= 0).")
        return value
    raise _type_error(name, "a string, an array of strings or of token arrays", value)


_TEXT: Schema = {"type": "string", "pattern": "\\S", "description": "Not blank."}
INPUT = custom(
    {
        "anyOf": [
            _TEXT,
            {"type": "array", "minItems": 1, "maxItems": MAX_EMBEDDING_INPUTS, "items": _TEXT},
            TOKEN_IDS,
            {"type": "array", "minItems": 1, "maxItems": MAX_EMBEDDING_INPUTS, "items": TOKEN_IDS},
        ]
    },
    _embedding_inputs,
)


def _tokens(body: dict[str, Any], name: str) -> list[int]:
    tokens = body.get(name)
    if tokens is None:
        raise invalid(name, f"Missing required parameter: '{name}'.", "missing_required_parameter")
    if not isinstance(tokens, list):
        raise _type_error(name, "an array of token ids", tokens)
    for index, token in enumerate(tokens):
        if isinstance(token, bool) or not isinstance(token, int):
            raise _type_error(f"{name}[{index}]", "an integer", token)
        if token < 0:
            raise invalid(f"{name}[{index}]", f"Token ids are at least 0, got {token}.")
    return tokens


TOKENS = custom(
    {
        "type": "array",
        "items": {"type": "integer", "minimum": 0},
        "description": "Token ids, each below the model's vocabulary size.",
    },
    _tokens,
)
