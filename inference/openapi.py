"""The OpenAPI document of the /v1 API, served at /v1/openapi.json.

Written from what the views and inference.params accept and answer; the limits below are the
ones the code enforces, imported where the code names them. tests/security/test_schemathesis.py
checks every answer of a running platform against it. A stream's event is described the way
OpenAPI 3.1 tools read `text/event-stream`: the schema is one event, and its `data` is JSON.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from batches.models import BatchStatus, FilePurpose
from batches.services import ENDPOINTS
from inference.errors import ERROR_TYPES
from inference.idempotency import MAX_KEY_LENGTH
from inference.params import (
    ENCODING_FORMATS,
    MAX_EMBEDDING_INPUTS,
    MAX_STOP_SEQUENCES,
    ROLES,
    SERVICE_TIERS,
)

Schema = dict[str, Any]

MAX_TOKENS = 1 << 30
NO_NUL = "^[^\\x00]*$"
PATH_SEGMENT = "^[^/]+$"  # what Django's <str:...> converter matches
ENTRY_ID = "^\\d{1,20}-\\d{1,20}$"


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _integer(lo: int, hi: int, description: str = "") -> Schema:
    schema: Schema = {"type": ["integer", "null"], "minimum": lo, "maximum": hi}
    return {**schema, "description": description} if description else schema


def _number(lo: float, hi: float, description: str = "") -> Schema:
    schema: Schema = {"type": ["number", "null"], "minimum": lo, "maximum": hi}
    return {**schema, "description": description} if description else schema


def _object(properties: dict[str, Schema], *required: str, **extra: Any) -> Schema:
    return {"type": "object", "required": list(required), "properties": properties, **extra}


def _json(schema: Schema) -> dict[str, Schema]:
    return {"application/json": {"schema": schema}}


REQUEST_ID_HEADER = {"x-request-id": {"$ref": "#/components/headers/RequestId"}}
VERSION_HEADER = {"x-switchyard-model-version": {"$ref": "#/components/headers/ModelVersion"}}


def _ok(
    description: str, content: dict[str, Schema], headers: dict[str, Schema] | None = None
) -> Schema:
    return {
        "description": description,
        "headers": {**REQUEST_ID_HEADER, **(headers or {})},
        "content": content,
    }


def _errors(*statuses: int) -> dict[str, Schema]:
    return {str(status): {"$ref": f"#/components/responses/{status}"} for status in statuses}


_ERROR_DESCRIPTIONS = {
    400: "The request is invalid; `param` names the field at fault.",
    401: "No API key, or one that is malformed, unknown, revoked or expired.",
    403: "The key lacks the scope this operation needs, or its tenant is disabled.",
    404: "No such model, file, batch or request for this key's tenant.",
    409: "The object's state does not allow it, or its Idempotency-Key is in use.",
    413: "The request body (or the uploaded file) is larger than the API accepts.",
    422: "The Idempotency-Key was used with a different request body.",
    429: "A limit of the tenant is reached: requests or tokens per minute, concurrency, budget.",
    503: "No capacity, or the request's deadline passed; retry after `Retry-After` seconds.",
}
_RETRY_AFTER = {"Retry-After": {"$ref": "#/components/headers/RetryAfter"}}

ERROR: Schema = _object(
    {
        "error": _object(
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

USAGE: Schema = _object(
    {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"},
        "total_tokens": {"type": "integer"},
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
_FINISH = {"type": "string", "description": "stop, length or abort."}

CHAT_COMPLETION: Schema = _object(
    {
        **_ENVELOPE,
        "object": {"const": "chat.completion"},
        "choices": {
            "type": "array",
            "items": _object(
                {
                    "index": {"type": "integer"},
                    "message": _object(
                        {
                            "role": {"const": "assistant"},
                            "content": {"type": "string"},
                            "refusal": {"type": "null"},
                        },
                        "role",
                        "content",
                    ),
                    "logprobs": {"type": "null"},
                    "finish_reason": _FINISH,
                },
                "index",
                "message",
                "finish_reason",
            ),
        },
        "usage": _ref("Usage"),
    },
    "id",
    "object",
    "created",
    "model",
    "choices",
    "usage",
)


def _text_completion(finish: Schema, usage: Schema) -> Schema:
    return _object(
        {
            **_ENVELOPE,
            "object": {"const": "text_completion"},
            "choices": {
                "type": "array",
                "items": _object(
                    {
                        "index": {"type": "integer"},
                        "text": {"type": "string"},
                        "logprobs": {"type": "null"},
                        "finish_reason": finish,
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
    "anyOf": [_ref("Usage"), {"type": "null"}],
    "description": "With stream_options.include_usage: null, then a last chunk has it.",
}
TEXT_COMPLETION = _text_completion(_FINISH, _ref("Usage"))
TEXT_COMPLETION["required"].append("usage")
TEXT_COMPLETION_CHUNK = _text_completion({**_FINISH, "type": ["string", "null"]}, _CHUNK_USAGE)

CHAT_COMPLETION_CHUNK: Schema = _object(
    {
        **_ENVELOPE,
        "object": {"const": "chat.completion.chunk"},
        "choices": {
            "type": "array",
            "items": _object(
                {
                    "index": {"type": "integer"},
                    "delta": _object(
                        {"role": {"const": "assistant"}, "content": {"type": "string"}}
                    ),
                    "logprobs": {"type": "null"},
                    "finish_reason": {**_FINISH, "type": ["string", "null"]},
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


def _event(*chunks: str) -> Schema:
    """One server-sent event of a stream: a chunk, an error, or the final `[DONE]`."""
    return _object(
        {
            "data": {
                "description": "A chunk or an Error as JSON, or `[DONE]` (the last event).",
                "anyOf": [
                    {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": {
                            "anyOf": [*(_ref(chunk) for chunk in chunks), _ref("Error")]
                        },
                    },
                    {"const": "[DONE]"},
                ],
            },
            "id": {
                "type": "string",
                "pattern": ENTRY_ID,
                "description": "The event's position, for Last-Event-ID "
                "(absent where the tenant's output is filtered).",
            },
            "event": {"type": "string"},
        },
        "data",
    )


# --- request bodies ----------------------------------------------------------------------------

_SAMPLING: dict[str, Schema] = {
    "model": {
        "type": "string",
        "description": "A model or alias name; `name@version` pins a version.",
    },
    "max_tokens": _integer(
        1, MAX_TOKENS, "At most the tenant's max_tokens_per_request; default: as many as fit."
    ),
    "temperature": _number(0.0, 2.0),
    "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0.0, "maximum": 1.0},
    "top_k": _integer(-1, 1 << 20),
    "seed": _integer(-(1 << 63), (1 << 63) - 1),
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
    "min_tokens": _integer(0, MAX_TOKENS, "At most max_tokens."),
    "presence_penalty": _number(-2.0, 2.0),
    "frequency_penalty": _number(-2.0, 2.0),
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
    "timeout": _number(0.001, 86400.0, "Seconds the client will wait (as x-request-timeout)."),
    # Accepted only with the values that mean "not used": Switchyard answers with one choice.
    "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 1},
    "logprobs": {"enum": [False, None]},
    "echo": {"enum": [False, None]},
    "tools": {"type": ["array", "null"], "maxItems": 0},
    "functions": {"type": ["array", "null"], "maxItems": 0},
    "suffix": {"type": "null"},
    "best_of": {"type": ["integer", "null"], "minimum": 1, "maximum": 1},
    "response_format": {
        "anyOf": [
            _object({"type": {"const": "text"}}, "type", additionalProperties=False),
            {"type": "null"},
        ]
    },
}
# A stream with options is a conditional JSON Schema can say: options need stream=true.
_STREAM_OPTIONS_NEED_STREAM: Schema = {
    "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
    "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
}

_TEXT_PART = _object({"type": {"const": "text"}, "text": {"type": "string"}}, "type", "text")
CHAT_REQUEST: Schema = _object(
    {
        **_SAMPLING,
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": _object(
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
        "max_completion_tokens": _integer(1, MAX_TOKENS, "Takes the place of max_tokens."),
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
COMPLETION_REQUEST: Schema = _object(
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
EMBEDDING_REQUEST: Schema = _object(
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
        "dimensions": _integer(1, 1 << 16, "Fewer than the model's: cut and normalised again."),
        "user": _SAMPLING["user"],
        "service_tier": _SAMPLING["service_tier"],
        "timeout": _SAMPLING["timeout"],
    },
    "model",
    "input",
)

EMBEDDINGS: Schema = _object(
    {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": _object(
                {
                    "object": {"const": "embedding"},
                    "index": {"type": "integer"},
                    "embedding": {
                        "anyOf": [
                            {"type": "array", "items": {"type": "number"}},
                            {"type": "string", "description": "base64 of little-endian float32"},
                        ]
                    },
                },
                "object",
                "index",
                "embedding",
            ),
        },
        "model": {"type": "string"},
        "usage": _object(
            {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}},
            "prompt_tokens",
            "total_tokens",
        ),
    },
    "object",
    "data",
    "model",
    "usage",
)

MODEL: Schema = _object(
    {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
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
)

FILE: Schema = _object(
    {
        "id": {"type": "string"},
        "object": {"const": "file"},
        "bytes": {"type": "integer"},
        "created_at": {"type": "integer"},
        "filename": {"type": "string"},
        "purpose": {"type": "string", "enum": list(FilePurpose.values)},
        "status": {"const": "processed"},
        "status_details": {"type": "null"},
        "expires_at": {"type": "null"},
    },
    "id",
    "object",
    "bytes",
    "created_at",
    "filename",
    "purpose",
    "status",
)

_TIMESTAMP = {"type": ["integer", "null"]}
_BATCH_MOMENTS = ("in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
                  "expired_at", "cancelling_at", "cancelled_at")  # fmt: skip
BATCH: Schema = _object(
    {
        "id": {"type": "string"},
        "object": {"const": "batch"},
        "endpoint": {"type": "string", "enum": list(ENDPOINTS)},
        "errors": {"type": ["object", "null"]},
        "input_file_id": {"type": "string"},
        "completion_window": {"type": "string"},
        "status": {"type": "string", "enum": list(BatchStatus.values)},
        "output_file_id": {"type": ["string", "null"]},
        "error_file_id": {"type": ["string", "null"]},
        "created_at": {"type": "integer"},
        **{name: _TIMESTAMP for name in _BATCH_MOMENTS},
        "request_counts": _object(
            {name: {"type": "integer"} for name in ("total", "completed", "failed")},
            "total",
            "completed",
            "failed",
        ),
        "metadata": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
    },
    "id",
    "object",
    "endpoint",
    "input_file_id",
    "completion_window",
    "status",
    "created_at",
    "request_counts",
)

BATCH_REQUEST: Schema = _object(
    {
        "input_file_id": {
            "type": "string",
            "pattern": NO_NUL,
            "description": "A file uploaded with purpose batch.",
        },
        "endpoint": {"type": "string", "enum": list(ENDPOINTS)},
        "completion_window": {
            "type": "string",
            "pattern": "^[0-9]{1,5}[mh]$",
            "default": "24h",
            "description": "From 1m to 168h.",
        },
        "metadata": {
            "type": ["object", "null"],
            "maxProperties": 16,
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": {"type": "string", "maxLength": 512, "pattern": NO_NUL},
        },
    },
    "input_file_id",
    "endpoint",
)

FILE_UPLOAD: Schema = _object(
    {
        "file": {
            "type": "string",
            "contentMediaType": "application/octet-stream",
            "description": "A JSONL file: one request per line, UTF-8, not empty.",
        },
        "purpose": {"type": "string", "enum": [FilePurpose.BATCH.value]},
    },
    "file",
    "purpose",
)

REQUEST_STATUS: Schema = _object(
    {
        "id": {"type": "string"},
        "object": {"const": "request"},
        "status": {"type": "string", "enum": ["cancelling", "finished"]},
    },
    "id",
    "object",
    "status",
)


def _list(item: str, **more: Schema) -> Schema:
    return _object(
        {"object": {"const": "list"}, "data": {"type": "array", "items": _ref(item)}, **more},
        "object",
        "data",
        *more,
    )


# --- operations --------------------------------------------------------------------------------


def _path(name: str, description: str) -> Schema:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string", "pattern": PATH_SEGMENT},
    }


_TIMEOUT_HEADER: Schema = {
    "name": "x-request-timeout",
    "in": "header",
    "description": "Seconds the client will wait; the sooner of it and the body's timeout wins.",
    "schema": {"type": "number", "exclusiveMinimum": 0},
}
_IDEMPOTENCY_KEY: Schema = {
    "name": "Idempotency-Key",
    "in": "header",
    "description": "Printable characters. A retry with the same key and body gets the first "
    "request's answer (for 24 hours).",
    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH},
}
_AUTH_ERRORS = (401, 403)


def _generation(chunk: str, body: str, result: str, summary: str) -> Schema:
    return {
        "post": {
            "summary": summary,
            "parameters": [_IDEMPOTENCY_KEY, _TIMEOUT_HEADER],
            "requestBody": {"required": True, "content": _json(_ref(body))},
            "responses": {
                "200": _ok(
                    "The completion, or its stream of chunks with stream=true.",
                    {
                        **_json(_ref(result)),
                        "text/event-stream": {"schema": _event(chunk)},
                    },
                    {
                        **VERSION_HEADER,
                        "x-switchyard-cache": {"$ref": "#/components/headers/Cache"},
                    },
                ),
                **_errors(400, *_AUTH_ERRORS, 404, 409, 413, 422, 429, 503),
            },
        }
    }


def _paths() -> dict[str, Schema]:
    return {
        "/v1/chat/completions": _generation(
            "ChatCompletionChunk", "ChatCompletionRequest", "ChatCompletion", "Chat completion"
        ),
        "/v1/completions": _generation(
            "TextCompletionChunk", "CompletionRequest", "TextCompletion", "Text completion"
        ),
        "/v1/embeddings": {
            "post": {
                "summary": "Embeddings",
                "parameters": [_TIMEOUT_HEADER],
                "requestBody": {"required": True, "content": _json(_ref("EmbeddingRequest"))},
                "responses": {
                    "200": _ok("The vectors.", _json(_ref("Embeddings")), VERSION_HEADER),
                    **_errors(400, *_AUTH_ERRORS, 404, 413, 429, 503),
                },
            }
        },
        "/v1/models": {
            "get": {
                "summary": "The models and aliases this platform serves",
                "responses": {
                    "200": _ok("Every model name.", _json(_list("Model"))),
                    **_errors(*_AUTH_ERRORS),
                },
            }
        },
        "/v1/models/{name}": {
            "get": {
                "summary": "A model and the version it routes to",
                "parameters": [
                    {
                        "name": "name",
                        "in": "path",
                        "required": True,
                        "description": "A model or alias name, or name@version.",
                        "schema": {"type": "string", "minLength": 1},
                    }
                ],
                "responses": {
                    "200": _ok("The model.", _json(_ref("Model"))),
                    **_errors(*_AUTH_ERRORS, 404),
                },
            }
        },
        "/v1/files": {
            "get": {
                "summary": "The tenant's files, newest first (at most 100)",
                "parameters": [
                    {"name": "purpose", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {
                    "200": _ok("The files.", _json(_list("File"))),
                    **_errors(*_AUTH_ERRORS),
                },
            },
            "post": {
                "summary": "Upload a batch input file",
                "requestBody": {
                    "required": True,
                    "content": {"multipart/form-data": {"schema": _ref("FileUpload")}},
                },
                "responses": {
                    "200": _ok("The stored file.", _json(_ref("File"))),
                    **_errors(400, *_AUTH_ERRORS, 413),
                },
            },
        },
        "/v1/files/{file_id}": {
            "get": {
                "summary": "A file",
                "parameters": [_path("file_id", "The file's id.")],
                "responses": {
                    "200": _ok("The file.", _json(_ref("File"))),
                    **_errors(*_AUTH_ERRORS, 404),
                },
            }
        },
        "/v1/files/{file_id}/content": {
            "get": {
                "summary": "A file's content",
                "parameters": [_path("file_id", "The file's id.")],
                "responses": {
                    "200": _ok(
                        "The JSONL content.",
                        {"application/jsonl": {"schema": {"type": "string"}}},
                        {"Content-Disposition": {"schema": {"type": "string"}}},
                    ),
                    **_errors(*_AUTH_ERRORS, 404),
                },
            }
        },
        "/v1/batches": {
            "get": {
                "summary": "The tenant's batches, newest first",
                "parameters": [
                    {
                        "name": "after",
                        "in": "query",
                        "description": "The last batch id of the previous page.",
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
                    },
                ],
                "responses": {
                    "200": _ok(
                        "A page of batches.",
                        _json(
                            _list(
                                "Batch",
                                first_id={"type": ["string", "null"]},
                                last_id={"type": ["string", "null"]},
                                has_more={"type": "boolean"},
                            )
                        ),
                    ),
                    **_errors(400, *_AUTH_ERRORS, 404),
                },
            },
            "post": {
                "summary": "Run a file of requests at batch priority",
                "requestBody": {"required": True, "content": _json(_ref("BatchRequest"))},
                "responses": {
                    "200": _ok("The batch, validating.", _json(_ref("Batch"))),
                    **_errors(400, *_AUTH_ERRORS, 404, 413),
                },
            },
        },
        "/v1/batches/{batch_id}": {
            "get": {
                "summary": "A batch",
                "parameters": [_path("batch_id", "The batch's id.")],
                "responses": {
                    "200": _ok("The batch.", _json(_ref("Batch"))),
                    **_errors(*_AUTH_ERRORS, 404),
                },
            }
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": {
                "summary": "Cancel a batch",
                "parameters": [_path("batch_id", "The batch's id.")],
                "responses": {
                    "200": _ok("The batch, cancelling.", _json(_ref("Batch"))),
                    **_errors(*_AUTH_ERRORS, 404, 409),
                },
            }
        },
        "/v1/requests/{request_id}/cancel": {
            "post": {
                "summary": "Cancel one of the tenant's requests",
                "parameters": [_path("request_id", "The x-request-id (or the response id).")],
                "responses": {
                    "200": _ok("Whether it was still running.", _json(_ref("RequestStatus"))),
                    **_errors(*_AUTH_ERRORS, 404, 503),
                },
            }
        },
        "/v1/requests/{request_id}/stream": {
            "get": {
                "summary": "Stream a recent request again, after the last event a client saw",
                "parameters": [
                    _path("request_id", "The x-request-id (or the response id)."),
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "description": "The id of the last event seen; without it (or empty), "
                        "from the start.",
                        "schema": {"type": "string", "pattern": "^\\s*(\\d{1,20}-\\d{1,20})?\\s*$"},
                    },
                    {
                        "name": "include_usage",
                        "in": "query",
                        "description": "Add the usage chunk (as stream_options.include_usage).",
                        "schema": {"type": "boolean"},
                    },
                ],
                "responses": {
                    "200": _ok(
                        "The rest of the stream.",
                        {
                            "text/event-stream": {
                                "schema": _event("ChatCompletionChunk", "TextCompletionChunk")
                            }
                        },
                    ),
                    **_errors(400, *_AUTH_ERRORS, 404, 503),
                },
            }
        },
        "/v1/openapi.json": {
            "get": {
                "summary": "This document",
                "security": [],
                "responses": {"200": _ok("The OpenAPI document.", _json({"type": "object"}))},
            }
        },
    }


def _responses() -> dict[str, Schema]:
    responses = {}
    for status, description in _ERROR_DESCRIPTIONS.items():
        headers = {**REQUEST_ID_HEADER, **(_RETRY_AFTER if status in (409, 429, 503) else {})}
        responses[str(status)] = {
            "description": description,
            "headers": headers,
            "content": _json(_ref("Error")),
        }
    return responses


def openapi_document() -> Schema:
    """Return the OpenAPI 3.1 document of the /v1 API."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Switchyard /v1 API",
            "version": "1",
            "description": "OpenAI-compatible inference, files and batches. Authenticate with "
            "an API key: `Authorization: Bearer sy-...`.",
        },
        "security": [{"bearerAuth": []}],
        "paths": _paths(),
        "components": {
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A tenant's API key (sy-...), issued in the console.",
                }
            },
            "headers": {
                "RequestId": {
                    "required": True,
                    "description": "The request's id: quote it to support, cancel with it.",
                    "schema": {"type": "string"},
                },
                "ModelVersion": {
                    "required": True,
                    "description": "The model version that answered.",
                    "schema": {"type": "string"},
                },
                "Cache": {
                    "description": "hit or miss, for tenants that use the response cache.",
                    "schema": {"type": "string", "enum": ["hit", "miss"]},
                },
                "RetryAfter": {
                    "description": "Seconds to wait before retrying.",
                    "schema": {"type": "integer"},
                },
            },
            "responses": _responses(),
            "schemas": {
                "Error": ERROR,
                "Usage": USAGE,
                "ChatCompletionRequest": CHAT_REQUEST,
                "CompletionRequest": COMPLETION_REQUEST,
                "ChatCompletion": CHAT_COMPLETION,
                "ChatCompletionChunk": CHAT_COMPLETION_CHUNK,
                "TextCompletion": TEXT_COMPLETION,
                "TextCompletionChunk": TEXT_COMPLETION_CHUNK,
                "EmbeddingRequest": EMBEDDING_REQUEST,
                "Embeddings": EMBEDDINGS,
                "Model": MODEL,
                "File": FILE,
                "FileUpload": FILE_UPLOAD,
                "Batch": BATCH,
                "BatchRequest": BATCH_REQUEST,
                "RequestStatus": REQUEST_STATUS,
            },
        },
    }


@functools.cache
def openapi_json() -> bytes:
    """Return the document encoded once: it only changes with the code."""
    return msgspec.json.encode(openapi_document())
