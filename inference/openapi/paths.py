"""The operations of the /v1 API: its paths, their parameters and the answers each can give.

The apps that serve /v1 operations of their own (batches: files and batches) describe them
with the helpers here (ok, errors, list_of, path_parameter) and register them as a part
(inference.openapi.parts).

A stream's event is described the way OpenAPI 3.1 tools read `text/event-stream`: the schema is
one event, and its `data` is JSON.
"""

from __future__ import annotations

from inference.openapi.schema import ENTRY_ID, PATH_SEGMENT, Schema, json_content, obj, ref
from inference.pipeline.idempotency import MAX_KEY_LENGTH

REQUEST_ID_HEADER = {"x-request-id": {"$ref": "#/components/headers/RequestId"}}
VERSION_HEADER = {"x-roundhouse-model-version": {"$ref": "#/components/headers/ModelVersion"}}
_METADATA_HEADER = {
    "metadata": {
        "description": "A bytes answer's JSON: id, created, model, usage, and per vector its "
        "index, embed_dtype, endianness, start and end in the body, and shape.",
        "schema": {"type": "string"},
    }
}


def ok(
    description: str, content: dict[str, Schema], headers: dict[str, Schema] | None = None
) -> Schema:
    return {
        "description": description,
        "headers": {**REQUEST_ID_HEADER, **(headers or {})},
        "content": content,
    }


def errors(*statuses: int) -> dict[str, Schema]:
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


def list_of(item: str, **more: Schema) -> Schema:
    return obj(
        {"object": {"const": "list"}, "data": {"type": "array", "items": ref(item)}, **more},
        "object",
        "data",
        *more,
    )


# --- operations --------------------------------------------------------------------------------


def path_parameter(name: str, description: str) -> Schema:
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
AUTH_ERRORS = (401, 403)


def _generation(chunk: str, body: str, result: str, summary: str) -> Schema:
    return {
        "post": {
            "summary": summary,
            "parameters": [_IDEMPOTENCY_KEY, _TIMEOUT_HEADER],
            "requestBody": {"required": True, "content": json_content(ref(body))},
            "responses": {
                "200": ok(
                    "The completion, or its stream of chunks with stream=true.",
                    {
                        **json_content(ref(result)),
                        "text/event-stream": {"schema": _event(chunk)},
                    },
                    {
                        **VERSION_HEADER,
                        "x-roundhouse-cache": {"$ref": "#/components/headers/Cache"},
                        "x-roundhouse-fallback-from": {"$ref": "#/components/headers/FallbackFrom"},
                        "x-roundhouse-fallback-reason": {
                            "$ref": "#/components/headers/FallbackReason"
                        },
                    },
                ),
                **errors(400, *AUTH_ERRORS, 404, 409, 413, 422, 429, 503),
            },
        }
    }


def model_paths() -> dict[str, Schema]:
    """The operations on models: generation, embeddings and the model list."""
    return {
        "/v1/chat/completions": _generation(
            "ChatCompletionChunk", "ChatCompletionRequest", "ChatCompletion", "Chat completion"
        ),
        "/v1/completions": _generation(
            "TextCompletionChunk", "CompletionRequest", "TextCompletion", "Text completion"
        ),
        "/v1/chat/completions/batch": {
            "post": {
                "summary": "Chat completions of several conversations (vLLM's batch chat)",
                "parameters": [_IDEMPOTENCY_KEY, _TIMEOUT_HEADER],
                "requestBody": {
                    "required": True,
                    "content": json_content(ref("BatchChatCompletionRequest")),
                },
                "responses": {
                    "200": ok(
                        "One chat completion: choice i answers conversation i; the usage "
                        "adds up every conversation's.",
                        json_content(ref("ChatCompletion")),
                        VERSION_HEADER,
                    ),
                    **errors(400, *AUTH_ERRORS, 404, 409, 413, 422, 429, 503),
                },
            }
        },
        "/v1/embeddings": {
            "post": {
                "summary": "Embeddings",
                "parameters": [_TIMEOUT_HEADER],
                "requestBody": {"required": True, "content": json_content(ref("EmbeddingRequest"))},
                "responses": {
                    "200": ok(
                        "The vectors; with `encoding_format` bytes or bytes_only, vLLM's binary "
                        "answer: the vectors' bytes end to end (and, but for bytes_only, where "
                        "each lies in the `metadata` header).",
                        {
                            **json_content(ref("Embeddings")),
                            "application/octet-stream": {
                                "schema": {"type": "string", "format": "binary"}
                            },
                        },
                        {**VERSION_HEADER, **_METADATA_HEADER},
                    ),
                    **errors(400, *AUTH_ERRORS, 404, 413, 429, 503),
                },
            }
        },
        "/v1/models": {
            "get": {
                "summary": "The models and aliases the key may call",
                "responses": {
                    "200": ok(
                        "Every name the key may call now, and no other.",
                        json_content(list_of("Model")),
                    ),
                    **errors(*AUTH_ERRORS),
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
                    "200": ok("The model.", json_content(ref("Model"))),
                    **errors(*AUTH_ERRORS, 404),
                },
            }
        },
    }


def request_paths() -> dict[str, Schema]:
    """The operations on one request (cancel it, stream it again) and on this document."""
    return {
        "/v1/requests/{request_id}/cancel": {
            "post": {
                "summary": "Cancel one of the tenant's requests",
                "parameters": [
                    path_parameter("request_id", "The x-request-id (or the response id).")
                ],
                "responses": {
                    "200": ok("Whether it was still running.", json_content(ref("RequestStatus"))),
                    **errors(*AUTH_ERRORS, 404, 503),
                },
            }
        },
        "/v1/requests/{request_id}/stream": {
            "get": {
                "summary": "Stream a recent request again, after the last event a client saw",
                "parameters": [
                    path_parameter("request_id", "The x-request-id (or the response id)."),
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
                    "200": ok(
                        "The rest of the stream.",
                        {
                            "text/event-stream": {
                                "schema": _event("ChatCompletionChunk", "TextCompletionChunk")
                            }
                        },
                    ),
                    **errors(400, *AUTH_ERRORS, 404, 503),
                },
            }
        },
        "/v1/openapi.json": {
            "get": {
                "summary": "This document",
                "security": [],
                "responses": {"200": ok("The OpenAPI document.", json_content({"type": "object"}))},
            }
        },
    }


def operation_paths() -> dict[str, Schema]:
    """vLLM's operational endpoints, at vLLM's paths (outside /v1: inference.operations.views)."""
    empty = {"headers": REQUEST_ID_HEADER}  # vLLM's /health answers with no body at all
    return {
        "/health": {
            "get": {
                "summary": "Whether this frontend can serve requests (vLLM's health check)",
                "security": [],
                "responses": {
                    "200": {"description": "It can; the body is empty.", **empty},
                    "503": {"description": "It cannot now; the body is empty.", **empty},
                },
            }
        },
        "/ping": {
            method: {
                "summary": "The health check again, at vLLM's SageMaker-style path",
                "security": [],
                "responses": {
                    "200": {"description": "It can serve; the body is empty.", **empty},
                    "503": {"description": "It cannot now; the body is empty.", **empty},
                },
            }
            for method in ("get", "post")
        },
        "/version": {
            "get": {
                "summary": "The platform's version (vLLM's version endpoint)",
                "security": [],
                "responses": {"200": ok("The version.", json_content(ref("Version")))},
            }
        },
        "/tokenize": {
            "post": {
                "summary": "A prompt's or a conversation's token ids, as the model routes",
                "requestBody": {"required": True, "content": json_content(ref("TokenizeRequest"))},
                "responses": {
                    "200": ok("The tokens.", json_content(ref("Tokens")), VERSION_HEADER),
                    **errors(400, *AUTH_ERRORS, 404, 413, 429, 503),
                },
            }
        },
        "/detokenize": {
            "post": {
                "summary": "The text of token ids, as the model routes",
                "requestBody": {
                    "required": True,
                    "content": json_content(ref("DetokenizeRequest")),
                },
                "responses": {
                    "200": ok("The text.", json_content(ref("Detokenized")), VERSION_HEADER),
                    **errors(400, *AUTH_ERRORS, 404, 413, 429, 503),
                },
            }
        },
    }


def responses() -> dict[str, Schema]:
    responses = {}
    for status, description in _ERROR_DESCRIPTIONS.items():
        headers = {
            **REQUEST_ID_HEADER,
            "x-should-retry": {"$ref": "#/components/headers/ShouldRetry"},
            **(_RETRY_AFTER if status in (409, 429, 503) else {}),
        }
        responses[str(status)] = {
            "description": description,
            "headers": headers,
            "content": json_content(ref("Error")),
        }
    return responses
