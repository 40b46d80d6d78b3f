"""The OpenAPI document of the /v1 API, served at /v1/openapi.json.

Put together from the operations (inference.openapi.paths), the request bodies
(inference.openapi.bodies), the objects answered (inference.openapi.objects) and the parts
the apps above the API register (inference.openapi.parts: batches' files and batches).
tests/security/test_schemathesis.py checks every answer of a running platform against it.
"""

from __future__ import annotations

import functools

import msgspec

from inference.openapi import bodies, objects
from inference.openapi.conversations import SCHEMAS as CONVERSATIONS_SCHEMAS
from inference.openapi.conversations import conversations_paths
from inference.openapi.messages import SCHEMAS as MESSAGES_SCHEMAS
from inference.openapi.messages import messages_paths
from inference.openapi.parts import parts
from inference.openapi.paths import model_paths, operation_paths, request_paths, responses
from inference.openapi.responses import SCHEMAS as RESPONSES_SCHEMAS
from inference.openapi.responses import responses_paths
from inference.openapi.schema import Schema
from inference.pipeline.admission import CIRCUIT_OPEN, FALLBACK_REASONS


def _merged(*sections: dict[str, Schema]) -> dict[str, Schema]:
    """Join sections of paths or schemas in order; a name given twice is a mistake."""
    merged: dict[str, Schema] = {}
    for section in sections:
        twice = merged.keys() & section.keys()
        if twice:
            raise ValueError(f"the OpenAPI document names {sorted(twice)} twice")
        merged.update(section)
    return merged


def openapi_document() -> Schema:
    """Return the OpenAPI 3.1 document of the /v1 API."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Roundhouse /v1 API",
            "version": "1",
            "description": "OpenAI-compatible inference, files and batches, and vLLM's "
            "operational endpoints at its paths (/health, /version, /tokenize, /detokenize). "
            "Authenticate with an API key: `Authorization: Bearer rh-...` (or `x-api-key: "
            "rh-...`, as Anthropic's SDKs send it).",
        },
        "security": [{"bearerAuth": []}],
        "paths": _merged(
            model_paths(),
            responses_paths(),
            conversations_paths(),
            messages_paths(),
            *(part.paths() for part in parts()),
            request_paths(),
            operation_paths(),
        ),
        "components": {
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A tenant's API key (rh-...), issued in the console.",
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
                "FallbackFrom": {
                    "description": "The alias the request named, when that alias's model "
                    "could not take it and its fallback alias answered.",
                    "schema": {"type": "string"},
                },
                "FallbackReason": {
                    "description": "Why the named alias could not take the request.",
                    "schema": {
                        "type": "string",
                        "enum": sorted(FALLBACK_REASONS | {CIRCUIT_OPEN}),
                    },
                },
                "ShouldRetry": {
                    "description": "Whether a retry can succeed: false for a refusal no retry "
                    "mends (bad input, a deadline the client set that passed), true where "
                    "one can; OpenAI's SDKs follow it.",
                    "schema": {"type": "string", "enum": ["true", "false"]},
                },
                "RetryAfter": {
                    "description": "Seconds to wait before retrying.",
                    "schema": {"type": "integer"},
                },
            },
            "responses": responses(),
            "schemas": _merged(
                {
                    "Error": objects.ERROR,
                    "Usage": objects.USAGE,
                    "ChatCompletionRequest": bodies.CHAT_REQUEST,
                    "CompletionRequest": bodies.COMPLETION_REQUEST,
                    "BatchChatCompletionRequest": bodies.CHAT_BATCH_REQUEST,
                    "ChatCompletion": objects.CHAT_COMPLETION,
                    "ChatCompletionChunk": objects.CHAT_COMPLETION_CHUNK,
                    "TextCompletion": objects.TEXT_COMPLETION,
                    "TextCompletionChunk": objects.TEXT_COMPLETION_CHUNK,
                    "EmbeddingRequest": bodies.EMBEDDING_REQUEST,
                    "Embeddings": objects.EMBEDDINGS,
                    "Model": objects.MODEL,
                },
                RESPONSES_SCHEMAS,
                CONVERSATIONS_SCHEMAS,
                MESSAGES_SCHEMAS,
                *(part.schemas for part in parts()),
                {
                    "RequestStatus": objects.REQUEST_STATUS,
                    "TokenizeRequest": bodies.TOKENIZE_REQUEST,
                    "Tokens": objects.TOKENIZE_RESPONSE,
                    "DetokenizeRequest": bodies.DETOKENIZE_REQUEST,
                    "Detokenized": objects.DETOKENIZE_RESPONSE,
                    "Version": objects.VERSION,
                },
            ),
        },
    }


@functools.cache
def openapi_json() -> bytes:
    """Return the document encoded once: it only changes with the code."""
    return msgspec.json.encode(openapi_document())
