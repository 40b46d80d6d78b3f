"""The request bodies of the /v1 API, as its OpenAPI document describes them.

Written from what inference.params accepts; the limits are the ones the code enforces, imported
where the code names them. The batch views' bodies are batches.openapi's.
"""

from __future__ import annotations

from inference.openapi.schema import MAX_TOKENS, NO_NUL, Schema, integer, number, obj
from inference.params import (
    ENCODING_FORMATS,
    MAX_EMBEDDING_INPUTS,
    MAX_STOP_SEQUENCES,
    ROLES,
    SERVICE_TIERS,
)

_SAMPLING: dict[str, Schema] = {
    "model": {
        "type": "string",
        "description": "A model or alias name; `name@version` pins a version.",
    },
    "max_tokens": integer(
        1, MAX_TOKENS, "At most the tenant's max_tokens_per_request; default: as many as fit."
    ),
    "temperature": number(0.0, 2.0),
    "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0.0, "maximum": 1.0},
    "top_k": integer(-1, 1 << 20),
    "seed": integer(-(1 << 63), (1 << 63) - 1),
    "stop": {
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
    "ignore_eos": {"type": ["boolean", "null"]},
    "min_tokens": integer(0, MAX_TOKENS, "At most max_tokens."),
    "presence_penalty": number(-2.0, 2.0),
    "frequency_penalty": number(-2.0, 2.0),
    "stream": {"type": ["boolean", "null"]},
    "stream_options": {
        "type": ["object", "null"],
        "description": "Only with stream=true.",
        "properties": {"include_usage": {"type": ["boolean", "null"]}},
    },
    "user": {"type": ["string", "null"], "pattern": NO_NUL},
    "service_tier": {
        "type": ["string", "null"],
        "enum": [*sorted(SERVICE_TIERS), None],
        "description": "flex runs in the batch priority class.",
    },
    "timeout": number(0.001, 86400.0, "Seconds the client will wait (as x-request-timeout)."),
    # Accepted only with the values that mean "not used": Roundhouse answers with one choice.
    "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 1},
    "logprobs": {"enum": [False, None]},
    "echo": {"enum": [False, None]},
    "tools": {"type": ["array", "null"], "maxItems": 0},
    "functions": {"type": ["array", "null"], "maxItems": 0},
    "suffix": {"type": "null"},
    "best_of": {"type": ["integer", "null"], "minimum": 1, "maximum": 1},
    "response_format": {
        "anyOf": [
            obj({"type": {"const": "text"}}, "type", additionalProperties=False),
            {"type": "null"},
        ]
    },
}
# A stream with options is a conditional JSON Schema can say: options need stream=true.
_STREAM_OPTIONS_NEED_STREAM: Schema = {
    "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
    "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
}

_TEXT_PART = obj({"type": {"const": "text"}, "text": {"type": "string"}}, "type", "text")
CHAT_REQUEST: Schema = obj(
    {
        **_SAMPLING,
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": obj(
                {
                    "role": {"type": "string", "enum": sorted(ROLES)},
                    "content": {
                        "anyOf": [
                            {"type": "string"},
                            {"type": "array", "items": _TEXT_PART},
                            {"type": "null"},
                        ]
                    },
                },
                "role",
            ),
        },
        "max_completion_tokens": integer(1, MAX_TOKENS, "Takes the place of max_tokens."),
    },
    "model",
    "messages",
    **_STREAM_OPTIONS_NEED_STREAM,
)

_TOKENS = {
    "type": "array",
    "minItems": 1,
    "items": {"type": "integer", "minimum": 0},
    "description": "Token ids, each below the model's vocabulary size.",
}
COMPLETION_REQUEST: Schema = obj(
    {
        **_SAMPLING,
        "prompt": {
            "description": "One prompt: a string or token ids (a list of one is the same).",
            "anyOf": [
                {"type": "string"},
                _TOKENS,
                {"type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "string"}},
                {"type": "array", "minItems": 1, "maxItems": 1, "items": _TOKENS},
            ],
        },
    },
    "model",
    "prompt",
    **_STREAM_OPTIONS_NEED_STREAM,
)

_TEXT = {"type": "string", "pattern": "\\S", "description": "Not blank."}
EMBEDDING_REQUEST: Schema = obj(
    {
        "model": _SAMPLING["model"],
        "input": {
            "anyOf": [
                _TEXT,
                {"type": "array", "minItems": 1, "maxItems": MAX_EMBEDDING_INPUTS, "items": _TEXT},
                _TOKENS,
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_EMBEDDING_INPUTS,
                    "items": _TOKENS,
                },
            ]
        },
        "encoding_format": {"type": ["string", "null"], "enum": [*ENCODING_FORMATS, None]},
        "dimensions": integer(1, 1 << 16, "Fewer than the model's: cut and normalised again."),
        "user": _SAMPLING["user"],
        "service_tier": _SAMPLING["service_tier"],
        "timeout": _SAMPLING["timeout"],
    },
    "model",
    "input",
)

_BOOLEAN = {"type": ["boolean", "null"]}
_TOKENIZE_COMMON: dict[str, Schema] = {
    "model": _SAMPLING["model"],
    "add_special_tokens": {
        **_BOOLEAN,
        "description": "Add the tokenizer's special tokens (BOS); default: true for a "
        "prompt, false for messages (the chat template writes its own).",
    },
    "return_token_strs": {**_BOOLEAN, "description": "Also answer each token's string."},
    # Accepted only with the values that ask for nothing.
    "tools": {"type": ["array", "null"], "maxItems": 0},
    "chat_template_kwargs": {"type": ["object", "null"], "maxProperties": 0},
}
# vLLM's TokenizeRequest: a completion prompt, or chat messages (the two cannot be mixed).
TOKENIZE_REQUEST: Schema = {
    "anyOf": [
        obj(
            {**_TOKENIZE_COMMON, "prompt": {"type": "string"}, "messages": {"type": "null"}},
            "model",
            "prompt",
        ),
        obj(
            {
                **_TOKENIZE_COMMON,
                "messages": CHAT_REQUEST["properties"]["messages"],
                "prompt": {"type": "null"},
                "add_generation_prompt": {
                    **_BOOLEAN,
                    "description": "End with the assistant's turn opened (default: true).",
                },
                "continue_final_message": {
                    **_BOOLEAN,
                    "description": "Leave the last message open, to be continued; not "
                    "together with add_generation_prompt=true.",
                },
            },
            "model",
            "messages",
        ),
    ]
}
DETOKENIZE_REQUEST: Schema = obj(
    {
        "model": _SAMPLING["model"],
        "tokens": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0},
            "description": "Token ids, each below the model's vocabulary size.",
        },
    },
    "model",
    "tokens",
)
