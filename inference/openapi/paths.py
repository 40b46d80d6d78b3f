"""The operations of the /v1 API: its paths, their parameters and the answers each can give.

A stream's event is described the way OpenAPI 3.1 tools read `text/event-stream`: the schema is
one event, and its `data` is JSON.
"""

from __future__ import annotations

from inference.idempotency import MAX_KEY_LENGTH
from inference.openapi.schema import ENTRY_ID, PATH_SEGMENT, Schema, json_content, obj, ref

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


def _event(*chunks: str) -> Schema:
    """One server-sent event of a stream: a chunk, an error, or the final `[DONE]`."""
    return obj(
        {
            "data": {
                "description": "A chunk or an Error as JSON, or `[DONE]` (the last event).",
                "anyOf": [
                    {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": {
                            "anyOf": [*(ref(chunk) for chunk in chunks), ref("Error")]
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


def _list(item: str, **more: Schema) -> Schema:
    return obj(
        {"object": {"const": "list"}, "data": {"type": "array", "items": ref(item)}, **more},
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
            "requestBody": {"required": True, "content": json_content(ref(body))},
            "responses": {
                "200": _ok(
                    "The completion, or its stream of chunks with stream=true.",
                    {
                        **json_content(ref(result)),
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


def paths() -> dict[str, Schema]:
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
                "requestBody": {"required": True, "content": json_content(ref("EmbeddingRequest"))},
                "responses": {
                    "200": _ok("The vectors.", json_content(ref("Embeddings")), VERSION_HEADER),
                    **_errors(400, *_AUTH_ERRORS, 404, 413, 429, 503),
                },
            }
        },
        "/v1/models": {
            "get": {
                "summary": "The models and aliases this platform serves",
                "responses": {
                    "200": _ok("Every model name.", json_content(_list("Model"))),
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
                    "200": _ok("The model.", json_content(ref("Model"))),
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
                    "200": _ok("The files.", json_content(_list("File"))),
                    **_errors(*_AUTH_ERRORS),
                },
            },
            "post": {
                "summary": "Upload a batch input file",
                "requestBody": {
                    "required": True,
                    "content": {"multipart/form-data": {"schema": ref("FileUpload")}},
                },
                "responses": {
                    "200": _ok("The stored file.", json_content(ref("File"))),
                    **_errors(400, *_AUTH_ERRORS, 413),
                },
            },
        },
        "/v1/files/{file_id}": {
            "get": {
                "summary": "A file",
                "parameters": [_path("file_id", "The file's id.")],
                "responses": {
                    "200": _ok("The file.", json_content(ref("File"))),
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
                        json_content(
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
                "requestBody": {"required": True, "content": json_content(ref("BatchRequest"))},
                "responses": {
                    "200": _ok("The batch, validating.", json_content(ref("Batch"))),
                    **_errors(400, *_AUTH_ERRORS, 404, 413),
                },
            },
        },
        "/v1/batches/{batch_id}": {
            "get": {
                "summary": "A batch",
                "parameters": [_path("batch_id", "The batch's id.")],
                "responses": {
                    "200": _ok("The batch.", json_content(ref("Batch"))),
                    **_errors(*_AUTH_ERRORS, 404),
                },
            }
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": {
                "summary": "Cancel a batch",
                "parameters": [_path("batch_id", "The batch's id.")],
                "responses": {
                    "200": _ok("The batch, cancelling.", json_content(ref("Batch"))),
                    **_errors(*_AUTH_ERRORS, 404, 409),
                },
            }
        },
        "/v1/requests/{request_id}/cancel": {
            "post": {
                "summary": "Cancel one of the tenant's requests",
                "parameters": [_path("request_id", "The x-request-id (or the response id).")],
                "responses": {
                    "200": _ok("Whether it was still running.", json_content(ref("RequestStatus"))),
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
                "responses": {
                    "200": _ok("The OpenAPI document.", json_content({"type": "object"}))
                },
            }
        },
    }


def responses() -> dict[str, Schema]:
    responses = {}
    for status, description in _ERROR_DESCRIPTIONS.items():
        headers = {**REQUEST_ID_HEADER, **(_RETRY_AFTER if status in (409, 429, 503) else {})}
        responses[str(status)] = {
            "description": description,
            "headers": headers,
            "content": json_content(ref("Error")),
        }
    return responses
