"""The request bodies of the /v1 API, as its OpenAPI document describes them.

Chat and completions bodies are built from their field table (inference.fields): each field's
schema is the one its reader enforces. The embeddings and tokenize bodies are written from what
inference.params accepts, with the limits imported where the code names them. The batch views'
bodies are batches.openapi's.
"""

from __future__ import annotations

from inference.fields import CHAT, COMPLETIONS, GENERATION_FIELDS, Field
from inference.kinds import TOKEN_IDS
from inference.openapi.schema import Schema, integer, obj
from inference.params import ENCODING_FORMATS, MAX_EMBEDDING_INPUTS


def request_schema(fields: dict[str, Field], endpoint: str, *required: str) -> Schema:
    """A request body's schema, from its field table: each field as its kind declares it.

    A refused field takes only null or the values that ask for nothing; a field in no table
    is refused, so the body takes no other properties.
    """
    properties: dict[str, Schema] = {}
    for name, field in fields.items():
        if field.only is not None and field.only != endpoint:
            continue
        if field.decision == "refused":
            properties[name] = {
                "enum": [*field.unused, None],
                "description": "Not served: refused unless null"
                + (" or an unused value." if field.unused else "."),
            }
        elif field.kind is not None:
            properties[name] = field.kind.schema
    return obj(properties, *required, additionalProperties=False)


# A stream with options is a conditional JSON Schema can say: options need stream=true.
_STREAM_OPTIONS_NEED_STREAM: Schema = {
    "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
    "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
}
CHAT_REQUEST: Schema = {
    **request_schema(GENERATION_FIELDS, CHAT, "model", "messages"),
    **_STREAM_OPTIONS_NEED_STREAM,
}
COMPLETION_REQUEST: Schema = {
    **request_schema(GENERATION_FIELDS, COMPLETIONS, "model", "prompt"),
    **_STREAM_OPTIONS_NEED_STREAM,
}
_TOKENS = TOKEN_IDS
# Fields the embeddings body shares with chat, as chat declares them.
_SAMPLING = {
    name: CHAT_REQUEST["properties"][name] for name in ("model", "user", "timeout", "service_tier")
}


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
