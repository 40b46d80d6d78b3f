"""The Responses API's operations and objects in the /v1 document (docs/responses.md)."""

from __future__ import annotations

from inference.body.fields import GENERATION_FIELDS, MAX_LOGPROBS
from inference.openapi.paths import (
    _IDEMPOTENCY_KEY,
    _TIMEOUT_HEADER,
    AUTH_ERRORS,
    errors,
    ok,
    path_parameter,
)
from inference.openapi.schema import Schema, json_content, obj, ref
from inference.responses.protocol import (
    COUNT_REFUSED_UNLESS,
    COUNTED,
    MAX_METADATA_KEYS,
    OUTPUT_LOGPROBS,
    PASSED_TO_CHAT,
    REFUSED_UNLESS,
)

_STATUS = {
    "type": "string",
    "enum": ["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"],
}
_TEXT_PART = obj({"type": {"type": "string"}, "text": {"type": "string"}}, "type")
ITEM: Schema = {
    "type": "object",
    "description": "A message (role, content parts), a reasoning item (reasoning_text "
    "parts), a function_call (call_id, name, arguments) or a function_call_output (call_id, "
    "output).",
    "properties": {
        "type": {
            "type": "string",
            "enum": ["message", "reasoning", "function_call", "function_call_output"],
        },
        "id": {"type": "string"},
        "role": {"type": "string", "enum": ["user", "system", "developer", "assistant"]},
        "content": {
            "anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}],
        },
        "call_id": {"type": "string"},
        "name": {"type": "string"},
        "arguments": {"type": "string"},
        "output": {"type": "string"},
    },
}
_FUNCTION_TOOL = obj(
    {
        "type": {"const": "function"},
        "name": {"type": "string"},
        "description": {"type": "string"},
        "parameters": {"type": "object"},
        "strict": {"type": ["boolean", "null"]},
    },
    "type",
    "name",
)

RESPONSES_REQUEST: Schema = obj(
    {
        "model": {"type": "string", "description": "A model, alias or name@version."},
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": ITEM}]},
        "instructions": {"type": ["string", "null"]},
        "max_output_tokens": {"type": ["integer", "null"], "minimum": 1},
        "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
        "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
        "tools": {"type": ["array", "null"], "items": _FUNCTION_TOOL},
        "tool_choice": {
            "anyOf": [
                {"type": "string", "enum": ["none", "auto", "required"]},
                obj({"type": {"const": "function"}, "name": {"type": "string"}}, "type", "name"),
                {"type": "null"},
            ]
        },
        "parallel_tool_calls": {"type": ["boolean", "null"]},
        "text": {
            "type": ["object", "null"],
            "properties": {
                "format": obj(
                    {
                        "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
                        "name": {"type": "string"},
                        "schema": {"type": "object"},
                        "strict": {"type": ["boolean", "null"]},
                    },
                    "type",
                )
            },
        },
        "metadata": {
            "type": ["object", "null"],
            "maxProperties": MAX_METADATA_KEYS,
            "additionalProperties": {"type": "string", "maxLength": 512},
        },
        "user": {"type": ["string", "null"]},
        "safety_identifier": {"type": ["string", "null"]},
        "store": {"type": ["boolean", "null"]},
        "previous_response_id": {"type": ["string", "null"]},
        "conversation": {
            "anyOf": [
                {"type": "string"},
                obj({"id": {"type": "string"}}, "id", additionalProperties=False),
                {"type": "null"},
            ],
            "description": "A conversation (conv_...): its items are the history, and the "
            "response's turn is added to it; not with previous_response_id.",
        },
        "background": {"type": ["boolean", "null"]},
        "stream": {"type": ["boolean", "null"]},
        "truncation": {"type": ["string", "null"], "enum": ["auto", "disabled", None]},
        "service_tier": GENERATION_FIELDS["service_tier"].kind.schema,  # type: ignore[union-attr]
        "include": {
            "type": ["array", "null"],
            "items": {"const": OUTPUT_LOGPROBS},
            "description": "Only the output text's log probabilities can be included.",
        },
        "top_logprobs": {
            "type": ["integer", "null"],
            "minimum": 0,
            "maximum": MAX_LOGPROBS,
            "description": f"Alternatives per output token; needs include {OUTPUT_LOGPROBS}.",
        },
        "reasoning": {
            "type": ["object", "null"],
            "properties": {
                "effort": GENERATION_FIELDS["reasoning_effort"].kind.schema,  # type: ignore[union-attr]
                "summary": {"type": "null", "description": "No summary is written."},
            },
            "additionalProperties": False,
            "description": "A reasoning model's effort: chat's reasoning_effort.",
        },
        "max_tool_calls": {
            "type": ["integer", "null"],
            "minimum": 1,
            "description": "Calls to built-in tools; none runs here, so it is only repeated.",
        },
        # vLLM's sampling extras, as chat takes them.
        **{
            name: GENERATION_FIELDS[name].kind.schema  # type: ignore[union-attr]
            for name in PASSED_TO_CHAT
        },
        **{
            name: {
                "enum": [value for value in unused if value is not None] + [None],
                "description": "Not served: refused unless null or an unused value.",
            }
            for name, unused in REFUSED_UNLESS.items()
        },
    },
    "model",
    "input",
    additionalProperties=False,
)

# A count's body: a create's fields that bear on the prompt, read as a create reads them.
INPUT_TOKENS_REQUEST: Schema = obj(
    {
        **{name: RESPONSES_REQUEST["properties"][name] for name in sorted(COUNTED)},
        **{
            name: {"type": "null", "description": "Not served: refused unless null."}
            for name in COUNT_REFUSED_UNLESS
        },
    },
    "model",
    "input",
    additionalProperties=False,
)
INPUT_TOKENS: Schema = obj(
    {"object": {"const": "response.input_tokens"}, "input_tokens": {"type": "integer"}},
    "object",
    "input_tokens",
)
RESPONSE: Schema = obj(
    {
        "id": {"type": "string"},
        "object": {"const": "response"},
        "created_at": {"type": "integer"},
        "completed_at": {"type": ["integer", "null"]},
        "status": _STATUS,
        "error": {"type": ["object", "null"]},
        "incomplete_details": {"type": ["object", "null"]},
        "model": {"type": "string"},
        "output": {"type": "array", "items": {"type": "object"}},
        "output_text": {"type": "string"},
        "usage": {"type": ["object", "null"]},
        "background": {"type": "boolean"},
        "store": {"type": "boolean"},
    },
    "id",
    "object",
    "created_at",
    "status",
    "model",
    "output",
)
RESPONSE_DELETED: Schema = obj(
    {"id": {"type": "string"}, "object": {"const": "response"}, "deleted": {"const": True}},
    "id",
    "object",
    "deleted",
)
INPUTITEMS: Schema = obj(
    {
        "object": {"const": "list"},
        "data": {"type": "array", "items": {"type": "object"}},
        "first_id": {"type": ["string", "null"]},
        "last_id": {"type": ["string", "null"]},
        "has_more": {"type": "boolean"},
    },
    "object",
    "data",
    "has_more",
)
_EVENT: Schema = obj(
    {
        "event": {"type": "string", "description": "The event's type."},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": obj(
                {"type": {"type": "string"}, "sequence_number": {"type": "integer"}},
                "type",
                "sequence_number",
            ),
        },
    },
    "data",
)
SCHEMAS: dict[str, Schema] = {
    "ResponsesRequest": RESPONSES_REQUEST,
    "Response": RESPONSE,
    "ResponseDeleted": RESPONSE_DELETED,
    "ResponseInputItems": INPUTITEMS,
    "ResponsesInputTokensRequest": INPUT_TOKENS_REQUEST,
    "ResponsesInputTokens": INPUT_TOKENS,
}
_ID = path_parameter("response_id", "The response's id (resp_...).")


def responses_paths() -> dict[str, Schema]:
    return {
        "/v1/responses": {
            "post": {
                "summary": "Create a response (whole, streamed, or in the background)",
                "parameters": [_IDEMPOTENCY_KEY, _TIMEOUT_HEADER],
                "requestBody": {"required": True, "content": json_content(ref("ResponsesRequest"))},
                "responses": {
                    "200": ok(
                        "The response (queued, in the background), or its events with stream=true.",
                        {
                            **json_content(ref("Response")),
                            "text/event-stream": {"schema": _EVENT},
                        },
                    ),
                    **errors(400, *AUTH_ERRORS, 404, 409, 413, 422, 429, 503),
                },
            }
        },
        "/v1/responses/input_tokens": {
            "post": {
                "summary": "The input tokens a response would take (OpenAI's count)",
                "requestBody": {
                    "required": True,
                    "content": json_content(ref("ResponsesInputTokensRequest")),
                },
                "responses": {
                    "200": ok("The count.", json_content(ref("ResponsesInputTokens"))),
                    **errors(400, *AUTH_ERRORS, 404, 413, 429, 503),
                },
            }
        },
        "/v1/responses/{response_id}": {
            "get": {
                "summary": "A stored response; with stream=true a background response's events",
                "parameters": [
                    _ID,
                    {
                        "name": "stream",
                        "in": "query",
                        "description": "Stream a background response's events again.",
                        "schema": {"type": "boolean"},
                    },
                    {
                        "name": "starting_after",
                        "in": "query",
                        "description": "With stream: send the events after this sequence number.",
                        "schema": {"type": "integer"},
                    },
                ],
                "responses": {
                    "200": ok(
                        "The response, or its events.",
                        {
                            **json_content(ref("Response")),
                            "text/event-stream": {"schema": _EVENT},
                        },
                    ),
                    **errors(400, *AUTH_ERRORS, 404, 503),
                },
            },
            "delete": {
                "summary": "Delete a stored response",
                "parameters": [_ID],
                "responses": {
                    "200": ok("It is deleted.", json_content(ref("ResponseDeleted"))),
                    **errors(*AUTH_ERRORS, 404, 503),
                },
            },
        },
        "/v1/responses/{response_id}/input_items": {
            "get": {
                "summary": "A stored response's input items, a page at a time",
                "parameters": [
                    _ID,
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 100},
                    },
                    {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
                    {"name": "after", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {
                    "200": ok("A page of items.", json_content(ref("ResponseInputItems"))),
                    **errors(400, *AUTH_ERRORS, 404, 503),
                },
            }
        },
        "/v1/responses/{response_id}/cancel": {
            "post": {
                "summary": "Cancel a background response",
                "parameters": [_ID],
                "responses": {
                    "200": ok("The response as it ended.", json_content(ref("Response"))),
                    **errors(400, *AUTH_ERRORS, 404, 503),
                },
            }
        },
    }
