"""Parse and validate OpenAI request bodies into typed requests; errors name the field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from config.json_body import BodyProblem, json_document, shown
from inference.errors import ApiError, invalid
from inference.fields import (
    DETOKENIZE_FIELDS,
    EMBEDDING_FIELDS,
    GENERATION_FIELDS,
    TOKENIZE_FIELDS,
    unsupported_refuse,
)

CHAT = "chat.completions"
COMPLETIONS = "completions"
ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_STOP_SEQUENCES = 4


@dataclass(frozen=True)
class GenerationRequest:
    endpoint: str
    model: str
    messages: list[dict[str, str]] | None
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
        return "".join(parts)
    if content is None:
        return ""
    raise _type_error(f"{where}.content", "a string or an array of content parts", content)


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    value = body.get("messages")
    if value is None:
        raise invalid(
            "messages", "Missing required parameter: 'messages'.", code="missing_required_parameter"
        )
    if not isinstance(value, list):
        raise _type_error("messages", "an array", value)
    if not value:
        raise invalid("messages", "'messages' must contain at least one message.")
    messages = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _type_error(where, "an object", message)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise invalid(f"{where}.role", f"'role' must be one of {', '.join(sorted(ROLES))}.")
        messages.append({"role": role, "content": _content_text(message.get("content"), where)})
    return messages


def _token_ids(value: Any) -> bool:
    """Whether a prompt is token ids (ones outside the vocabulary are refused later, saying so)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _prompt(body: dict[str, Any]) -> str | list[int]:
    value = body.get("prompt")
    if value is None:
        raise invalid(
            "prompt", "Missing required parameter: 'prompt'.", code="missing_required_parameter"
        )
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if _token_ids(value):
            return list(value)
        if len(value) == 1 and isinstance(value[0], str):
            return str(value[0])
        if len(value) == 1 and _token_ids(value[0]):
            return list(value[0])
        if len(value) > 1 and all(isinstance(p, str | list) for p in value):
            raise ApiError(
                400,
                "unsupported_parameter",
                "Send one prompt per request (batches of prompts are not supported).",
                param="prompt",
            )
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
    max_tokens = _integer(body, "max_tokens", 1, 1 << 30)
    if endpoint == CHAT:
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
    return GenerationRequest(
        endpoint=endpoint,
        model=model,
        messages=_messages(body) if endpoint == CHAT else None,
        prompt=_prompt(body) if endpoint == COMPLETIONS else None,
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
    )


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
