"""The objects the /v1 API answers with, as its OpenAPI document describes them.

Files and batches are batches.openapi's.
"""

from __future__ import annotations

from inference.base.errors import ERROR_TYPES
from inference.openapi.schema import Schema, obj, ref

ERROR: Schema = obj(
    {
        "error": obj(
            {
                "message": {"type": "string"},
                "type": {"type": "string", "enum": sorted(set(ERROR_TYPES.values()))},
                "param": {"type": ["string", "null"]},
                "code": {"type": "string"},
            },
            "message",
            "type",
            "param",
            "code",
        )
    },
    "error",
)

USAGE: Schema = obj(
    {
        "prompt_tokens": {"type": "integer", "description": "Every prompt's tokens."},
        "completion_tokens": {"type": "integer", "description": "Every choice's tokens."},
        "total_tokens": {"type": "integer"},
        "prompt_tokens_details": obj(
            {
                "cached_tokens": {
                    "type": "integer",
                    "description": "Prompt tokens the engine's prefix cache served.",
                },
                "created_cache_tokens": {
                    "type": "integer",
                    "description": "Chat only: prompt tokens computed and written to the "
                    "prefix cache.",
                },
            },
            "cached_tokens",
        ),
        "completion_tokens_details": obj(
            {
                "reasoning_tokens": {
                    "type": "integer",
                    "description": "Completion tokens a reasoning model spent thinking.",
                }
            },
            "reasoning_tokens",
            description="A reasoning model's (a version with a reasoning parser) only.",
        ),
    },
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
)

_ENVELOPE: dict[str, Schema] = {
    "id": {"type": "string"},
    "created": {"type": "integer"},
    "model": {"type": "string"},
    "system_fingerprint": {"type": "string"},
}
_FINISH = {"type": "string", "description": "stop, length, tool_calls or content_filter."}
_TOP_LOGPROB: Schema = obj(
    {
        "token": {"type": "string"},
        "logprob": {"type": "number"},
        "bytes": {"type": ["array", "null"], "items": {"type": "integer"}},
    },
    "token",
    "logprob",
)
_CHAT_LOGPROBS: Schema = {
    "anyOf": [
        obj(
            {
                "content": {
                    "type": ["array", "null"],
                    "items": obj(
                        {
                            **_TOP_LOGPROB["properties"],
                            "top_logprobs": {"type": "array", "items": _TOP_LOGPROB},
                        },
                        "token",
                        "logprob",
                        "top_logprobs",
                    ),
                },
                "refusal": {"type": "null"},
            },
            "content",
        ),
        {"type": "null"},
    ]
}
_COMPLETION_LOGPROBS: Schema = {
    "anyOf": [
        obj(
            {
                "text_offset": {"type": "array", "items": {"type": "integer"}},
                "token_logprobs": {"type": "array", "items": {"type": ["number", "null"]}},
                "tokens": {"type": "array", "items": {"type": "string"}},
                "top_logprobs": {
                    "type": "array",
                    "items": {
                        "type": ["object", "null"],
                        "additionalProperties": {"type": "number"},
                    },
                },
            },
            "text_offset",
            "token_logprobs",
            "tokens",
            "top_logprobs",
        ),
        {"type": "null"},
    ]
}
_TOOL_CALL: Schema = obj(
    {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": obj(
            {"name": {"type": "string"}, "arguments": {"type": "string"}}, "name", "arguments"
        ),
    },
    "id",
    "type",
    "function",
)
_TOOL_CALL_PIECE: Schema = obj(
    {
        "index": {"type": "integer"},
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": obj({"name": {"type": "string"}, "arguments": {"type": "string"}}),
    },
    "index",
    description="A tool call in pieces: id, type and name first, then the arguments.",
)

_STOP_REASON: Schema = {
    "type": ["string", "integer", "null"],
    "description": "vLLM's: the stop string or stop token id that ended the choice; null "
    "when neither did (its end of sequence, or its length).",
}
_ROLE: Schema = {
    "type": "string",
    "description": "assistant; with add_generation_prompt false, the last message's role.",
}

CHAT_COMPLETION: Schema = obj(
    {
        **_ENVELOPE,
        "object": {"const": "chat.completion"},
        "choices": {
            "type": "array",
            "items": obj(
                {
                    "index": {"type": "integer"},
                    "message": obj(
                        {
                            "role": _ROLE,
                            "content": {
                                "type": ["string", "null"],
                                "description": "null beside the tool calls of tool_choice auto.",
                            },
                            "refusal": {"type": "null"},
                            "reasoning": {
                                "type": ["string", "null"],
                                "description": "A reasoning model's thinking.",
                            },
                            "tool_calls": {"type": "array", "items": _TOOL_CALL},
                        },
                        "role",
                        "content",
                    ),
                    "logprobs": _CHAT_LOGPROBS,
                    "finish_reason": _FINISH,
                    "stop_reason": _STOP_REASON,
                },
                "index",
                "message",
                "finish_reason",
            ),
        },
        "usage": ref("Usage"),
    },
    "id",
    "object",
    "created",
    "model",
    "choices",
    "usage",
)


def _text_completion(finish: Schema, usage: Schema) -> Schema:
    return obj(
        {
            **_ENVELOPE,
            "object": {"const": "text_completion"},
            "choices": {
                "type": "array",
                "items": obj(
                    {
                        "index": {"type": "integer"},
                        "text": {"type": "string"},
                        "logprobs": _COMPLETION_LOGPROBS,
                        "finish_reason": finish,
                        "stop_reason": _STOP_REASON,
                    },
                    "index",
                    "text",
                    "finish_reason",
                ),
            },
            "usage": usage,
        },
        "id",
        "object",
        "created",
        "model",
        "choices",
    )


_CHUNK_USAGE = {
    "anyOf": [ref("Usage"), {"type": "null"}],
    "description": "With stream_options.include_usage: null, then a last chunk has it.",
}
TEXT_COMPLETION = _text_completion(_FINISH, ref("Usage"))
TEXT_COMPLETION["required"].append("usage")
TEXT_COMPLETION_CHUNK = _text_completion({**_FINISH, "type": ["string", "null"]}, _CHUNK_USAGE)

CHAT_COMPLETION_CHUNK: Schema = obj(
    {
        **_ENVELOPE,
        "object": {"const": "chat.completion.chunk"},
        "choices": {
            "type": "array",
            "items": obj(
                {
                    "index": {"type": "integer"},
                    "delta": obj(
                        {
                            "role": _ROLE,
                            "content": {"type": "string"},
                            "reasoning": {"type": "string"},
                            "tool_calls": {"type": "array", "items": _TOOL_CALL_PIECE},
                        }
                    ),
                    "logprobs": _CHAT_LOGPROBS,
                    "finish_reason": {**_FINISH, "type": ["string", "null"]},
                    "stop_reason": {**_STOP_REASON, "description": "On a choice's last chunk."},
                },
                "index",
                "delta",
                "finish_reason",
            ),
        },
        "usage": _CHUNK_USAGE,
    },
    "id",
    "object",
    "created",
    "model",
    "choices",
)


EMBEDDINGS: Schema = obj(
    {
        "id": {"type": "string", "description": "embd- and the request's id, as vLLM names it"},
        "created": {"type": "integer"},
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": obj(
                {
                    "object": {"const": "embedding"},
                    "index": {"type": "integer"},
                    "embedding": {
                        "anyOf": [
                            {"type": "array", "items": {"type": "number"}},
                            {
                                "type": "string",
                                "description": "base64 bytes: float32 or embed_dtype, endianness",
                            },
                        ]
                    },
                },
                "object",
                "index",
                "embedding",
            ),
        },
        "model": {"type": "string"},
        "usage": obj(
            {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}},
            "prompt_tokens",
            "total_tokens",
        ),
    },
    "id",
    "created",
    "object",
    "data",
    "model",
    "usage",
)

MODEL: Schema = obj(
    {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {
            "type": "string",
            "description": "The tenant the model was built for (only its keys see it), or "
            "roundhouse for a platform model.",
        },
        "root": {
            "type": "string",
            "description": "The model pinned to the version that answers the name now.",
        },
        "max_model_len": {
            "type": "integer",
            "description": "The context this tenant may use: the version's and its own "
            "limit's smaller (as /tokenize reports it).",
        },
        "version": {"type": "string", "description": "The version the name routes to now."},
        "traffic": {
            "type": "object",
            "additionalProperties": {"type": "number"},
            "description": "Version -> percent of the alias's traffic, while it is split.",
        },
    },
    "id",
    "object",
    "created",
    "owned_by",
    "root",
    "max_model_len",
)

REQUEST_STATUS: Schema = obj(
    {
        "id": {"type": "string"},
        "object": {"const": "request"},
        "status": {"type": "string", "enum": ["cancelling", "finished"]},
    },
    "id",
    "object",
    "status",
)

# vLLM's /tokenize and /detokenize answers (inference.operations.views), field for field.
TOKENIZE_RESPONSE: Schema = obj(
    {
        "count": {"type": "integer", "minimum": 0},
        "max_model_len": {
            "type": "integer",
            "description": "The context this tenant gets on the routed deployment.",
        },
        "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "token_strs": {
            "type": ["array", "null"],
            "items": {"type": "string"},
            "description": "Each token's vocabulary entry, with return_token_strs=true.",
        },
    },
    "count",
    "max_model_len",
    "tokens",
    "token_strs",
)
DETOKENIZE_RESPONSE: Schema = obj({"prompt": {"type": "string"}}, "prompt")
VERSION: Schema = obj(
    {"version": {"type": "string", "description": "The platform's version."}}, "version"
)
