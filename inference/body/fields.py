"""What the platform does with every field of a request body: honoured, accepted or refused.

One table per endpoint. A refused field is a 400 `unsupported_parameter` naming it, unless it
asks for nothing (null, or one of its unused values); so is a field in no table, as OpenAI's
API refuses an argument it does not know. docs/api.md lists every table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from config.json_body import shown
from inference.base.errors import ApiError, invalid, unrecognized
from inference.body.inputs import (
    LOGIT_BIAS,
    MESSAGES,
    MODEL,
    PROMPT,
    STOP,
)
from inference.body.tools import (
    FUNCTION_CALL,
    FUNCTIONS,
    PARALLEL_TOOL_CALLS,
    RESPONSE_FORMAT,
    STRUCTURED_OUTPUTS,
    TOOL_CHOICE,
    TOOLS,
)
from inference.body.types import (
    MAX_TOKENS,
    Kind,
    accepted,
    boolean,
    boolean_or_none,
    custom,
    integer,
    kinds_read,
    number,
    one_of,
    string,
    strings,
    token_list,
)
from inference.body.types import type_error as _type_error
from models_registry.tokenizer import TEMPLATE_KWARGS_REFUSED


@dataclass(frozen=True)
class Field:
    """What Roundhouse does with one body field, and what the field holds.

    honoured: it shapes the answer. ignored: accepted, and it cannot change the answer
    (metadata, hints; each says why in its table).
    refused: a 400 `unsupported_parameter` naming it, unless its value is null or one of
    `unused`, the values that ask for nothing (n=1, logprobs=false).
    `kind`: the field's type, read and published from this one declaration (inference.body.types).
    `only`: the one endpoint that takes it (chat's tools); the other refuses it.
    """

    decision: str
    unused: tuple[Any, ...] = ()
    kind: Kind | None = None
    only: str | None = None

    def read(self, body: dict[str, Any], name: str) -> Any:
        """The field's value in `body`, as its kind reads it (a 400 naming it if wrong)."""
        assert self.kind is not None, f"{name} has no kind"
        return self.kind.read(body, name)


def honoured(kind: Kind, *, only: str | None = None) -> Field:
    return Field("honoured", kind=kind, only=only)


def ignored(kind: Kind | None = None) -> Field:
    return Field("ignored", kind=kind or accepted())


def refused(*unused: Any) -> Field:
    return Field("refused", unused)


CHAT = "chat.completions"
COMPLETIONS = "completions"
MAX_CHOICES = 128  # OpenAI's limit on n
MAX_LOGPROBS = 20  # vLLM's default max_logprobs, and OpenAI's top_logprobs limit
# vLLM's beam search asks the engine for 2 x width alternatives a step, within max_logprobs.
MAX_BEAMS = MAX_LOGPROBS // 2
# Beams rank by log probability / length ** length_penalty: a larger power overflows a float
# at long lengths and fails the request inside the worker.
LENGTH_PENALTY_MAX = 10.0
# OpenAI's `service_tier`: "flex" trades latency for price, which is our batch class.
SERVICE_TIERS = {
    "auto": "interactive",
    "default": "interactive",
    "priority": "interactive",
    "flex": "batch",
}


_STREAM_OPTIONS = ("include_usage", "continuous_usage_stats")


def _stream_options(body: dict[str, Any], name: str) -> tuple[bool, bool]:
    """Whether the stream ends with a usage chunk (`stream_options.include_usage`), and whether
    every chunk carries its choice's usage so far as well (vLLM's `continuous_usage_stats`,
    which counts only with include_usage, as on vLLM's server)."""
    options = body.get(name)
    if options is None:
        return False, False
    if not isinstance(options, dict):
        raise _type_error(name, "an object", options)
    if options and not body.get("stream"):
        # An empty object asks for nothing: vLLM's server serves it unstreamed too.
        raise invalid(name, f"'{name}' is only allowed with stream=true.")
    for key in options:
        if key not in _STREAM_OPTIONS:
            where = f"{name}.{shown(str(key))}"
            message = (
                f"'{where}' is not a stream option; the options are {', '.join(_STREAM_OPTIONS)}."
            )
            raise ApiError(400, "unsupported_parameter", message, param=where)
    usage, continuous = (
        bool(boolean().read({f"{name}.{key}": options.get(key)}, f"{name}.{key}"))
        for key in _STREAM_OPTIONS
    )
    return usage, usage and continuous


def _logprobs(body: dict[str, Any], name: str) -> bool | int | None:
    """Chat's logprobs switch or completions' count (each endpoint checks which it takes)."""
    value = body.get(name)
    if value is None or isinstance(value, bool):
        return value
    return integer(0, MAX_LOGPROBS).read(body, name)


# vLLM's repetition_detection ends a choice whose last tokens repeat a pattern. Its engine
# checks every running choice after every step, in the step loop every tenant shares: the
# bounds keep that check short (at most max_pattern_size**2 * min_count / 2 comparisons).
REPETITION_PATTERN_MAX = 32
REPETITION_COUNT_MAX = 16
_REPETITION_FIELDS = ("max_pattern_size", "min_pattern_size", "min_count")


def _repetition_detection(body: dict[str, Any], name: str) -> tuple[int, int, int] | None:
    """(max_pattern_size, min_pattern_size, min_count), checked as vLLM checks them and
    within the bounds above; None when absent or off (max_pattern_size 0)."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _type_error(name, "an object", value)
    for key in value:
        if key not in _REPETITION_FIELDS:
            message = f"'{name}.{shown(str(key))}' is not a field of {name}."
            raise ApiError(400, "unsupported_parameter", message, param=f"{name}.{shown(str(key))}")
    top, bottom, count = (
        integer(0, MAX_TOKENS, default=0).read({f"{name}.{key}": value.get(key)}, f"{name}.{key}")
        for key in _REPETITION_FIELDS
    )
    if bottom > top:
        raise invalid(
            f"{name}.min_pattern_size",
            f"'{name}.min_pattern_size' cannot exceed max_pattern_size; set both to 0 to "
            "turn detection off.",
        )
    if top == 0:
        return None
    if count < 2:
        raise invalid(
            f"{name}.min_count",
            f"'{name}.min_count' must be at least 2 (how often a pattern repeats before the "
            "choice ends).",
        )
    if top > REPETITION_PATTERN_MAX or count > REPETITION_COUNT_MAX:
        at, bound = ("max_pattern_size", REPETITION_PATTERN_MAX)
        if top <= REPETITION_PATTERN_MAX:
            at, bound = ("min_count", REPETITION_COUNT_MAX)
        raise invalid(
            f"{name}.{at}",
            f"'{name}.{at}' must be at most {bound}: the engine checks every running choice "
            "after every step, and a longer check would slow every request on it.",
        )
    return top, bottom, count


# vLLM's own bounds on a cache salt (its servers refuse the rest).
CACHE_SALT_MAX_LENGTH = 128
CACHE_SALT_FORBIDDEN = ("@", "/", "\\", "\x00")


def _cache_salt(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise invalid(name, f"Parameter '{name}' must be a non-empty string if provided.")
    if len(value) > CACHE_SALT_MAX_LENGTH or any(c in value for c in CACHE_SALT_FORBIDDEN):
        raise invalid(
            name,
            f"Parameter '{name}' must be at most {CACHE_SALT_MAX_LENGTH} characters and must "
            "not contain '@', '/', '\\', or NUL.",
        )
    return value


CACHE_SALT = custom(
    {
        "type": ["string", "null"],
        "minLength": 1,
        "maxLength": CACHE_SALT_MAX_LENGTH,
        "pattern": "^[^@/\\\\\\u0000]*$",
        "description": "Only requests of the same tenant and salt share cached prompt prefixes.",
    },
    _cache_salt,
)


_TOKEN_IDS = token_list()


def _allowed_token_ids(body: dict[str, Any], name: str) -> list[int] | None:
    if body.get(name) is None:
        return None
    value = _TOKEN_IDS.read(body, name)
    if not value:
        # As vLLM refuses it: an empty list would allow no token at all.
        raise invalid(name, f"{name} is not None and empty!")
    return value


ALLOWED_TOKEN_IDS = custom(
    {
        "type": ["array", "null"],
        "items": {"type": "integer", "minimum": 0},
        "minItems": 1,
        "description": "The only token ids the output may hold (each below the vocabulary size).",
    },
    _allowed_token_ids,
)


# vLLM's bound on logprob_token_ids: its sampler sizes each request's row for this many.
MAX_LOGPROB_TOKEN_IDS = 128


def _logprob_token_ids(body: dict[str, Any], name: str) -> list[int] | None:
    if body.get(name) is None:
        return None
    value = _TOKEN_IDS.read(body, name)
    if not value:
        return None  # as vLLM reads it: an empty list asks for nothing
    if len(value) > MAX_LOGPROB_TOKEN_IDS:
        raise invalid(
            name,
            f"Requested logprob_token_ids of length {len(value)}, which is greater than max "
            f"allowed: {MAX_LOGPROB_TOKEN_IDS}",
        )
    return value


LOGPROB_TOKEN_IDS = custom(
    {
        "type": ["array", "null"],
        "items": {"type": "integer", "minimum": 0},
        "maxItems": MAX_LOGPROB_TOKEN_IDS,
        "description": "vLLM's: the token ids whose log probabilities each generated position "
        "lists, beside the sampled token's, in place of the likeliest alternatives (needs "
        "logprobs).",
    },
    _logprob_token_ids,
)


def _documents(body: dict[str, Any], name: str) -> list[dict[str, str]] | None:
    """vLLM's documents: objects of strings (a title and a text, say) for a RAG template."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list):
        raise _type_error(name, "an array of objects", value)
    for index, document in enumerate(value):
        where = f"{name}[{index}]"
        if not isinstance(document, dict):
            raise _type_error(where, "an object of strings", document)
        for key, text in document.items():
            if not isinstance(text, str):
                raise _type_error(f"{where}.{key}", "a string", text)
    return value


DOCUMENTS = custom(
    {
        "type": ["array", "null"],
        "items": {"type": "object", "additionalProperties": {"type": "string"}},
        "description": "vLLM's: documents for the chat template of a model that answers from "
        "them (RAG), each an object of strings such as a title and a text; a template that "
        "reads none leaves them out.",
    },
    _documents,
)


def _chat_template_kwargs(body: dict[str, Any], name: str) -> dict[str, Any] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _type_error(name, "an object", value)
    refused = sorted(TEMPLATE_KWARGS_REFUSED & value.keys())
    if refused:
        raise invalid(name, f"Found unexpected chat template kwargs from request: {refused}.")
    return value


CHAT_TEMPLATE_KWARGS = custom(
    {
        "type": ["object", "null"],
        "description": "Variables for the model's chat template (such as enable_thinking); "
        "those the template does not read are unused.",
    },
    _chat_template_kwargs,
)

# vLLM's request model's values (OpenAI's, and DeepSeek V4's "max").
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
REASONING_EFFORT = one_of(
    REASONING_EFFORTS,
    doc="For a reasoning model's chat template, as vLLM's server passes it: the template's "
    "reasoning_effort variable, and enable_thinking (false for none, true otherwise) unless "
    "chat_template_kwargs sets it.",
)

_PENALTY = number(-2.0, 2.0, default=0.0)
_SWITCH = boolean()
# vLLM's prompt truncation: keep this many of the prompt's tokens (-1: as many as fit).
TRUNCATE_PROMPT_TOKENS = integer(
    -1,
    (1 << 63) - 1,
    doc="Keep this many of the prompt's tokens (-1: as many as the context takes); at most "
    "the context.",
)
TRUNCATION_SIDE = one_of(
    ["left", "right"],
    doc="Which end truncate_prompt_tokens cuts: left keeps the last tokens, right the first; "
    "default: the tokenizer's.",
)


# Every field of OpenAI's and of vLLM's chat and completions bodies. A field in neither is
# refused, as OpenAI's API refuses it (vLLM's server logs it and answers as if it were not
# there): a client that asks for something is told when it does not happen.
# tests/inference/body/test_parser.py checks that every field of the installed vLLM's requests is
# here.
GENERATION_FIELDS: dict[str, Field] = {
    "model": honoured(MODEL),
    "messages": honoured(MESSAGES, only=CHAT),
    "prompt": honoured(PROMPT, only=COMPLETIONS),
    "max_tokens": honoured(
        integer(
            1,
            MAX_TOKENS,
            doc="At most the tenant's max_tokens_per_request; default: "
            "as many as fit, for every choice. Completions with echo also take 0: the "
            "prompt alone, scored.",
        )
    ),
    "max_completion_tokens": honoured(
        integer(1, MAX_TOKENS, doc="Takes the place of max_tokens."), only=CHAT
    ),
    "temperature": honoured(number(0.0, 2.0)),
    "top_p": honoured(number(0.0, 1.0, above=True)),
    "top_k": honoured(integer(-1, 1 << 20)),
    "seed": honoured(integer(-(1 << 63), (1 << 63) - 1)),
    "stop": honoured(STOP),
    "ignore_eos": honoured(_SWITCH),
    "min_tokens": honoured(integer(0, MAX_TOKENS, default=0, doc="At most max_tokens.")),
    "presence_penalty": honoured(_PENALTY),
    "frequency_penalty": honoured(_PENALTY),
    "stream": honoured(_SWITCH),
    "stream_options": honoured(
        custom(
            {
                "type": ["object", "null"],
                "description": "Only with stream=true.",
                "properties": {
                    "include_usage": {
                        "type": ["boolean", "null"],
                        "description": "A last chunk carries the usage.",
                    },
                    "continuous_usage_stats": {
                        "type": ["boolean", "null"],
                        "description": "vLLM's: with include_usage, every chunk also carries "
                        "its choice's usage so far.",
                    },
                },
                "additionalProperties": False,
            },
            _stream_options,
        )
    ),
    "user": honoured(string(nul=False, doc="Kept on the usage record (first 64 characters).")),
    "service_tier": honoured(one_of(list(SERVICE_TIERS), doc="flex runs in the batch class.")),
    # Roundhouse's own: the seconds the client will wait, like the x-request-timeout header.
    "timeout": honoured(number(0.001, 86400.0, doc="Seconds the client will wait.")),
    "metadata": ignored(accepted({"type": ["object", "null"]})),
    "prompt_cache_key": ignored(accepted({"type": ["string", "null"]})),
    "safety_identifier": ignored(accepted({"type": ["string", "null"]})),
    "parallel_tool_calls": honoured(PARALLEL_TOOL_CALLS, only=CHAT),
    "request_id": ignored(accepted({"type": ["string", "null"]})),  # we give x-request-id
    "stream_interval": ignored(accepted({"type": ["integer", "null"]})),  # vLLM's chunking
    "n": honoured(integer(1, MAX_CHOICES, default=1, doc="Choices per prompt; each billed.")),
    "best_of": refused(1),
    "use_beam_search": honoured(
        boolean(doc="vLLM's beam search: n beams (at most 10), the likeliest kept each step.")
    ),
    "logprobs": honoured(
        custom(
            {
                "type": ["boolean", "integer", "null"],
                "minimum": 0,
                "maximum": MAX_LOGPROBS,
                "description": "Chat: true for each token's logprob; completions: how many "
                "alternatives per token.",
            },
            _logprobs,
        )
    ),
    "top_logprobs": honoured(
        integer(0, MAX_LOGPROBS, doc="Alternatives per token; needs logprobs=true."), only=CHAT
    ),
    "prompt_logprobs": honoured(
        integer(
            0,
            MAX_LOGPROBS,
            doc="vLLM's: each prompt token's logprob and rank, with this many likeliest "
            "tokens beside it (answers that are not streamed; 0 in a stream).",
        )
    ),
    "logprob_token_ids": honoured(LOGPROB_TOKEN_IDS),
    "echo": honoured(
        boolean(
            doc="Start each choice with its prompt (chat: the last message, if in the answer's "
            "role: the assistant's, or with add_generation_prompt false the last message's)."
        )
    ),
    # Refused even empty, as vLLM's server refuses any suffix for a model without FIM rendering.
    "suffix": refused(),
    "logit_bias": honoured(LOGIT_BIAS),
    "allowed_token_ids": honoured(ALLOWED_TOKEN_IDS),
    "bad_words": honoured(strings(doc="Words the output never holds.")),
    "stop_token_ids": honoured(token_list(doc="Token ids that end a choice.")),
    "include_stop_str_in_output": honoured(_SWITCH),
    "skip_special_tokens": honoured(boolean(default=True)),
    "spaces_between_special_tokens": honoured(boolean(default=True)),
    # vLLM takes any penalty above 0, but one near 0 divides logits into infinities and its
    # engine fails the request (a 500 from vLLM's own server): refused here instead.
    "repetition_penalty": honoured(number(0.01, 100.0, default=1.0)),
    "length_penalty": honoured(
        number(
            -LENGTH_PENALTY_MAX,
            LENGTH_PENALTY_MAX,
            default=1.0,
            doc="Beam search only: finished beams rank by their log probability over their "
            "length to this power.",
        )
    ),
    "min_p": honoured(number(0.0, 1.0, default=0.0)),
    "repetition_detection": honoured(
        custom(
            {
                "type": ["object", "null"],
                "description": "End a choice whose last tokens repeat a pattern (vLLM's); "
                "its finish_reason is then 'repetition'.",
                "properties": {
                    "max_pattern_size": {
                        "type": "integer",
                        "minimum": 0,
                        "maximum": REPETITION_PATTERN_MAX,
                    },
                    "min_pattern_size": {
                        "type": "integer",
                        "minimum": 0,
                        "maximum": REPETITION_PATTERN_MAX,
                    },
                    "min_count": {"type": "integer", "minimum": 0, "maximum": REPETITION_COUNT_MAX},
                },
                "additionalProperties": False,
            },
            _repetition_detection,
        )
    ),
    "watermarking": refused(),
    "thinking_token_budget": honoured(
        integer(
            -1,
            MAX_TOKENS,
            doc="A reasoning model's thinking ends (its end marker forced) after this many "
            "tokens; -1: no bound. Only for a version with a reasoning parser.",
        )
    ),
    "reasoning_effort": honoured(REASONING_EFFORT, only=CHAT),
    "include_reasoning": honoured(
        boolean(
            default=True,
            doc="A reasoning model's answer carries its thinking (`reasoning`); false leaves "
            "it out, with the answer's logprobs and token ids, as vLLM's server does.",
        ),
        only=CHAT,
    ),
    "verbosity": refused(),
    "tools": honoured(TOOLS, only=CHAT),
    "functions": honoured(FUNCTIONS, only=CHAT),  # OpenAI's older name: mapped onto tools
    "tool_choice": honoured(TOOL_CHOICE, only=CHAT),
    "function_call": honoured(FUNCTION_CALL, only=CHAT),  # mapped onto tool_choice
    "response_format": honoured(RESPONSE_FORMAT),
    "structured_outputs": honoured(STRUCTURED_OUTPUTS),
    "guided_json": refused(),
    "guided_regex": refused(),
    "guided_choice": refused(),
    "guided_grammar": refused(),
    "guided_decoding_backend": refused(),
    "guided_whitespace_pattern": refused(),
    "chat_template": refused(),
    "chat_template_kwargs": honoured(CHAT_TEMPLATE_KWARGS, only=CHAT),
    "add_generation_prompt": honoured(boolean(default=True), only=CHAT),
    "continue_final_message": honoured(_SWITCH, only=CHAT),
    "add_special_tokens": honoured(
        boolean_or_none(
            doc="Add the tokenizer's special tokens (BOS) to the prompt: by default on "
            "completions, not on chat (its template writes them)."
        )
    ),
    "documents": honoured(DOCUMENTS, only=CHAT),
    "truncate_prompt_tokens": honoured(TRUNCATE_PROMPT_TOKENS),
    "truncation_side": honoured(TRUNCATION_SIDE),
    "priority": refused(0),  # vLLM's; service_tier chooses Roundhouse's class
    "store": refused(False),  # nothing is stored to fetch later
    "modalities": refused(["text"]),
    "audio": refused(),
    "prediction": refused(),
    "web_search_options": refused(),
    "prompt_embeds": refused(),
    "mm_payload": refused(),
    "mm_processor_kwargs": refused(),
    "media_io_kwargs": refused(),
    "return_mm_kwargs": refused(False),
    "return_prompt_text": honoured(
        boolean(doc="The rendered chat template rides with the answer (vLLM's)."), only=CHAT
    ),
    "return_token_ids": honoured(
        boolean(doc="The prompt's and each choice's token ids ride with the answer.")
    ),
    "return_token_offsets": refused(False),
    "return_tokens_as_token_ids": honoured(
        boolean(doc="Logprobs name each token as 'token_id:<id>' instead of its text.")
    ),
    "routed_experts_prompt_start": refused(),
    # vLLM names its KV-cache events with it, for routers outside the engine: no answer changes.
    "session_id": ignored(accepted({"type": ["string", "null"]})),
    "kv_transfer_params": refused(),
    "ec_transfer_params": refused(),
    "vllm_xargs": refused(),
    # vLLM's prefix-cache isolation. Every request is salted with its tenant already; a client's
    # salt parts its own requests further (its users, say).
    "cache_salt": honoured(CACHE_SALT),
}


def _same(value: Any, unused: Any) -> bool:
    """Whether a value equals an unused one, as JSON compares them (1 == 1.0, but not true)."""
    if isinstance(value, bool) or isinstance(unused, bool):
        return value is unused
    if isinstance(value, int | float) and isinstance(unused, int | float):
        return value == unused
    return type(value) is type(unused) and value == unused


def fields_read(
    body: dict[str, Any], fields: dict[str, Field], names: tuple[str, ...]
) -> dict[str, Any]:
    """The values of the named fields of `body`, each read through its declaration, in the
    order named: a parser reads a body's fields in a few such passes, its rules between
    fields checked between them."""
    kinds = []
    for name in names:
        kind = fields[name].kind
        assert kind is not None, f"{name} has no kind"
        kinds.append((name, kind))
    return kinds_read(body, kinds)


def unsupported_refuse(
    body: dict[str, Any], fields: dict[str, Field], *, endpoint: str | None = None
) -> None:
    """Refuse every field the body sets that is refused, unknown, or for another endpoint.

    A refused field set to null or to one of its unused values asks for nothing: it passes.
    """
    for name, value in body.items():
        field = fields.get(name)
        if field is None:
            raise unrecognized(name)
        if field.only is not None and endpoint is not None and field.only != endpoint:
            if value is None:
                continue
            where = "/v1/chat/completions" if field.only == CHAT else "/v1/completions"
            message = f"'{name}' is not a field of this endpoint; send it to {where}."
            raise ApiError(400, "unsupported_parameter", message, param=name)
        if field.decision == "ignored" and field.kind is not None:
            field.kind.read(body, name)  # of the declared JSON type, if nothing else
        if field.decision != "refused" or value is None:
            continue
        if any(_same(value, unused) for unused in field.unused):
            continue
        hint = " or ".join(json.dumps(unused) for unused in field.unused)
        message = f"'{name}' is not supported; leave it out" + (
            f" or send {hint}." if hint else "."
        )
        raise ApiError(400, "unsupported_parameter", message, param=name)
