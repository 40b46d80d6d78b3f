"""Anthropic's Messages API in the /v1 document (docs/messages.md)."""

from __future__ import annotations

from inference.base.errors import ANTHROPIC_TYPES
from inference.messages.protocol import EFFORTS, MIN_THINKING_BUDGET, PASSED_TO_CHAT
from inference.openapi.paths import (
    _ERROR_DESCRIPTIONS,
    _RETRY_AFTER,
    _TIMEOUT_HEADER,
    AUTH_ERRORS,
    REQUEST_ID_HEADER,
    ok,
)
from inference.openapi.schema import Schema, json_content, obj, ref

_BLOCK: Schema = {
    "type": "object",
    "description": "A content block: text, image (source), thinking (thinking, signature), "
    "redacted_thinking (data), tool_use (id, name, input) or tool_result (tool_use_id, "
    "content, is_error); a tool search's tool_reference (tool_name) inside a tool_result's "
    "content, and tool_addition or tool_removal (tool) in a system message. `cache_control` is "
    "accepted: the engine's prefix cache keeps every prompt's blocks.",
    "properties": {
        "type": {
            "type": "string",
            "enum": [
                "text",
                "image",
                "thinking",
                "redacted_thinking",
                "tool_use",
                "tool_result",
                "tool_reference",
                "tool_addition",
                "tool_removal",
            ],
        },
        "text": {"type": "string"},
        "source": {"type": "object"},
        "thinking": {"type": "string"},
        "signature": {"type": "string"},
        "data": {"type": "string"},
        "id": {"type": "string"},
        "name": {"type": "string"},
        "input": {"type": "object"},
        "tool_use_id": {"type": "string"},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "is_error": {"type": "boolean"},
        "tool_name": {"type": "string"},
        "tool": {
            "type": "object",
            "description": "A tool_reference (name) of a declared tool, or a tool_definition "
            "(definition: a tool) to add.",
        },
        "cache_control": {"type": "object"},
    },
    "required": ["type"],
}
_CONTENT: Schema = {"anyOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}]}
_MESSAGE_PARAM = obj(
    {"role": {"type": "string", "enum": ["user", "assistant", "system"]}, "content": _CONTENT},
    "role",
    "content",
)
_TOOL = obj(
    {
        "name": {"type": "string"},
        "description": {"type": "string"},
        "input_schema": {"type": "object"},
        "strict": {"type": "boolean"},
        "defer_loading": {
            "type": "boolean",
            "description": "Deferred until a tool search adds it (passed to the template).",
        },
        "cache_control": {"type": "object"},
    },
    "name",
    "input_schema",
)
_TOOL_CHOICE = obj(
    {
        "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]},
        "name": {"type": "string", "description": "The tool, when type is tool."},
        "disable_parallel_tool_use": {"type": "boolean"},
    },
    "type",
)
_THINKING: Schema = {
    "type": "object",
    "description": "enabled (budget_tokens, at least 1024 and under max_tokens: the engine "
    "ends the thinking there), disabled (the template's thinking off), or adaptive (the model "
    "thinks as long as it likes, under max_tokens). Needs a model version with a reasoning "
    "parser to be split from the answer.",
    "properties": {
        "type": {"type": "string", "enum": ["enabled", "disabled", "adaptive"]},
        "budget_tokens": {"type": "integer", "minimum": MIN_THINKING_BUDGET},
        "display": {"type": "string", "enum": ["summarized"]},
    },
    "required": ["type"],
}
_OUTPUT_CONFIG = obj(
    {
        "effort": {"type": "string", "enum": list(EFFORTS)},
        "format": obj({"type": {"const": "json_schema"}, "schema": {"type": "object"}}, "schema"),
    }
)
_COMMON: dict[str, Schema] = {
    "model": {"type": "string"},
    "messages": {"type": "array", "items": _MESSAGE_PARAM},
    "system": {"anyOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}]},
    "tools": {"type": "array", "items": _TOOL},
    "tool_choice": _TOOL_CHOICE,
    "thinking": _THINKING,
    "output_config": _OUTPUT_CONFIG,
    "cache_control": {"type": "object"},
    "chat_template_kwargs": {"type": "object"},
}
MESSAGES_REQUEST: Schema = obj(
    {
        **_COMMON,
        "max_tokens": {"type": "integer", "minimum": 1},
        "stop_sequences": {"type": "array", "items": {"type": "string"}},
        "stream": {"type": "boolean"},
        "temperature": {"type": "number", "minimum": 0},
        "top_p": {"type": "number"},
        "top_k": {"type": "integer"},
        "metadata": obj({"user_id": {"type": "string"}}),
        **{name: {"description": "vLLM's extension, as on chat."} for name in PASSED_TO_CHAT[1:]},
    },
    "model",
    "messages",
    "max_tokens",
)
COUNT_TOKENS_REQUEST: Schema = obj(_COMMON, "model", "messages")
_OUT_BLOCK: Schema = {
    "type": "object",
    "description": "thinking (thinking, signature), text (text) or tool_use (id, name, input).",
    "properties": {
        "type": {"type": "string", "enum": ["thinking", "text", "tool_use"]},
        "text": {"type": "string"},
        "thinking": {"type": "string"},
        "signature": {"type": "string"},
        "id": {"type": "string"},
        "name": {"type": "string"},
        "input": {"type": "object"},
    },
    "required": ["type"],
}
_USAGE = obj(
    {
        "input_tokens": {
            "type": "integer",
            "description": "Neither read from nor written to the prefix cache.",
        },
        "output_tokens": {"type": "integer"},
        "cache_creation_input_tokens": {"type": "integer"},
        "cache_read_input_tokens": {"type": "integer"},
    },
    "input_tokens",
    "output_tokens",
)
MESSAGE: Schema = obj(
    {
        "id": {"type": "string", "description": "msg_ and the request id."},
        "type": {"const": "message"},
        "role": {"const": "assistant"},
        "content": {"type": "array", "items": _OUT_BLOCK},
        "model": {"type": "string"},
        "stop_reason": {
            "type": ["string", "null"],
            "enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use", None],
        },
        "stop_sequence": {"type": "string"},
        "usage": _USAGE,
    },
    "id",
    "type",
    "role",
    "content",
    "model",
    "stop_reason",
    "usage",
)
_EVENT: Schema = {
    "type": "string",
    "description": "Server-sent events, each named by its type: message_start, then per "
    "block content_block_start, content_block_delta (text_delta, thinking_delta, "
    "signature_delta, input_json_delta) and content_block_stop, then message_delta (the "
    "stop_reason and usage) and message_stop; or one error event.",
}
COUNTED: Schema = obj(
    {
        "input_tokens": {"type": "integer"},
        "context_management": obj({"original_input_tokens": {"type": "integer"}}),
    },
    "input_tokens",
)
ANTHROPIC_ERROR: Schema = obj(
    {
        "type": {"const": "error"},
        "error": obj(
            {
                "type": {
                    "type": "string",
                    "enum": sorted(
                        {*ANTHROPIC_TYPES.values(), "api_error", "invalid_request_error"}
                    ),
                },
                "message": {"type": "string"},
                "code": {"type": ["string", "null"], "description": "The platform's code."},
                "param": {"type": ["string", "null"], "description": "The field at fault."},
            },
            "type",
            "message",
        ),
    },
    "type",
    "error",
)
SCHEMAS: dict[str, Schema] = {
    "AnthropicError": ANTHROPIC_ERROR,
    "MessagesRequest": MESSAGES_REQUEST,
    "Message": MESSAGE,
    "CountTokensRequest": COUNT_TOKENS_REQUEST,
    "CountedTokens": COUNTED,
}


def _errors(*statuses: int) -> dict[str, Schema]:
    """The error answers of a Messages path: the API's, in Anthropic's shape."""
    return {
        str(status): {
            "description": _ERROR_DESCRIPTIONS[status],
            "headers": {
                **REQUEST_ID_HEADER,
                "x-should-retry": {"$ref": "#/components/headers/ShouldRetry"},
                **(_RETRY_AFTER if status in (409, 429, 503) else {}),
            },
            "content": json_content(ref("AnthropicError")),
        }
        for status in statuses
    }


def messages_paths() -> dict[str, Schema]:
    return {
        "/v1/messages": {
            "post": {
                "summary": "Anthropic's Messages API (whole or streamed), on the chat path; "
                "errors in Anthropic's shape, the key as x-api-key or a bearer token",
                "parameters": [_TIMEOUT_HEADER],
                "requestBody": {"required": True, "content": json_content(ref("MessagesRequest"))},
                "responses": {
                    "200": ok(
                        "The message, or its events with stream=true.",
                        {**json_content(ref("Message")), "text/event-stream": {"schema": _EVENT}},
                    ),
                    **_errors(400, *AUTH_ERRORS, 404, 413, 429, 503),
                },
            }
        },
        "/v1/messages/count_tokens": {
            "post": {
                "summary": "The input tokens a Messages request would take",
                "requestBody": {
                    "required": True,
                    "content": json_content(ref("CountTokensRequest")),
                },
                "responses": {
                    "200": ok("The count.", json_content(ref("CountedTokens"))),
                    **_errors(400, *AUTH_ERRORS, 404, 413, 429, 503),
                },
            }
        },
    }
