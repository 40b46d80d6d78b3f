"""Parse and validate OpenAI request bodies into typed requests; errors name the field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from config.json_body import BodyProblem, json_document, shown
from dataplane.types import Structured
from inference.errors import ApiError, invalid
from inference.fields import (
    DETOKENIZE_FIELDS,
    EMBEDDING_FIELDS,
    GENERATION_FIELDS,
    TOKENIZE_FIELDS,
    unsupported_refuse,
)
from inference.structured import (
    ToolUse,
    response_format_parse,
    structured_outputs_parse,
    tools_parse,
)

CHAT = "chat.completions"
COMPLETIONS = "completions"
ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_STOP_SEQUENCES = 4


MAX_CHOICES = 128  # OpenAI's limit on n
MAX_LOGPROBS = 20  # vLLM's default max_logprobs, and OpenAI's top_logprobs limit
MAX_LOGIT_BIAS = 300  # OpenAI's limit on logit_bias entries


@dataclass(frozen=True)
class GenerationRequest:
    endpoint: str
    model: str
    # Chat: every message as the template reads it (role, content text, name, tool_calls,
    # tool_call_id). Completions: `prompts` holds each prompt, `prompt` the first.
    messages: list[dict[str, Any]] | None
    prompt: str | list[int] | None
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    stop: list[str]
    ignore_eos: bool
    min_tokens: int
    presence_penalty: float
    frequency_penalty: float
    stream: bool
    include_usage: bool
    user: str | None
    priority: str = "interactive"
    timeout: float | None = None
    prompts: tuple[str | list[int], ...] = ()
    n: int = 1
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    bad_words: tuple[str, ...] = ()
    logit_bias: dict[int, float] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Chat: logprobs true gives top_logprobs alternatives; completions: logprobs is the count.
    logprobs: int | None = None
    echo: bool = False
    structured: Structured | None = None
    tools: ToolUse | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False


def body_problem(problem: BodyProblem) -> ApiError:
    """Return the 400 of a body that breaks the JSON limits (config.json_body)."""
    return ApiError(400, problem.code, problem.message, param=problem.param)


def body_parse(raw: bytes) -> dict[str, Any]:
    """Return the JSON object of a request body or raise a 400 saying what is wrong.

    The body meets the limits of every JSON body (config.json_body): no lone surrogate
    anywhere, at most 32 levels deep, finite numbers within 64 bits.
    """
    if not raw.strip():
        raise ApiError(400, "invalid_json", "The request body is empty; send a JSON object.")
    try:
        body = json_document(raw)
    except BodyProblem as problem:
        raise body_problem(problem) from None
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "The request body must be a JSON object.")
    return body


def _type_error(name: str, expected: str, value: Any) -> ApiError:
    return invalid(
        name,
        f"Invalid type for '{name}': expected {expected}, got {type(value).__name__}.",
        code="invalid_type",
    )


def _number(
    body: dict[str, Any], name: str, lo: float, hi: float, *, default: float | None = None
) -> float | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(name, "a number", value)
    # Compared before any float(): an integer too large for a float (a body that did not come
    # through body_parse, like a batch line) is out of range, not an OverflowError. NaN
    # compares false, so it is out of range too.
    if not lo <= value <= hi:
        raise invalid(name, f"'{name}' must be between {lo} and {hi}, got {shown(value)}.")
    return float(value)


def _integer(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(name, "an integer", value)
    if not lo <= value <= hi:
        raise invalid(name, f"'{name}' must be between {lo} and {hi}, got {shown(value)}.")
    return value


def _boolean(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _type_error(name, "a boolean", value)
    return value


def _string(body: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise invalid(
                name, f"Missing required parameter: '{name}'.", code="missing_required_parameter"
            )
        return None
    if not isinstance(value, str):
        raise _type_error(name, "a string", value)
    return value


MAX_MODEL_CHARS = 256  # model names are slugs of at most 100 characters, plus @version


def _model(body: dict[str, Any]) -> str:
    model = _string(body, "model", required=True)
    assert model is not None
    if len(model) > MAX_MODEL_CHARS or "\x00" in model:
        message = f"The model '{shown(model)}' does not exist or you do not have access to it."
        raise ApiError(404, "model_not_found", message, param="model")
    return model


def _stop(body: dict[str, Any]) -> list[str]:
    value = body.get("stop")
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


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise invalid(f"{where}.content[{i}]", "Only text content parts are supported.")
            text = part.get("text")
            if not isinstance(text, str):
                raise _type_error(f"{where}.content[{i}].text", "a string", text)
            parts.append(text)
        # As vLLM's server renders a message of several text parts: one per line.
        return "\n".join(parts)
    if content is None:
        return ""
    raise _type_error(f"{where}.content", "a string or an array of content parts", content)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    value = body.get("messages")
    if value is None:
        raise invalid(
            "messages", "Missing required parameter: 'messages'.", code="missing_required_parameter"
        )
    if not isinstance(value, list):
        raise _type_error("messages", "an array", value)
    if not value:
        raise invalid("messages", "'messages' must contain at least one message.")
    return [_message(message, f"messages[{i}]") for i, message in enumerate(value)]


def _message(message: Any, where: str) -> dict[str, Any]:
    """One chat message as the template reads it; what it cannot hold is refused, naming it."""
    if not isinstance(message, dict):
        raise _type_error(where, "an object", message)
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise invalid(f"{where}.role", f"'role' must be one of {', '.join(sorted(ROLES))}.")
    kept: dict[str, Any] = {"role": role, "content": _content_text(message.get("content"), where)}
    name = message.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise _type_error(f"{where}.name", "a string", name)
        kept["name"] = name
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise invalid(f"{where}.tool_calls", "Only assistant messages carry 'tool_calls'.")
        if not isinstance(calls, list):
            raise _type_error(f"{where}.tool_calls", "an array", calls)
        if calls:
            kept["tool_calls"] = [
                _tool_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(calls)
            ]
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise invalid(
                f"{where}.tool_call_id",
                "A 'tool' message needs the 'tool_call_id' it answers.",
                code="missing_required_parameter",
            )
        kept["tool_call_id"] = call_id
    return kept


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


def _token_ids(value: Any) -> bool:
    """Whether a prompt is token ids (ones outside the vocabulary are refused later, saying so)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


MAX_PROMPTS = 128


def _prompts(body: dict[str, Any]) -> tuple[str | list[int], ...]:
    """A completions body's prompts: one text or token list, or an array of them."""
    value = body.get("prompt")
    if value is None:
        raise invalid(
            "prompt", "Missing required parameter: 'prompt'.", code="missing_required_parameter"
        )
    if isinstance(value, str):
        return (value,)
    if _token_ids(value):
        return (list(value),)
    if isinstance(value, list) and value:
        if len(value) > MAX_PROMPTS:
            raise invalid("prompt", f"'prompt' takes at most {MAX_PROMPTS} prompts.")
        prompts: list[str | list[int]] = []
        for i, item in enumerate(value):
            if isinstance(item, str):
                prompts.append(item)
            elif _token_ids(item):
                prompts.append(list(item))
            else:
                raise _type_error(f"prompt[{i}]", "a string or an array of token ids", item)
        return tuple(prompts)
    if isinstance(value, list):
        raise invalid("prompt", "'prompt' cannot be an empty array.")
    raise _type_error("prompt", "a string or an array of token ids", value)


# OpenAI's `service_tier`: "flex" trades latency for price, which is our batch class.
SERVICE_TIERS = {
    "auto": "interactive",
    "default": "interactive",
    "priority": "interactive",
    "flex": "batch",
}


def _top_p(body: dict[str, Any]) -> float | None:
    """The client's `top_p`: above 0 (the engine has no token to sample from at 0) up to 1."""
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise invalid("top_p", "'top_p' must be above 0 and at most 1, got 0.")
    return top_p


def _user(body: dict[str, Any]) -> str | None:
    """The client's `user` tag; it is kept on usage records, so it cannot hold a NUL."""
    user = _string(body, "user")
    if user is not None and "\x00" in user:
        raise invalid("user", "'user' cannot contain the NUL character.")
    return user


def _priority(body: dict[str, Any]) -> str:
    tier = _string(body, "service_tier")
    if tier is None:
        return "interactive"
    if tier not in SERVICE_TIERS:
        raise invalid(
            "service_tier", f"'service_tier' must be one of {', '.join(sorted(SERVICE_TIERS))}."
        )
    return SERVICE_TIERS[tier]


def generation_parse(body: dict[str, Any], *, endpoint: str) -> GenerationRequest:
    """Return the typed request of a chat or completions body, or raise a 400."""
    model = _model(body)
    unsupported_refuse(body, GENERATION_FIELDS)
    chat = endpoint == CHAT
    if not chat:
        _chat_only(body)
    max_tokens = _integer(body, "max_tokens", 1, 1 << 30)
    if chat:
        max_tokens = _integer(body, "max_completion_tokens", 1, 1 << 30) or max_tokens
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise _type_error("stream_options", "an object", options)
        if not stream:
            raise invalid("stream_options", "'stream_options' is only allowed with stream=true.")
        include_usage = _boolean(options, "include_usage")
    top_k = _integer(body, "top_k", -1, 1 << 20)
    prompts = () if chat else _prompts(body)
    add_generation_prompt = _boolean(body, "add_generation_prompt", default=True)
    continue_final_message = _boolean(body, "continue_final_message")
    if add_generation_prompt and continue_final_message:
        raise invalid(
            "continue_final_message",
            "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true.",
        )
    return GenerationRequest(
        endpoint=endpoint,
        model=model,
        messages=_messages(body) if chat else None,
        prompt=prompts[0] if len(prompts) == 1 else None,
        prompts=prompts,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_top_p(body),
        top_k=top_k,
        seed=_integer(body, "seed", -(1 << 63), (1 << 63) - 1),
        stop=_stop(body),
        ignore_eos=_boolean(body, "ignore_eos"),
        min_tokens=_integer(body, "min_tokens", 0, 1 << 30) or 0,
        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0, default=0.0) or 0.0,
        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0, default=0.0) or 0.0,
        stream=stream,
        include_usage=include_usage,
        user=_user(body),
        priority=_priority(body),
        # Roundhouse's own: the seconds the client will wait, like the x-request-timeout header.
        timeout=_number(body, "timeout", 0.001, 86400.0),
        n=_integer(body, "n", 1, MAX_CHOICES) or 1,
        repetition_penalty=_repetition_penalty(body),
        min_p=_number(body, "min_p", 0.0, 1.0, default=0.0) or 0.0,
        stop_token_ids=tuple(_token_list(body, "stop_token_ids")),
        bad_words=tuple(_strings(body, "bad_words")),
        logit_bias=_logit_bias(body),
        skip_special_tokens=_boolean(body, "skip_special_tokens", default=True),
        spaces_between_special_tokens=_boolean(body, "spaces_between_special_tokens", default=True),
        include_stop_str_in_output=_boolean(body, "include_stop_str_in_output"),
        logprobs=_chat_logprobs(body) if chat else _integer(body, "logprobs", 0, MAX_LOGPROBS),
        echo=_boolean(body, "echo"),
        structured=_structured(body),
        tools=tools_parse(body) if chat else None,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
    )


_CHAT_ONLY = ("tools", "tool_choice", "functions", "function_call", "top_logprobs")


def _chat_only(body: dict[str, Any]) -> None:
    """Refuse a chat-only field on /v1/completions (vLLM's completions ignore them unread)."""
    for name in _CHAT_ONLY:
        if body.get(name) is not None:
            raise ApiError(
                400,
                "unsupported_parameter",
                f"'{name}' is a chat field; send it to /v1/chat/completions.",
                param=name,
            )


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    """Chat's logprobs: a boolean, with top_logprobs (0-20) alternatives per token."""
    wanted = _boolean(body, "logprobs")
    top = _integer(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top and not wanted:
        raise invalid("top_logprobs", "'top_logprobs' needs 'logprobs' set to true.")
    return (top or 0) if wanted else None


def _repetition_penalty(body: dict[str, Any]) -> float:
    penalty = _number(body, "repetition_penalty", 0.0, 1e6, default=1.0)
    if penalty == 0.0:
        raise invalid("repetition_penalty", "'repetition_penalty' must be above 0, got 0.")
    return penalty or 1.0


def _token_list(body: dict[str, Any], name: str) -> list[int]:
    """A list of token ids (their range is checked against the vocabulary when tokenising)."""
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(_is_token(t) for t in value):
        raise _type_error(name, "an array of token ids", value)
    return list(value)


def _strings(body: dict[str, Any], name: str) -> list[str]:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _type_error(name, "an array of non-empty strings", value)
    return list(value)


def _logit_bias(body: dict[str, Any]) -> dict[int, float] | None:
    """OpenAI's logit_bias: token id (as a string) to a bias from -100 to 100."""
    value = body.get("logit_bias")
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


def _structured(body: dict[str, Any]) -> Structured | None:
    """The request's output constraint: response_format or vLLM's structured_outputs."""
    fmt = response_format_parse(body.get("response_format"))
    extra = structured_outputs_parse(body.get("structured_outputs"))
    if fmt is not None and extra is not None:
        raise invalid(
            "structured_outputs", "Send either 'response_format' or 'structured_outputs', not both."
        )
    return fmt or extra


EMBEDDINGS = "embeddings"
MAX_EMBEDDING_INPUTS = 2048
ENCODING_FORMATS = ("float", "base64")


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    inputs: list[str] | list[list[int]]  # texts, or inputs already as token ids
    encoding_format: str
    dimensions: int | None
    user: str | None
    priority: str = "interactive"
    timeout: float | None = None

    @property
    def tokenized(self) -> bool:
        return bool(self.inputs) and isinstance(self.inputs[0], list)


def _embedding_inputs(body: dict[str, Any]) -> list[str] | list[list[int]]:
    """Return `input` as a list of texts or of token-id lists, or raise a 400 naming it."""
    value = body.get("input")
    if value is None:
        raise invalid("input", "Missing required parameter: 'input'.", "missing_required_parameter")
    single_tokens = isinstance(value, list) and value and all(_is_token(t) for t in value)
    if isinstance(value, str) or single_tokens:
        value = [value]  # one input
    if not isinstance(value, list):
        raise _type_error("input", "a string, an array of strings or of token arrays", value)
    if not value:
        raise invalid("input", "'input' cannot be an empty array.")
    if len(value) > MAX_EMBEDDING_INPUTS:
        raise invalid(
            "input", f"'input' takes at most {MAX_EMBEDDING_INPUTS} items, got {len(value)}."
        )
    if all(isinstance(item, str) for item in value):
        for index, item in enumerate(value):
            if not item.strip():
                raise invalid(f"input[{index}]", f"'input[{index}]' cannot be an empty string.")
        return value
    if all(isinstance(item, list) for item in value):
        for index, item in enumerate(value):
            if not item:
                raise invalid(f"input[{index}]", f"'input[{index}]' cannot be an empty array.")
            if not all(_is_token(t) for t in item):
                raise invalid(f"input[{index}]", f"'input[{index}]' must hold token ids (>= 0).")
        return value
    raise _type_error("input", "a string, an array of strings or of token arrays", value)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def embeddings_parse(body: dict[str, Any]) -> EmbeddingRequest:
    """Return the typed request of an embeddings body, or raise a 400."""
    model = _model(body)
    unsupported_refuse(body, EMBEDDING_FIELDS)
    encoding = _string(body, "encoding_format") or "float"
    if encoding not in ENCODING_FORMATS:
        raise invalid(
            "encoding_format", f"'encoding_format' must be one of {', '.join(ENCODING_FORMATS)}."
        )
    return EmbeddingRequest(
        model=model,
        inputs=_embedding_inputs(body),
        encoding_format=encoding,
        dimensions=_integer(body, "dimensions", 1, 1 << 16),
        user=_user(body),
        priority=_priority(body),
        timeout=_number(body, "timeout", 0.001, 86400.0),
    )


# --- vLLM's /tokenize and /detokenize ----------------------------------------------------------


@dataclass(frozen=True)
class TokenizeRequest:
    """A /tokenize body: a completion prompt, or chat messages to render with the template."""

    model: str
    prompt: str | None
    messages: list[dict[str, str]] | None
    add_special_tokens: bool
    add_generation_prompt: bool
    continue_final_message: bool
    return_token_strs: bool


def tokenize_parse(body: dict[str, Any]) -> TokenizeRequest:
    """Return the typed request of a /tokenize body, or raise a 400 naming the field.

    As vLLM's: `messages` makes it a chat request (defaults: add_generation_prompt true,
    add_special_tokens false, as the template adds its own), else `prompt` is required
    (add_special_tokens true).
    """
    model = _model(body)
    unsupported_refuse(body, TOKENIZE_FIELDS)
    chat = body.get("messages") is not None
    if chat and body.get("prompt") is not None:
        raise invalid("prompt", "Send either 'prompt' or 'messages', not both.")
    return_token_strs = _boolean(body, "return_token_strs")
    if not chat:
        # add_generation_prompt and continue_final_message shape chat only: ignored here.
        prompt = _string(body, "prompt", required=True)
        return TokenizeRequest(
            model=model,
            prompt=prompt,
            messages=None,
            add_special_tokens=_boolean(body, "add_special_tokens", default=True),
            add_generation_prompt=False,
            continue_final_message=False,
            return_token_strs=return_token_strs,
        )
    add_generation_prompt = _boolean(body, "add_generation_prompt", default=True)
    continue_final_message = _boolean(body, "continue_final_message")
    if add_generation_prompt and continue_final_message:
        raise invalid(
            "continue_final_message",
            "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true.",
        )
    return TokenizeRequest(
        model=model,
        prompt=None,
        messages=_messages(body),
        add_special_tokens=_boolean(body, "add_special_tokens"),
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        return_token_strs=return_token_strs,
    )


@dataclass(frozen=True)
class DetokenizeRequest:
    model: str
    tokens: list[int]


def detokenize_parse(body: dict[str, Any]) -> DetokenizeRequest:
    """Return the typed request of a /detokenize body, or raise a 400 naming the field."""
    model = _model(body)
    unsupported_refuse(body, DETOKENIZE_FIELDS)
    tokens = body.get("tokens")
    if tokens is None:
        raise invalid(
            "tokens", "Missing required parameter: 'tokens'.", code="missing_required_parameter"
        )
    if not isinstance(tokens, list):
        raise _type_error("tokens", "an array of token ids", tokens)
    for index, token in enumerate(tokens):
        if isinstance(token, bool) or not isinstance(token, int):
            raise _type_error(f"tokens[{index}]", "an integer", token)
        if token < 0:
            raise invalid(f"tokens[{index}]", f"Token ids are at least 0, got {token}.")
    return DetokenizeRequest(model=model, tokens=tokens)
